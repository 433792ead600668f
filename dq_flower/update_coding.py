"""Coding a client's model update: flat or per tensor, with error feedback where it applies."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context

from dq_flower.client_state import encode_keeping_state
from dq_flower.codec_choice import CodecChoice
from dq_flower.codecs import ErrorFeedback
from dq_flower.wire.gradient import UPDATE_KEY, update_keys, uses_error_feedback

__all__ = ["encode_update", "segments"]

def segments(update: np.ndarray, shapes: list[tuple[int, ...]], per_tensor: bool
             ) -> list[np.ndarray]:
    """The flat update as one segment, or cut into the parameter tensors' shapes."""
    if not per_tensor:
        return [update]
    out, offset = [], 0
    for shape in shapes:
        k = math.prod(shape)
        out.append(update[offset:offset + k].reshape(shape))
        offset += k
    if offset != update.size:
        raise ValueError(f"update has {update.size} values, the tensors {offset}")
    return out


def encode_update(update: np.ndarray, shapes: list[tuple[int, ...]], cfg: CodecChoice,
                  context: Context, rng: np.random.Generator, prefix: str,
                  key: str = UPDATE_KEY) -> tuple[dict[str, ArrayRecord], int]:
    """The update's reply records (per tensor or flat, named by ``key``) and payload bits.

    Error feedback applies where it does; each segment's residual or codec state is kept
    in ``context.state`` under ``<prefix>ef[-<i>]`` or ``<prefix>codec[-<i>]``.
    """
    payloads = []
    for i, part in enumerate(segments(update, shapes, cfg.segmented)):
        suffix = f"-{i}" if cfg.segmented else ""
        codec = cfg.make_codec()
        coder: Any
        state_key: str | None
        if uses_error_feedback(cfg, codec):
            coder, state_key = ErrorFeedback(codec), f"{prefix}ef{suffix}"
        else:
            coder = codec
            stateful = callable(getattr(codec, "state_dict", None))
            state_key = f"{prefix}codec{suffix}" if stateful else None
        if codec.name == "uniform":  # the data quantizer codes rows: the update is one row
            part = part.reshape(1, -1)
        payloads.append(encode_keeping_state(coder, part, rng, context, state_key))
    records = zip(update_keys(cfg, len(shapes), key), payloads, strict=True)
    return ({name: p.to_record() for name, p in records}, int(sum(p.nbits for p in payloads)))
