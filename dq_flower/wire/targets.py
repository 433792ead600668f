"""How a node reads its targets before they travel: binary labels, targets the model reads.

A node's targets may be typed other than as the model's loss reads them: class labels
read as floats (``np.loadtxt`` reads a CSV's label column as 0., 1., 2.) for a model with
an output per class, or integer targets (counts, 0/1 labels as pandas gives them) for a
model with one output, read as floats by the user's loss. :func:`model_targets` retypes
them by the model's outputs; a DQ node is told those (:data:`MODEL_OUTPUTS_KEY`) once the
server's model check has refused such targets.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["binary_targets", "ids_below", "label_base", "model_targets", "retyped", "retypes_to",
           "travelling_targets", "MODEL_OUTPUTS_KEY", "LABEL_BASE_KEY", "HALF_TOLERANCE",
           "IGNORE_INDEX"]

#: Round-config key: the outputs per sample of the server's model, where nodes' targets
#: are to be retyped for it (:func:`model_targets`).
MODEL_OUTPUTS_KEY = "model-outputs"
#: Round-config key: the first class label where labels are counted from 1 (HAPT's activity
#: ids 1 to 6 for 6 outputs): nodes send each label less it (:func:`label_base`).
LABEL_BASE_KEY = "label-base"
#: The class label of an element no loss reads, PyTorch's ``ignore_index`` default: a
#: tagger's padding, Hugging Face's sub-word continuations. Taken only among the class
#: labels of each element of a sample (``(n, L)`` tags, ``(n, H, W)`` masks).
IGNORE_INDEX = -100
#: Float targets travel as float16 where it moves none by more than this share of the
#: spread of its column over the batch (or moves none at all).
HALF_TOLERANCE = 1e-2


def travelling_targets(values: np.ndarray) -> np.ndarray:
    """Float32 targets as they travel: float16 where it holds them, else as they are.

    Holds them: exactly, or within :data:`HALF_TOLERANCE` of each column's spread over the
    batch (temperatures of a few degrees' spread move by at most 0.016 degrees; a year
    near 2000, whose float16 steps are whole years, or dollars past 65,504 stay float32).
    """
    with np.errstate(over="ignore"):  # past 65,504: inf, then kept as float32
        half = values.astype(np.float16)
    error = np.abs(half.astype(np.float32) - values)
    if values.size == 0 or not error.any():
        return half
    columns = values.reshape(values.shape[0], -1)
    spread = columns.std(axis=0) if columns.shape[0] > 1 else np.zeros(columns.shape[1])
    close = np.isfinite(half).all() and bool(
        (error.reshape(columns.shape) <= HALF_TOLERANCE * spread).all())
    return half if close else values


def binary_targets(y: np.ndarray) -> bool:
    """Whether float targets are all 0 or 1: labels for binary cross-entropy on logits."""
    return y.size > 0 and y.dtype.kind == "f" and bool(np.isin(y, (0, 1)).all())


def ids_below(x: np.ndarray, vocab: int) -> bool:
    """Whether every value of ``x`` is a whole number in ``[0, vocab)``.

    Ids an embedding of ``vocab`` rows reads, or class indices a model of ``vocab`` outputs
    scores.
    """
    return (vocab > 0 and x.size > 0 and bool(x.min() >= 0) and bool(x.max() < vocab)
            and np.array_equal(x, np.rint(x)))


def label_base(labels: list[np.ndarray], outputs: int) -> int:
    """1 where class labels are counted from 1 for a model of ``outputs`` outputs, else 0.

    Whole numbers (a sample's one label) from 1 up to ``outputs`` itself, the largest seen:
    a label ``outputs`` fits no output, so the user's own training reads ``y - 1`` (HAPT's
    activities 1 to 6; ``cross_entropy(out, y - 1)``).
    """
    flat = [np.asarray(y).reshape(-1) for y in labels if np.asarray(y).size]
    if outputs < 2 or not flat or any(np.asarray(y).ndim > 1 and np.asarray(y).shape[1] != 1
                                      for y in labels):
        return 0
    ys = np.concatenate(flat)
    whole = ys.dtype.kind in "iu" or (ys.dtype.kind == "f" and np.array_equal(ys, np.rint(ys)))
    return int(whole and ys.min() >= 1 and ys.max() == outputs)


def model_targets(y: np.ndarray, outputs: int, base: int = 0) -> np.ndarray:
    """``y`` typed as a model of ``outputs`` outputs a sample reads it, else ``y`` itself.

    One output: integer targets (n,) become float32 (a regression of counts; 0/1 labels
    then are binary targets). Two or more: float targets (n,) that are class indices
    below ``outputs`` become int64 class labels; ``base`` (:func:`label_base`) is taken
    from every label first. Two outputs: 0/1 targets ``(n, k)``, ``k > 2`` (a multi-label
    model has an output a label), are class labels of each of ``k`` elements, a binary
    tagger's (``(n, k, 2)`` logits). Anything else (``outputs`` 0: unknown) stays as it is.
    """
    if outputs == 2 and y.ndim == 2 and y.shape[1] > 2 and binary_targets(y):
        return y.astype(np.int64)
    flat = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y
    if flat.ndim != 1 or not flat.size:
        return y
    if base and outputs >= 2:
        if flat.min() < base:
            raise ValueError(f"class labels are counted from {base} in this federation (the "
                             f"others' run from {base} to {outputs}) but this node holds "
                             f"{flat.min():g}: give every node's labels from the same start")
        flat = (flat - base).astype(np.int64 if flat.dtype.kind in "iu" else flat.dtype)
        if flat.dtype.kind in "iu":
            return flat
    if outputs == 1 and (np.issubdtype(flat.dtype, np.integer) or flat.dtype == np.bool_):
        return flat.astype(np.float32)
    if outputs >= 2 and np.issubdtype(flat.dtype, np.floating) and ids_below(flat, outputs):
        return flat.astype(np.int64)
    return y


def retypes_to(target: str, wanted: str, outputs: int) -> bool:
    """Whether :func:`model_targets` can turn a node's ``target`` kind into ``wanted``.

    Kinds as a data spec names them: float class indices (``float``, or ``binary`` for
    0/1) become ``class`` labels for a model of two or more outputs; integer targets
    (``class``) become ``float`` or ``binary`` ones for a model of one output.
    """
    if outputs >= 2:
        return target in ("float", "binary") and wanted == "class"
    return outputs == 1 and target == "class" and wanted in ("float", "binary")


def retyped(spec: Any, labels: np.ndarray, outputs: int, users_loss: Any = None, base: int = 0
            ) -> tuple[np.ndarray, Any] | None:
    """``labels`` and their data ``spec`` typed as a model of ``outputs`` outputs reads them.

    :func:`model_targets` on a reply's targets, exact either way (small whole numbers), and
    the spec's target kind to match (``class``, ``binary`` for 0/1 floats, ``float``);
    ``None`` where nothing changes (or the targets are tokens, or several a sample). Given
    ``users_loss`` (the user's own), only whole numbers for one output become floats: any
    loss of one output reads floats, while float class ids may be what a loss of several
    outputs reads (a Gaussian NLL's mean and variance). ``base``: :func:`label_base`.
    """
    typed = model_targets(labels, outputs, base)
    if typed is labels or spec.target not in ("class", "float", "binary") \
            or spec.target_dim != 1 or (users_loss is not None and outputs != 1):
        return None
    kind = ("class" if np.issubdtype(typed.dtype, np.integer)
            else "binary" if binary_targets(typed) else "float")
    return typed, dataclasses.replace(spec, target=kind, target_dim=1, column=False)
