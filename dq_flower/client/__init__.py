"""Client functions to call from a Flower app's own ``@app.train()`` handler.

- :func:`dq_train` answers a :class:`dq_flower.DQStrategy` round with quantized samples;
- :func:`gradient_train` answers a :class:`dq_flower.GradientStrategy` round with a coded
  gradient;
- :func:`evaluate` answers a federated-evaluation message (either strategy, or Flower's
  ``FedAvg``) with the loss and accuracy on the device's held-out data.

Importing this module imports no PyTorch: a device with Flower and numpy only runs
:func:`dq_train` for data rounds with the ``uniform`` scorer and no compensation.
:func:`gradient_train` (imported on first use) and :func:`evaluate` need PyTorch and say so
where it is missing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from dq_flower.client.evaluate import evaluate
from dq_flower.dq.client.train import dq_train
from dq_flower.torch_support import require_torch

if TYPE_CHECKING:
    from dq_flower.baselines.client import gradient_train

__all__ = ["dq_train", "gradient_train", "evaluate"]


def __getattr__(name: str) -> Any:
    """``gradient_train``, imported with PyTorch on first use."""
    if name == "gradient_train":
        require_torch("gradient_train (the compressed-gradient baselines)")
        from dq_flower.baselines.client import gradient_train  # PyTorch, checked above

        return gradient_train
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
