"""Flat parameter vectors, gradients, Flower records and evaluation for torch models.

Flat vectors cover ``model.parameters()`` in ``named_parameters()`` order; buffers
(BatchNorm running statistics) are not part of them but are part of the
`ArrayRecord` made by `to_arrays`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812
from flwr.app import ArrayRecord
from torch import nn

__all__ = [
    "evaluate",
    "flat_grad",
    "from_arrays",
    "get_flat",
    "load_arrays",
    "loss_and_grad",
    "num_params",
    "set_flat",
    "to_arrays",
]


def _device(model: nn.Module) -> torch.device:
    p = next(model.parameters(), None)
    return p.device if p is not None else torch.device("cpu")


def num_params(model: nn.Module) -> int:
    """Count scalar parameters (the model dimension D)."""
    return sum(p.numel() for p in model.parameters())


def get_flat(model: nn.Module) -> np.ndarray:
    """All parameters concatenated as one float32 vector of length D (a copy)."""
    params = [p.detach().reshape(-1).to("cpu", torch.float32) for p in model.parameters()]
    if not params:
        return np.zeros(0, dtype=np.float32)
    return torch.cat(params).numpy().copy()


def set_flat(model: nn.Module, vec: np.ndarray | torch.Tensor) -> None:
    """Write a flat vector of length D into the parameters, in place.

    Raises
    ------
    ValueError
        ``vec`` is not one-dimensional of length `num_params`.
    """
    t = torch.as_tensor(np.asarray(vec) if not isinstance(vec, torch.Tensor) else vec)
    total = num_params(model)
    if t.ndim != 1 or t.numel() != total:
        raise ValueError(f"flat vector must have shape ({total},), got {tuple(t.shape)}")
    offset = 0
    with torch.no_grad():
        for p in model.parameters():
            k = p.numel()
            p.copy_(t[offset:offset + k].view_as(p).to(p.device, p.dtype))
            offset += k


def flat_grad(model: nn.Module) -> np.ndarray:
    """Concatenate every parameter's ``.grad`` (zeros where it is None) as float32."""
    parts = [
        (p.grad.detach() if p.grad is not None else torch.zeros_like(p))
        .reshape(-1).to("cpu", torch.float32)
        for p in model.parameters()
    ]
    if not parts:
        return np.zeros(0, dtype=np.float32)
    return torch.cat(parts).numpy().copy()


def to_arrays(model: nn.Module) -> ArrayRecord:
    """Pack the model's ``state_dict`` (parameters and buffers) into an `ArrayRecord`."""
    return ArrayRecord(model.state_dict())


def from_arrays(model: nn.Module, record: ArrayRecord) -> None:
    """Load an `ArrayRecord` made by `to_arrays` into ``model`` (strict key match)."""
    model.load_state_dict(record.to_torch_state_dict(), strict=True)


load_arrays = from_arrays
"""Alias of `from_arrays` (``dq_flower.tasks.from_arrays`` builds data sets)."""


def _tensors(
    model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    dev = _device(model)
    xt = torch.as_tensor(x).to(dev, torch.float32)
    yt = torch.as_tensor(y).to(dev, torch.long).reshape(-1)
    if xt.ndim < 2 or xt.shape[0] != yt.shape[0]:
        raise ValueError(f"x {tuple(xt.shape)} and y {tuple(yt.shape)} disagree")
    if yt.shape[0] == 0:
        raise ValueError("empty batch")
    return xt, yt


def loss_and_grad(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    reduction: str = "mean",
) -> tuple[float, np.ndarray]:
    """Cross-entropy loss on ``(x, y)`` and its flat gradient.

    Uses ``torch.autograd.grad``, so parameters' ``.grad`` fields are left untouched.
    The model's current train/eval mode is kept (BatchNorm models in training mode
    use batch statistics and update their running statistics).

    Parameters
    ----------
    model : nn.Module
        Model taking flat rows.
    x, y : array-like
        Flat inputs ``(n, d)`` and int labels ``(n,)``.
    reduction : {"mean", "sum"}
        Loss reduction over the batch.

    Returns
    -------
    loss : float
        The reduced loss.
    grad : np.ndarray
        float32 gradient of length D.
    """
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    xt, yt = _tensors(model, x, y)
    params = list(model.parameters())
    with torch.enable_grad():
        loss = F.cross_entropy(model(xt), yt, reduction=reduction)
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    flat = torch.cat([
        (g if g is not None else torch.zeros_like(p)).reshape(-1).to("cpu", torch.float32)
        for g, p in zip(grads, params, strict=True)
    ])
    return float(loss.detach()), flat.numpy().copy()


def evaluate(
    model: nn.Module,
    x: np.ndarray | torch.Tensor,
    y: np.ndarray | torch.Tensor,
    batch_size: int = 1024,
) -> tuple[float, float]:
    """Mean cross-entropy loss and accuracy, in eval mode and without gradients.

    The model's previous train/eval mode is restored afterwards.

    Returns
    -------
    loss : float
        Mean loss over all samples.
    accuracy : float
        Fraction of correct argmax predictions.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    xt, yt = _tensors(model, x, y)
    was_training = model.training
    model.eval()
    total_loss, correct = 0.0, 0
    try:
        with torch.no_grad():
            for i in range(0, xt.shape[0], batch_size):
                logits = model(xt[i:i + batch_size])
                yb = yt[i:i + batch_size]
                total_loss += float(F.cross_entropy(logits, yb, reduction="sum"))
                correct += int((logits.argmax(dim=1) == yb).sum())
    finally:
        model.train(was_training)
    n = int(yt.shape[0])
    return total_loss / n, correct / n
