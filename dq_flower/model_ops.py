"""Flat parameter vectors, losses, gradients, Flower records and evaluation for torch models.

Flat vectors cover ``model.parameters()`` in order; ``loss_fn(outputs, targets)`` returns
one loss per sample, shape ``(n,)`` (:func:`default_loss` by default).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord
from torch import nn

from dq_flower.losses import (  # the losses: here for the model path's callers
    LossFn,
    binary_loss,
    default_loss,
    model_output,
    next_token_loss,
    per_row,
    resolve_loss,
)
from dq_flower.model_inputs import layers

__all__ = ["LossFn", "output_width", "default_loss", "next_token_loss", "binary_loss",
           "model_output", "embedding_vocab", "resolve_loss", "targets_tensor",
           "weighted_loss_grad", "WeightedSteps", "resolve_device", "state_arrays",
           "apply_flat_grad", "evaluate", "inference", "flat_grad", "from_arrays", "get_flat",
           "float_buffers", "set_float_buffers", "load_arrays", "loss_and_grad", "model_input",
           "float_dtype", "finite_since", "num_params", "reads_windows", "set_flat",
           "to_arrays"]


def num_params(model: nn.Module) -> int:
    """Count scalar parameters (the model dimension D)."""
    return sum(p.numel() for p in model.parameters())


def output_width(model: nn.Module) -> int | None:
    """Output features of the last linear layer (a class-count hint), ``None`` without one."""
    linear = [m for m in model.modules() if isinstance(m, nn.Linear)]
    return int(linear[-1].out_features) if linear else None


def finite_since(model: nn.Module, before: dict[str, torch.Tensor]) -> bool:
    """Whether the model's floating parameters and buffers are finite, as ``before`` allowed.

    An entry non-finite in ``before`` (the state the steps started from) and unchanged is
    the user's own: a causal mask's ``-inf`` kept as a buffer. Any other is divergence.
    """
    for name, v in model.state_dict().items():
        if v.is_floating_point() and not bool(torch.isfinite(v).all()):
            old = before.get(name)
            if old is None or old.shape != v.shape or not bool(
                    (torch.isfinite(v) | (v == old.to(v.device))).all()):
                return False
    return True


def reads_windows(model: nn.Module, length: int = 2) -> bool:
    """Whether ``model`` maps token windows to next-token logits (a language model).

    A model holding an ``nn.Embedding`` is tried on a window of ``length`` zero ids (int64)
    under :func:`inference`, drawing no random number: logits ``(1, length, vocab)`` say yes.
    """
    if not any(isinstance(m, nn.Embedding) for m in model.modules()):
        return False
    try:
        with inference(model):
            out = model_output(model(torch.zeros(1, length, dtype=torch.int64,
                                                 device=_device(model))))
    except Exception:  # noqa: BLE001 - any model that cannot read a window is not one
        return False
    return isinstance(out, torch.Tensor) and out.ndim == 3 and tuple(out.shape[:2]) == (1, length)


def _flat(tensors) -> np.ndarray:
    parts = [t.detach().reshape(-1).to("cpu", torch.float32) for t in tensors]
    return torch.cat(parts).numpy().copy() if parts else np.zeros(0, dtype=np.float32)


def get_flat(model: nn.Module) -> np.ndarray:
    """All parameters concatenated as one float32 vector of length D (a copy)."""
    return _flat(model.parameters())


def float_buffers(model: nn.Module) -> dict[str, np.ndarray]:
    """The model's floating-point buffers (BatchNorm's running statistics), float32 copies."""
    return {name: b.detach().to("cpu", torch.float32).numpy().copy()
            for name, b in model.named_buffers() if b.is_floating_point()}


def set_float_buffers(model: nn.Module, values: dict[str, np.ndarray]) -> None:
    """Write ``values`` (named as :func:`float_buffers` names them) into the buffers."""
    buffers = dict(model.named_buffers())
    with torch.no_grad():
        for name, value in values.items():
            buffers[name].copy_(torch.as_tensor(value).reshape(buffers[name].shape))


def set_flat(model: nn.Module, vec: np.ndarray | torch.Tensor) -> None:
    """Write a flat vector of length D into the parameters; ``ValueError`` for another shape."""
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
    return _flat(p.grad if p.grad is not None else torch.zeros_like(p)
                 for p in model.parameters())


def to_arrays(model: nn.Module) -> ArrayRecord:
    """Pack the model's ``state_dict`` (parameters and buffers) into an `ArrayRecord`."""
    return ArrayRecord(model.state_dict())


def from_arrays(model: nn.Module, record: ArrayRecord) -> None:
    """Load an `ArrayRecord` made by `to_arrays` into ``model`` (strict key match)."""
    model.load_state_dict(record.to_torch_state_dict(), strict=True)


load_arrays = from_arrays  # (``dq_flower.harness.tasks.from_arrays`` builds data sets)


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def targets_tensor(y: np.ndarray | torch.Tensor, device: torch.device) -> torch.Tensor:
    """Targets on ``device``: int64 for class labels, float32 for regression targets."""
    t = torch.as_tensor(np.asarray(y) if not isinstance(y, torch.Tensor) else y)
    return (t.to(device, torch.float32) if torch.is_floating_point(t)
            else t.to(device, torch.long))


def _per_sample(loss_fn: LossFn, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    losses = per_row(loss_fn, outputs, targets)
    if losses.ndim != 1 or losses.shape[0] != outputs.shape[0]:
        raise ValueError(f"loss_fn must return one loss per sample, shape ({outputs.shape[0]},);"
                         f" got {tuple(losses.shape)} (use reduction='none', or pass a "
                         "torch.nn loss module)")
    return losses


def model_input(x: np.ndarray | torch.Tensor, device: torch.device, tokens: bool,
                dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Samples as the model reads them: ids (windows, int32/int64) as int64, else ``dtype``."""
    t = torch.as_tensor(x if isinstance(x, torch.Tensor) else np.ascontiguousarray(x))
    ids = tokens or t.dtype in (torch.int32, torch.int64)
    return t.to(device, torch.int64 if ids else dtype)


def float_dtype(model: nn.Module) -> torch.dtype:
    """The floating dtype the model computes in: its first floating parameter's, else float32."""
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def embedding_vocab(model: nn.Module) -> int:
    """Rows of the embeddings the model reads its samples with: its first layers', else 0.

    The first module holding parameters, an ``nn.Embedding`` or ``nn.EmbeddingBag``, says
    the samples are ids (a text classifier's word ids); where embeddings follow it before any
    other layer (a recommender's users and items, a table's categories), each may read a
    column of its own: the ids are below the largest one's ``num_embeddings``.
    """
    rows = 0
    for layer in layers(model):  # the modules holding parameters of their own, in order
        if not isinstance(layer, (nn.Embedding, nn.EmbeddingBag)):
            break
        rows = max(rows, int(layer.num_embeddings))
    return rows


def _windows(y: torch.Tensor) -> bool:
    """Whether targets are token windows: integer ``(n, length)`` with ``length > 1``."""
    return y.ndim == 2 and y.shape[1] > 1 and not torch.is_floating_point(y)


def _reads_ids(model: nn.Module) -> bool:
    """Whether the model holds an embedding: samples beside windowed targets are its ids.

    A label a step of a float sensor window, ``(n, length)`` integers too, is no token
    window: its samples go to the model as floats (they went as int64, refused by a
    convolution's float weights).
    """
    return any(isinstance(m, (nn.Embedding, nn.EmbeddingBag)) for m in model.modules())


def _batch_tensors(model: nn.Module, x: np.ndarray, y: np.ndarray, w: np.ndarray
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A weighted minibatch as tensors on the model's device."""
    dev = _device(model)
    yt = targets_tensor(y, dev)
    return (model_input(x, dev, _windows(yt) and _reads_ids(model), float_dtype(model)), yt,
            torch.as_tensor(np.asarray(w), dtype=torch.float32).to(dev))


def weighted_loss_grad(model: nn.Module, x: np.ndarray, y: np.ndarray, w: np.ndarray,
                       loss_fn: LossFn | None = None) -> tuple[float, np.ndarray]:
    """``sum_i w_i loss(model(x_i), y_i)`` and its flat float32 gradient (``.grad`` untouched).

    A parameter the user froze (``requires_grad=False``) gets a zero gradient.
    """
    params = list(model.parameters())
    trainable = [p for p in params if p.requires_grad]
    xt, yt, wt = _batch_tensors(model, x, y, w)
    with torch.enable_grad():
        loss = (_per_sample(resolve_loss(loss_fn), model_output(model(xt)), yt) * wt).sum()
        found = iter(torch.autograd.grad(loss, trainable, allow_unused=True) if trainable
                     else ())
    grads = [next(found) if p.requires_grad else None for p in params]
    flat = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                      for g, p in zip(grads, params, strict=True)])
    return float(loss.detach()), flat.detach().cpu().numpy().astype(np.float32, copy=True)


class WeightedSteps:
    """Plain PyTorch steps on ``sum_i w_i loss(model(x_i), y_i)``, one minibatch at a time.

    The step :func:`weighted_loss_grad` then :func:`apply_flat_grad` take, without the flat
    vector: a parameter the loss does not reach gets a zero gradient as there. The model's
    parameters, device and loss are looked up once; the gradients are cleared before each
    step and by :meth:`close` after the last.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                 loss_fn: LossFn | None = None, autocast: str = "none") -> None:
        self.model, self.optimizer = model, optimizer
        self.loss_fn = resolve_loss(loss_fn)
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.device, self.dtype = _device(model), float_dtype(model)
        #: ``bfloat16``: the forward under ``torch.autocast`` (the loss in the model's dtype)
        self.bf16 = autocast == "bfloat16"
        self.reads_ids = _reads_ids(model)

    def step(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> float:
        """One optimizer step on the weighted minibatch; returns its loss."""
        yt = targets_tensor(y, self.device)
        xt = model_input(x, self.device, _windows(yt) and self.reads_ids, self.dtype)
        wt = torch.as_tensor(np.asarray(w), dtype=torch.float32).to(self.device)
        for p in self.params:  # zero_grad(set_to_none=True), without its profiling wrapper
            p.grad = None
        with torch.enable_grad():
            with (torch.autocast(self.device.type, torch.bfloat16) if self.bf16
                  else nullcontext()):  # disabled: no autocast context (3 us a step)
                out = model_output(self.model(xt))
            if self.bf16 and out.is_floating_point():
                out = out.to(self.dtype)
            loss = (_per_sample(self.loss_fn, out, yt) * wt).sum()
            loss.backward()
        for p in self.params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.optimizer.step()
        return float(loss.detach())

    def close(self) -> None:
        """Clear the gradients the last step left."""
        self.optimizer.zero_grad(set_to_none=True)


def loss_and_grad(model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
                  reduction: str = "mean", loss_fn: LossFn | None = None
                  ) -> tuple[float, np.ndarray]:
    """Loss on ``(x, y)`` (mean or sum over the batch) and its flat float32 gradient."""
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum', got {reduction!r}")
    xa = np.asarray(x.detach().cpu() if isinstance(x, torch.Tensor) else x)
    ya = np.asarray(y.detach().cpu() if isinstance(y, torch.Tensor) else y)
    if xa.ndim < 2 or xa.shape[0] != ya.shape[0]:
        raise ValueError(f"x {tuple(xa.shape)} and y {tuple(ya.shape)} disagree")
    if ya.shape[0] == 0:
        raise ValueError("empty batch")
    n = xa.shape[0]
    w = np.full(n, 1.0 / n if reduction == "mean" else 1.0, dtype=np.float32)
    return weighted_loss_grad(model, xa, ya, w, loss_fn)


def apply_flat_grad(model: nn.Module, optimizer: torch.optim.Optimizer, grad: np.ndarray) -> None:
    """Set each parameter's ``.grad`` from the flat ``grad`` and take one optimizer step.

    A frozen parameter (``requires_grad=False``) keeps no gradient: the step leaves it as it is.
    """
    offset = 0
    for p in model.parameters():
        k = p.numel()
        if p.requires_grad:
            p.grad = torch.from_numpy(grad[offset:offset + k].reshape(p.shape).copy()
                                      ).to(p.device, p.dtype)
        offset += k
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


@contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """Eval mode without gradients; the model's train/eval mode is restored on exit."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


def evaluate(model: nn.Module, x: np.ndarray | torch.Tensor, y: np.ndarray | torch.Tensor,
             batch_size: int = 1024, loss_fn: LossFn | None = None) -> tuple[float, float]:
    """Mean loss and accuracy (``nan`` for float targets), under :func:`inference`."""
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    dev = _device(model)
    yt = targets_tensor(y, dev)
    xt = model_input(x, dev, _windows(yt) and _reads_ids(model), float_dtype(model))
    if yt.ndim == 2 and not torch.is_floating_point(yt):
        yt = yt.reshape(-1)
    if xt.shape[0] != yt.shape[0] or xt.ndim < 2:
        raise ValueError(f"x {tuple(xt.shape)} and y {tuple(yt.shape)} disagree")
    if yt.shape[0] == 0:
        raise ValueError("empty batch")
    fn = resolve_loss(loss_fn)
    classes = not torch.is_floating_point(yt)
    total_loss, correct = 0.0, 0
    with inference(model):
        for i in range(0, xt.shape[0], batch_size):
            out = model_output(model(xt[i:i + batch_size]))
            yb = yt[i:i + batch_size]
            total_loss += float(_per_sample(fn, out, yb).sum())
            if classes:
                correct += int((out.argmax(dim=1) == yb).sum())
    n = int(yt.shape[0])  # a mask's labels: the share of its elements right
    return total_loss / n, (correct / yt.numel() if classes else float("nan"))


def per_sample_results(model: nn.Module, x: np.ndarray, y: np.ndarray,
                       loss_fn: LossFn | None = None, batch_size: int = 1024,
                       floors: Any = None) -> tuple[np.ndarray, np.ndarray | None]:
    """Per-sample losses and, for class targets, whether the argmax is right (as `evaluate`).

    ``floors``: takes each batch's outputs, targets and losses (``LossFloors.add``).
    """
    dev, fn, dtype = _device(model), resolve_loss(loss_fn), float_dtype(model)
    yt = targets_tensor(y, dev)
    windows = _windows(yt)
    ids = windows and _reads_ids(model)
    classes = (not torch.is_floating_point(yt) and not windows  # windows, masks: no hits
               and math.prod(yt.shape[1:]) == 1)
    if classes and yt.ndim == 2:
        yt = yt.reshape(-1)
    losses, hits = [], []
    with inference(model):
        for i in range(0, len(x), batch_size):
            out = model_output(model(model_input(x[i:i + batch_size], dev, ids, dtype)))
            yb = yt[i:i + batch_size]
            losses.append(_per_sample(fn, out, yb).double().cpu().numpy())
            if floors is not None:
                floors.add(lambda o, t: _per_sample(fn, o, t), out, yb, losses[-1])
            if classes:  # outputs that score each class (a user's loss may read others)
                classes = not yb.numel() or int(yb.max()) < out.shape[1]
                hits.append((out.argmax(dim=1) == yb).cpu().numpy())
    loss = np.concatenate(losses) if losses else np.zeros(0)
    return loss, (np.concatenate(hits) if hits else np.zeros(0, dtype=bool)) if classes else None


def resolve_device(name: str) -> torch.device:
    """``auto``: a CUDA GPU when one is visible to this process, else the CPU."""
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' was asked for but no CUDA GPU is visible")
    if name == "cuda" or (name == "auto" and torch.cuda.is_available()):
        return torch.device("cuda")
    return torch.device("cpu")


def state_arrays(model: nn.Module) -> ArrayRecord:
    """The model's state dict as a Flower ``ArrayRecord`` (tensors copied to the CPU)."""
    return ArrayRecord({k: v.detach().cpu() for k, v in model.state_dict().items()})
