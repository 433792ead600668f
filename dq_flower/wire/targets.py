"""How a node reads its targets before they travel: binary labels, float class indices."""

from __future__ import annotations

import numpy as np

__all__ = ["binary_targets", "float_class_labels", "FLOAT_LABELS_KEY"]

#: Round-config key: the classes of a model whose nodes' float targets are class indices.
FLOAT_LABELS_KEY = "float-labels-classes"


def binary_targets(y: np.ndarray) -> bool:
    """Whether float targets are all 0 or 1: labels for binary cross-entropy on logits."""
    return y.size > 0 and y.dtype.kind == "f" and bool(np.isin(y, (0, 1)).all())


def float_class_labels(y: np.ndarray, classes: int) -> np.ndarray:
    """``y`` as int64 class labels where it holds float class indices below ``classes``.

    Labels read as floats (``np.loadtxt`` reads a CSV's label column as 0., 1., 2.) for a
    model of ``classes`` >= 2 outputs that the user's loss reads as indices; else ``y``.
    """
    flat = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if (classes >= 2 and flat.ndim == 1 and flat.size and np.issubdtype(flat.dtype, np.floating)
            and flat.min() >= 0 and flat.max() < classes and np.array_equal(flat, np.rint(flat))):
        return flat.astype(np.int64)
    return y
