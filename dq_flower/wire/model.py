"""The model as it travels to clients: one vector, entropy-coded where that shrinks it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from flwr.app import ArrayRecord

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.context_coded import CONTEXT
from dq_flower.codecs.entropy import available
from dq_flower.codecs.lossless import coder_of

if TYPE_CHECKING:
    import torch

__all__ = ["MODEL_KEY", "model_record", "load_model_record", "decode_model_payload"]

MODEL_KEY = "model"
MODEL_CODECS = ("identity", "fp16", "int8", "int4")


def model_record(model: torch.nn.Module, entropy: str = "none",
                 codec: str = "identity") -> ArrayRecord:
    """The parameters as one ``codec`` vector, ``entropy``-coded where that shrinks it."""
    from dq_flower.model_ops import get_flat  # PyTorch only where a model is at hand

    if codec not in MODEL_CODECS:
        raise ValueError(f"model codec must be one of {MODEL_CODECS}, got {codec!r}")
    return make(codec, entropy=entropy).encode(get_flat(model)).to_record()


def decode_model_payload(payload: Payload, dim: int, entropy: str | None = None):
    """Decode a model payload of ``dim`` parameters to float32.

    ``dim`` is checked before decompressing; ``entropy=None`` accepts any available coder.
    Raises :class:`PayloadError` for another codec, size or coder, or a malformed payload.
    """
    if payload.codec not in MODEL_CODECS:
        raise PayloadError(f"model sent with unsupported codec {payload.codec!r}")
    payload.expect_elements(dim)
    coder = coder_of(payload) if entropy is None else entropy
    if coder not in (*available(), CONTEXT):  # context: zlib-coded (no codes to model)
        raise PayloadError(f"model payload coded with unknown coder {coder!r}")
    return make(payload.codec, entropy=coder).decode(payload).reshape(-1)


def load_model_record(model: torch.nn.Module, record: ArrayRecord,
                      entropy: str | None = None) -> None:
    """Load parameters sent by :func:`model_record`; raises ``ValueError`` if inconsistent."""
    from dq_flower.model_ops import num_params, set_flat  # PyTorch, as above

    vec = decode_model_payload(Payload.from_record(record), num_params(model), entropy)
    set_flat(model, vec)
