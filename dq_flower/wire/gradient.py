"""Wire format of the compressed-gradient rounds, shared by server and client.

A reply carries the update under ``update`` (or ``update-<i>`` per tensor) and its metrics
under ``metrics``. Under majority vote with ``downlink="sign"`` the server sends the votes a
client lacks (``vote-<version>``), applied by both ends with :func:`sign_step`.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.lossless import raw_nbits

__all__ = ["GradientLayout", "UPDATE_KEY", "METRICS_KEY", "VOTE_PREFIX", "sign_step",
           "trainable_mask",
           "vote_from_payload", "model_crc", "uses_error_feedback", "update_keys",
           "decode_update", "epoch_steps"]

UPDATE_KEY = "update"
METRICS_KEY = "metrics"
#: Prefix of the vote records of ``downlink="sign"``: ``vote-<model version>``.
VOTE_PREFIX = "vote-"


class GradientLayout(Protocol):
    """What both ends read of a :class:`dq_flower.GradientConfig` to lay out an update."""

    @property
    def error_feedback(self) -> str:
        """``auto``, ``on`` or ``off``."""

    @property
    def majority(self) -> bool:
        """Whether the server aggregates by majority vote."""

    @property
    def segmented(self) -> bool:
        """Whether the update is coded per parameter tensor."""


def sign_step(w: np.ndarray, vote: np.ndarray, lr: float, weight_decay: float,
              trainable: np.ndarray | None = None) -> np.ndarray:
    """The majority-vote step ``w - lr * (vote + weight_decay * w)`` in float32 (both ends).

    ``trainable`` (:func:`trainable_mask`): coordinates of parameters the user froze keep
    their values (a vote counts a zero as +1).
    """
    w = np.asarray(w, dtype=np.float32)
    d = np.asarray(vote, dtype=np.float32) + np.float32(weight_decay) * w
    if trainable is not None and not trainable.all():
        d = np.where(trainable, d, np.float32(0))
    return (w - np.float32(lr) * d).astype(np.float32)


def trainable_mask(model: Any) -> np.ndarray:
    """Which coordinates of the flat parameter vector the model trains (``requires_grad``)."""
    return np.concatenate([np.full(p.numel(), bool(p.requires_grad))
                           for p in model.parameters()] or [np.zeros(0, dtype=bool)])


def vote_from_payload(payload: Payload) -> np.ndarray:
    """The +-1 float32 vote carried by a ``sign`` payload (zeros count as +1)."""
    v = make(payload.codec).decode(payload).reshape(-1)
    return np.where(v >= 0, np.float32(1), np.float32(-1)).astype(np.float32)


def model_crc(w: np.ndarray) -> int:
    """CRC-32 of a float32 parameter vector's bytes."""
    return int(zlib.crc32(np.ascontiguousarray(w, dtype=np.float32).tobytes()))


def uses_error_feedback(cfg: GradientLayout, codec) -> bool:
    """Whether clients wrap ``codec`` in error feedback under ``cfg``."""
    if cfg.error_feedback == "auto":
        return bool(codec.biased) and not cfg.majority
    return cfg.error_feedback == "on"


def update_keys(cfg: GradientLayout, num_tensors: int, key: str = UPDATE_KEY) -> list[str]:
    """Reply record names: ``key``, or ``<key>-<i>`` per tensor when coded per tensor."""
    if cfg.segmented:
        return [f"{key}-{i}" for i in range(num_tensors)]
    return [key]


def decode_update(records: Mapping[str, Any], keys: Sequence[str], sizes: Sequence[int],
                  codec: Any) -> tuple[np.ndarray, int, int]:
    """Decode ``records[keys[i]]`` (``sizes[i]`` values each): ``(vector, bits, raw bits)``.

    The bits are as sent and before lossless coding. Raises :class:`PayloadError` for a
    missing record, another codec or size (checked before decoding), or non-finite values.
    """
    parts, nbits, raw = [], 0, 0
    for key, size in zip(keys, sizes, strict=True):
        if key not in records:
            raise PayloadError(f"reply misses its {key!r} record")
        payload = Payload.from_record(records[key])
        if payload.codec != codec.name:
            raise PayloadError(f"{key} encoded by {payload.codec!r}, expected {codec.name!r}")
        if not payload.shape or math.prod(payload.shape) != size:
            raise PayloadError(f"{key} declares shape {payload.shape}, expected {size} values")
        part = np.asarray(codec.decode(payload), dtype=np.float32).reshape(-1)
        if part.size != size:
            raise PayloadError(f"{key} decodes to {part.size} values, expected {size}")
        parts.append(part)
        nbits += int(payload.nbits)
        raw += raw_nbits(payload)  # checked by the decoder above
    vec = np.concatenate(parts) if parts else np.zeros(0, dtype=np.float32)
    if not np.isfinite(vec).all():
        raise PayloadError("update decodes to non-finite values")
    return vec, nbits, raw


def epoch_steps(examples: int, batch_size: int, epochs: int) -> int:
    """Local steps of ``epochs`` epochs over ``examples / epochs`` rows (``ceil`` per epoch)."""
    rows = int(examples) // int(epochs)
    return int(epochs) * -(-rows // int(batch_size))
