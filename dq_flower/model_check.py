"""The server's model check: its model and loss run on a few rows of the data a spec says.

:func:`check_model` gives the classes (or target width) the model's outputs score, or
raises :class:`~dq_flower.codecs.PayloadError` with the reason; :func:`placeholder_rows`
are rows of a spec given, not sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from dq_flower.codecs import PayloadError
from dq_flower.losses import LossFn, element_logits
from dq_flower.model_inputs import HOOK_ATTR, check_width, split_inputs
from dq_flower.model_ops import float_dtype, model_input, model_output, weighted_loss_grad

if TYPE_CHECKING:
    from dq_flower.wire.dq_batch import DataSpec

__all__ = ["CHECK_ROWS", "check_model", "match_inputs", "placeholder_rows"]

#: Rows of an upload the model check runs the model and the loss on.
CHECK_ROWS = 4


def _classes(spec: DataSpec, width: int, num_classes: int | None, top: int = 0,
             user_loss: bool = False) -> int:
    """Classes (class targets) or target width (float targets) the model's output gives.

    A user's loss reads outputs of its own width (variance, quantile or ordinal heads, labels
    from 1): then the targets' width, or the classes given or up to the largest label ``top``.
    """
    if spec.target == "tokens":  # next-token logits (length, vocab) per window
        if width != spec.dim * spec.target_dim:
            raise PayloadError(f"the model has {width} outputs per window; next-token "
                               f"logits of {spec.dim} tokens of a vocabulary of "
                               f"{spec.target_dim} are {spec.dim * spec.target_dim}")
        return spec.target_dim
    if spec.target != "class":
        if width != spec.target_dim and not user_loss:
            raise PayloadError(f"the model has {width} outputs per sample; the float "
                               f"targets have {spec.target_dim}")
        return spec.target_dim
    if user_loss and width >= 2 and max(num_classes or 0, top + 1) > width:
        return max(num_classes or 0, top + 1)
    if num_classes is None:
        if width < 2:
            raise PayloadError(f"the model has {width} output for class labels; give "
                               "num_classes or use float targets")
        return width
    if width < num_classes:
        raise PayloadError(f"the model's {width} outputs cannot score {num_classes} classes")
    return num_classes


def _width(out: torch.Tensor, spec: DataSpec) -> int:
    """Outputs a row (a label a row), or classes each element of a row's labels is scored by."""
    if not spec.target_shape:
        return int(out.reshape(out.shape[0], -1).shape[1])
    if (logits := element_logits(out, spec.target_shape)) is None:
        raise PayloadError(f"the model's outputs {tuple(out.shape)} do not score each of a "
                           f"row's {spec.target_shape} labels: (n, classes, *{spec.target_shape}"
                           f") or (n, *{spec.target_shape}, classes) are")
    return int(logits.shape[2])


def check_model(model: torch.nn.Module, spec: DataSpec, x: np.ndarray, y: np.ndarray,
                num_classes: int | None, loss_fn: LossFn | None = None) -> int:
    """Run the model and the training loss on a few rows shaped by ``spec``; the classes.

    In eval mode (no buffer changes); any error, an out-of-range label or a non-finite
    loss raises :class:`PayloadError`.
    """
    n = min(len(y), CHECK_ROWS)
    if n == 0:
        raise PayloadError("no rows to check the data spec against the model")
    match_inputs(model, spec)
    was_training = model.training
    model.eval()
    raw: object = None
    try:
        check_width(model, spec)  # a row narrower than the model's, broadcast in its forward
        rows = np.ascontiguousarray(x[:n]).reshape(n, *spec.sample_shape)
        dev = next(model.parameters()).device
        with torch.no_grad():
            raw = model(model_input(rows, dev, spec.target == "tokens", float_dtype(model)))
            out = model_output(raw)
        classes = _classes(spec, _width(out, spec), num_classes,
                           int(y.max()) if spec.target == "class" else 0,
                           getattr(loss_fn, "user", loss_fn) is not None)
        if spec.target == "class" and int(y.max()) >= classes:
            raise PayloadError(f"label {int(y.max())} is out of range ({classes} classes)")
        loss, grad = weighted_loss_grad(model, rows, y[:n], np.full(n, 1.0 / n, np.float32),
                                        loss_fn)
    except PayloadError:
        raise
    except Exception as exc:  # noqa: BLE001  (any model or loss error: a wrong spec)
        several = (" (loss_fn is handed the model's first output, outputs[0] of its "
                   f"{type(raw).__name__}: return the output the loss reads first)"
                   if getattr(loss_fn, "user", loss_fn) is not None and raw is not None
                   and not isinstance(raw, torch.Tensor) else "")
        raise PayloadError(f"the model cannot train on samples of shape {spec.sample_shape}:"
                           f" {type(exc).__name__}: {exc}{several}") from None
    finally:
        model.train(was_training)
    if not (np.isfinite(loss) and np.isfinite(grad).all()):
        raise PayloadError("the model's training loss on the samples is not finite")
    return classes


def match_inputs(model: nn.Module, spec: DataSpec | None) -> None:
    """Have ``model`` split flat rows into ``spec``'s several inputs, and no others."""
    if spec is not None and (spec.inputs or getattr(model, HOOK_ATTR, None) is not None):
        split_inputs(model, spec.inputs)


def placeholder_rows(spec: DataSpec, n: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Zero rows and targets of ``spec`` (class 0 or zero targets): a spec given, not sent."""
    x = np.zeros((n, spec.dim), dtype=np.int64 if spec.vocab else np.float32)  # ids: int64
    if spec.target == "tokens":  # windows of token 0, their own targets
        return x, np.zeros((n, spec.dim), dtype=np.int64)
    if spec.target == "class":
        return x, np.zeros((n, *spec.target_shape), dtype=np.int64)
    return x, np.zeros((n,) if spec.target_dim == 1 else (n, spec.target_dim), np.float32)
