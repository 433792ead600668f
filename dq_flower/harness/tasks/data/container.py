"""The container of a named or user data set: :class:`Dataset`, flat rows plus targets."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["Dataset"]


@dataclass(frozen=True, eq=False)
class Dataset:
    """A classification or regression data set held as flat rows (compared by identity).

    Attributes
    ----------
    train_x, test_x : np.ndarray
        float32, shape ``(n, d)``. Named data sets are normalised by their definition
        (values in ``[0, 1]``); user data is as given.
    train_y, test_y : np.ndarray
        Class labels: int64 of shape ``(n,)`` in ``[0, num_classes)``. Regression
        targets (``num_classes == 0``): float32 of shape ``(n,)`` or ``(n, k)``.
    num_classes : int
        Number of classes, ``>= 1`` for class labels; ``0`` for float regression targets.
    input_shape : tuple of int
        Shape of one sample before flattening, e.g. ``(1, 28, 28)`` or ``(d,)``.
    name : str
        Human-readable name of the source.
    """

    train_x: np.ndarray
    train_y: np.ndarray
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    input_shape: tuple[int, ...]
    name: str

    def __post_init__(self) -> None:
        d = int(np.prod(self.input_shape))
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be >= 1 (class labels) or 0 (float "
                             f"regression targets), got {self.num_classes}")
        regression = self.num_classes == 0
        for part, x, y in (("train", self.train_x, self.train_y),
                           ("test", self.test_x, self.test_y)):
            if x.ndim != 2 or x.shape[1] != d:
                raise ValueError(f"{part}_x must have shape (n, {d}), got {x.shape}")
            n = x.shape[0]
            if regression:
                if y.dtype.kind != "f":
                    raise ValueError(f"num_classes=0 means float regression targets, but "
                                     f"{part}_y has dtype {y.dtype}")
                if y.ndim not in (1, 2) or y.shape[0] != n:
                    raise ValueError(f"{part}_y must have shape ({n},) or ({n}, k), got "
                                     f"{y.shape}")
            else:
                if y.dtype.kind not in "iu":
                    raise ValueError(f"num_classes={self.num_classes} needs integer class "
                                     f"labels, but {part}_y has dtype {y.dtype} (use "
                                     "num_classes=0 for float regression targets)")
                if y.shape != (n,):
                    raise ValueError(f"{part}_y must have shape ({n},), got {y.shape}")
        if self.train_y.shape[1:] != self.test_y.shape[1:]:
            raise ValueError(f"train_y and test_y disagree on the target shape: "
                             f"{self.train_y.shape[1:]} vs {self.test_y.shape[1:]}")

    @property
    def dim(self) -> int:
        """Data dimension d (features per flat row)."""
        return int(self.train_x.shape[1])

    @property
    def num_train(self) -> int:
        """Number of training samples."""
        return int(self.train_x.shape[0])

    @property
    def is_regression(self) -> bool:
        """Whether the targets are float regression targets (``num_classes == 0``)."""
        return self.num_classes == 0
