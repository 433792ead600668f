"""Codecs: the data quantizer and the gradient codecs, with real bit packing.

Pure numpy; nothing here imports Flower except :meth:`Payload.to_record`/``from_record``.
"""

from . import floats  # noqa: F401  (registers codecs)
from .base import PAYLOAD_VERSION, Codec, Payload, PayloadError
from .registry import make, names, register

__all__ = [
    "PAYLOAD_VERSION",
    "Codec",
    "Payload",
    "PayloadError",
    "make",
    "names",
    "register",
]
