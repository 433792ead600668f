"""Codecs: the data quantizer and the gradient codecs, with real bit packing.

Pure numpy; nothing here imports Flower except :meth:`Payload.to_record`/``from_record``.
"""

from . import (  # noqa: F401  (importing a codec module registers its codecs)
    bingrad,
    floats,
    lossless,
    lowbit,
    orq,
    powersgd,
    qsgd,
    sign,
    terngrad,
    topk,
    uniform,
)
from .base import PAYLOAD_VERSION, Codec, Payload, PayloadError
from .context_coded import CONTEXT
from .error_feedback import ErrorFeedback
from .lossless import EntropyCoded
from .registry import coder_for, make, names, payload_coder, register

__all__ = ["CONTEXT", "PAYLOAD_VERSION", "Codec", "EntropyCoded", "ErrorFeedback", "Payload",
           "PayloadError", "coder_for", "make", "names", "payload_coder", "register"]
