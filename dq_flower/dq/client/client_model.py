"""What a DQ client computes with the received model: compensation residuals and gradients.

This module imports PyTorch; :mod:`dq_flower.dq.client.train` imports it only for a round whose
knobs need the model (compensation, a refreshed residual, a gradient round), after
:func:`dq_flower.torch_support.require_torch` has named the knob where PyTorch is missing.
"""

from __future__ import annotations

import numpy as np
import torch
from flwr.app import Message

from dq_flower.model_ops import LossFn, weighted_loss_grad
from dq_flower.wire.model import MODEL_KEY, load_model_record
from dq_flower.wire.node_errors import NodeConfigError

__all__ = ["received_model", "quantization_residual", "batch_gradient"]


def received_model(msg: Message, model: torch.nn.Module | None,
                   why: str) -> torch.nn.Module | None:
    """Load the server's weights into ``model`` when the message carries them."""
    if MODEL_KEY not in msg.content.array_records:
        return None
    if model is None:
        raise NodeConfigError(f"{why} needs the model: pass model= (your nn.Module) to "
                              "dq_train")
    load_model_record(model, msg.content.array_records[MODEL_KEY])
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
