"""The model as it travels to clients: one raw float32 vector (no ``np.save`` headers).

With an entropy coder (``entropy="zlib"``, ...) the vector is entropy-coded where that
shrinks it (see :mod:`dq_flower.codecs.lossless`); the receiver bounds the declared size by
its own model's before anything is decompressed. Only the functions that take a model
import PyTorch (:data:`MODEL_KEY` and decoding do not).
"""

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

#: Record name of the model in a train message.
MODEL_KEY = "model"
#: Codecs a model record may be encoded with.
MODEL_CODECS = ("identity", "fp16", "int8", "int4")


def model_record(model: torch.nn.Module, entropy: str = "none",
                 codec: str = "identity") -> ArrayRecord:
    """The model's parameters as one vector: float32 (``identity``), ``fp16``, ``int8`` or ``int4``.

    ``entropy`` (``none``, ``zlib``, ``lzma``, ``zstd``) entropy-codes the vector where
    that shrinks it.
    """
    from dq_flower.model_ops import get_flat  # PyTorch only where a model is at hand

    if codec not in MODEL_CODECS:
        raise ValueError(f"model codec must be one of {MODEL_CODECS}, got {codec!r}")
    return make(codec, entropy=entropy).encode(get_flat(model)).to_record()


def decode_model_payload(payload: Payload, dim: int, entropy: str | None = None):
    """Decode a model payload of ``dim`` parameters (any of :data:`MODEL_CODECS`) to float32.

    Parameters
    ----------
    payload : Payload
        The received payload.
    dim : int
        The receiver's own number of parameters; a payload declaring another size is refused
        before anything is decoded or decompressed.
    entropy : str, optional
        The coder the receiver is configured with; ``None`` accepts any coder available
        here (the size bound holds whatever the coder).

    Raises
    ------
    PayloadError
        Another codec, another size, an unknown coder, or a malformed payload.
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
