"""The clients' data spec (sample shape, target kind and width), sent in each reply."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np
from flwr.app import ConfigRecord

from dq_flower.codecs import PayloadError

__all__ = ["SPEC_KEY", "DataSpec", "spec_of", "spec_record", "spec_from_record", "MAX_DIM"]

SPEC_KEY = "data-spec"
#: Largest sample dimension accepted from a reply (2**24 coordinates, 64 MiB of float32).
MAX_DIM = 1 << 24
TARGET_KINDS = ("class", "float")


@dataclass(frozen=True)
class DataSpec:
    """Sample shape and target kind of a federation's data.

    Attributes
    ----------
    sample_shape : tuple of int
        Shape of one sample, e.g. ``(1, 28, 28)`` or ``(30,)``.
    target : str
        ``class`` (integer labels) or ``float`` (regression targets).
    target_dim : int
        Values per target: 1 for class labels and scalar targets.
    """

    sample_shape: tuple[int, ...]
    target: str = "class"
    target_dim: int = 1

    def __post_init__(self) -> None:
        if not self.sample_shape or any(int(s) < 1 for s in self.sample_shape):
            raise ValueError(f"sample_shape must be positive sizes, got {self.sample_shape}")
        if self.target not in TARGET_KINDS:
            raise ValueError(f"target must be one of {TARGET_KINDS}, got {self.target!r}")
        if self.target_dim < 1:
            raise ValueError(f"target_dim must be >= 1, got {self.target_dim}")

    @property
    def dim(self) -> int:
        """Coordinates per sample."""
        return int(math.prod(self.sample_shape))

    @property
    def channels(self) -> int:
        """Channels of an image sample ``(C, H, W)``; 0 for other layouts."""
        return int(self.sample_shape[0]) if len(self.sample_shape) == 3 else 0


def spec_of(x: np.ndarray, y: np.ndarray) -> DataSpec:
    """The spec of a client's arrays ``(x, y)`` (see :mod:`dq_flower.data_input`)."""
    shape = tuple(int(s) for s in x.shape[1:]) or (1,)
    if np.issubdtype(y.dtype, np.integer):
        return DataSpec(shape, "class", 1)
    return DataSpec(shape, "float", int(y.shape[1]) if y.ndim == 2 else 1)


def spec_record(spec: DataSpec) -> ConfigRecord:
    """The spec as it travels in a reply."""
    return ConfigRecord({"sample-shape": [int(s) for s in spec.sample_shape],
                         "target": spec.target, "target-dim": int(spec.target_dim)})


def spec_from_record(record: ConfigRecord | None) -> DataSpec:
    """Parse a reply's spec; raise :class:`PayloadError` with the reason when malformed."""
    if record is None:
        raise PayloadError(f"reply misses its {SPEC_KEY!r} record")
    shape, target, tdim = (record.get(k) for k in ("sample-shape", "target", "target-dim"))
    if (not isinstance(shape, list) or not 1 <= len(shape) <= 8
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 1
                       for s in shape)):
        raise PayloadError(f"data-spec 'sample-shape'={shape!r} is not a list of sizes")
    shape = cast(list[int], shape)  # checked just above
    if math.prod(shape) > MAX_DIM:
        raise PayloadError(f"data-spec sample of {math.prod(shape)} values exceeds {MAX_DIM}")
    if target not in TARGET_KINDS:
        raise PayloadError(f"data-spec 'target'={target!r} is not one of {TARGET_KINDS}")
    if not isinstance(tdim, int) or isinstance(tdim, bool) or not 1 <= tdim <= 1 << 16:
        raise PayloadError(f"data-spec 'target-dim'={tdim!r} is not a positive int")
    return DataSpec(tuple(shape), target, tdim)
