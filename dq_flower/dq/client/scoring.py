"""What a DQ client computes with the received model: scores, residuals and gradients.

Importance of candidate samples (``loss``, ``gradnorm``, ``entropy``, ``margin``; ``uniform``
needs no model and is answered here too) and of token windows (``entropy``, ``loss``),
compensation residuals and minibatch gradients.

This module imports PyTorch; :mod:`dq_flower.dq.client.train` imports it only for a round whose
knobs need the model (a scorer other than ``uniform``, compensation, a refreshed residual, a
gradient round), after :func:`dq_flower.torch_support.require_torch` has named the knob where
PyTorch is missing, so a client without PyTorch runs the ``uniform`` scorer.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Message

from dq_flower.losses import element_logits, kept_elements, per_row
from dq_flower.model_ops import (
    LossFn,
    float_buffers,
    float_dtype,
    inference,
    model_input,
    model_output,
    resolve_loss,
    set_float_buffers,
    targets_tensor,
    weighted_loss_grad,
)
from dq_flower.wire.model import MODEL_KEY, load_model_record
from dq_flower.wire.model_buffers import BUFFERS_KEY, read_buffers
from dq_flower.wire.node_errors import NodeConfigError
from dq_flower.wire.targets import IGNORE_INDEX

__all__ = ["score_candidates", "score_windows", "received_model", "quantization_residual",
           "batch_gradient"]


def _last_linear_input(model: torch.nn.Module):
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    return linears[-1] if linears else None


def _class_logits(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Outputs as ``(n, elements, classes)``: one element a row, or one a label of a mask."""
    several = y.ndim > 1 and not torch.is_floating_point(y)
    logits = element_logits(out, tuple(y.shape[1:])) if several else None
    return out.reshape(out.shape[0], 1, -1) if logits is None else logits


def _kept_mean(values: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's mean of its elements' ``values`` ``(n, E)``, over those a loss reads.

    Elements labelled :data:`~dq_flower.wire.targets.IGNORE_INDEX` (a tagger's padding) are
    left out (:func:`~dq_flower.losses.kept_elements`); a row of none scores 0.
    """
    counts = kept_elements(y) if values.shape[1] > 1 else None
    if counts is None:
        return values.mean(1)
    kept = (y != IGNORE_INDEX).reshape(values.shape).to(values.dtype)
    return (values * kept).sum(1) / counts.clamp(min=1).to(values.dtype)


def score_candidates(
    scorer: str, model: torch.nn.Module | None, x: np.ndarray, y: np.ndarray,
    loss_fn: LossFn | None = None,
) -> np.ndarray:
    """Importance of each candidate: ``uniform``, ``loss``, ``gradnorm``, ``entropy``, ``margin``.

    ``entropy`` is the entropy of the received model's predictive distribution (softmax of
    its outputs) and ``margin`` one minus the gap between its two most probable classes:
    both need no label and stay high on samples the model is unsure of (a label an element,
    a mask's: each element's, averaged over the row).

    ``loss`` is the per-sample loss under the received model. ``gradnorm`` is the norm of
    the per-sample gradient of the last linear layer, ``||dl/dz|| * sqrt(1 + ||h||^2)``
    with ``z`` the model's output and ``h`` that layer's input (for a model whose last
    layer is not linear, ``||dl/dz||``); ``dl/dz`` comes from autograd, so any loss works.
    """
    if scorer == "uniform" or x.shape[0] == 0:
        return np.ones(x.shape[0])
    if model is None:
        raise ValueError(f"scorer {scorer!r} needs the model: pass model= to dq_train")
    fn = resolve_loss(loss_fn)
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    captured: dict[str, torch.Tensor] = {}
    last = _last_linear_input(model) if scorer == "gradnorm" else None
    hook = (last.register_forward_hook(lambda _m, inp, _o: captured.__setitem__("h", inp[0]))
            if last is not None else None)
    scores = []
    try:
        for i in range(0, x.shape[0], 1024):
            xb = model_input(x[i:i + 1024], dev, False, float_dtype(model))
            yb = targets_tensor(y[i:i + 1024], dev)
            if scorer in ("loss", "entropy", "margin"):
                with torch.no_grad():
                    out = model_output(model(xb))
                    if scorer == "loss":
                        scores.append(per_row(fn, out, yb))
                        continue
                    p = torch.softmax(_class_logits(out, yb).double(), dim=2)  # (n, E, C)
                if scorer == "entropy":  # a label an element: averaged over the row's
                    scores.append(_kept_mean(-(p * torch.log(p.clamp_min(1e-12))).sum(2), yb))
                else:
                    top = torch.topk(p, k=min(2, p.shape[2]), dim=2).values
                    gap = top[..., 0] - top[..., 1] if top.shape[2] > 1 else top[..., 0]
                    scores.append(_kept_mean(1.0 - gap, yb))
                continue
            with torch.enable_grad():
                out = model_output(model(xb)).detach().requires_grad_(True)
                (dz,) = torch.autograd.grad(per_row(fn, out, yb).sum(), out)
            norm = dz.reshape(dz.shape[0], -1).norm(dim=1)
            if "h" in captured:
                h = captured.pop("h").detach().reshape(dz.shape[0], -1)
                norm = norm * torch.sqrt(1 + (h * h).sum(1))
            scores.append(norm)
    finally:
        if hook is not None:
            hook.remove()
        model.train(was_training)
    return torch.cat(scores).double().cpu().numpy()


def score_windows(scorer: str, model: torch.nn.Module, windows: np.ndarray,
                  loss_fn: LossFn | None = None, batch: int = 64) -> np.ndarray:
    """Importance of token windows ``(n, length)`` under the received model.

    The model reads int64 ids (:func:`~dq_flower.model_ops.model_input`) and returns next-token
    logits ``(n, length, vocab)``; position ``t`` predicts token ``t + 1``, so a window
    has ``length - 1`` predictions. ``entropy``: their mean predictive entropy (nats, no
    label needed); ``loss``: the window's loss (the mean next-token cross-entropy by
    default, the window its own target). One forward pass per window, no gradient.
    """
    if scorer not in ("entropy", "loss"):
        raise ValueError(f"token windows are scored by entropy or loss, not {scorer!r}")
    if windows.shape[0] == 0:
        return np.ones(0)
    fn = resolve_loss(loss_fn)
    dev = next(model.parameters()).device
    scores = []
    with inference(model):
        for i in range(0, windows.shape[0], batch):
            ids = windows[i:i + batch]
            logits = model_output(model(model_input(ids, dev, tokens=True)))
            if scorer == "loss":
                scores.append(fn(logits, targets_tensor(ids, dev)).reshape(-1).double())
                continue
            logp = torch.log_softmax(logits[:, :-1].double(), dim=-1)
            scores.append(-(logp.exp() * logp).sum(-1).mean(1))
    return torch.cat(scores).cpu().numpy()


def received_model(msg: Message, model: torch.nn.Module | None,
                   why: str) -> torch.nn.Module | None:
    """Load the server's weights into ``model`` when the message carries them."""
    if MODEL_KEY not in msg.content.array_records:
        return None
    if model is None:
        raise NodeConfigError(f"{why} needs the model: pass model= (your nn.Module) to "
                              "dq_train")
    load_model_record(model, msg.content.array_records[MODEL_KEY])
    buffers = msg.content.array_records.get(BUFFERS_KEY)  # batch norms' statistics
    if buffers is not None:
        own = float_buffers(model)  # the node's own: a causal mask's -inf is a constant
        set_float_buffers(model, read_buffers(buffers, {k: v.shape for k, v in own.items()},
                                              own))
    return model


def quantization_residual(model: torch.nn.Module, x: np.ndarray, xq: np.ndarray,
                          y: np.ndarray, weights: np.ndarray,
                          loss_fn: LossFn | None) -> np.ndarray:
    """``sum_i w_i [grad f(x_i) - grad f(Q(x_i))]``: the true minus the quantized gradient.

    ``x`` and ``xq`` are in the model's input shape; ``weights`` sum to one.
    """
    _, g_true = weighted_loss_grad(model, x, y, weights, loss_fn)
    _, g_quant = weighted_loss_grad(model, xq, y, weights, loss_fn)
    return g_true - g_quant


def batch_gradient(model: torch.nn.Module, x: np.ndarray, y: np.ndarray,
                   loss_fn: LossFn | None) -> tuple[float, np.ndarray]:
    """Mean loss and flat gradient of the model over the minibatch ``(x, y)``."""
    size = x.shape[0]
    loss, grad = weighted_loss_grad(model, x, y, np.full(size, 1.0 / size), loss_fn)
    return float(loss), grad
