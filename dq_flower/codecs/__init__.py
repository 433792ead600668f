"""Codecs: the data quantizer and the gradient codecs, with real bit packing.

Pure numpy; nothing here imports Flower except :meth:`Payload.to_record`/``from_record``.
"""

# importing a codec module registers its codecs
from . import bingrad, lossless, model, qsgd, sign, topk, uniform  # noqa: F401
from .base import Codec, ErrorFeedback
from .context_coded import CONTEXT
from .lossless import EntropyCoded
from .payload import PAYLOAD_VERSION, Payload, PayloadError
from .registry import coder_for, make, names, payload_coder, register

__all__ = ["CONTEXT", "PAYLOAD_VERSION", "Codec", "EntropyCoded", "ErrorFeedback", "Payload",
           "PayloadError", "coder_for", "make", "names", "payload_coder", "register"]
