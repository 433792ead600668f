"""dq_flower: data quantization for communication-efficient training in Flower.

Uploads quantized data samples (plus optional compensation bits chosen by an importance
filter) instead of weights or gradients, and ships byte-exact baselines to compare with.
DQ sends quantized raw samples to the server: use it on trusted networks only.

The plugin: :class:`DQStrategy` and :class:`GradientStrategy` (Flower strategies for any
``nn.Module``), the client functions in :mod:`dq_flower.client` (``dq_train``,
``gradient_train``, ``evaluate``), :class:`CompressedUpdates` with its client mod
:func:`compression_mod` (coded updates for any Flower strategy) and :class:`MeasuredGrid`.
The harness: :func:`simulate` and ``dq-flower compare``.

``import dq_flower.client`` imports no PyTorch (see :mod:`dq_flower.torch_support`): the
strategies and the compression wrapper and mod are loaded on first use.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dq_flower import client, codecs
from dq_flower.accounting import Ledger, MeasuredGrid
from dq_flower.baselines.config import GradientConfig
from dq_flower.dq.config import DQConfig
from dq_flower.extras import explain_missing
from dq_flower.harness.history import RunResult
from dq_flower.harness.simulate import simulate
from dq_flower.wire.dq_batch import DataSpec

if TYPE_CHECKING:
    from dq_flower.baselines.strategy import GradientStrategy
    from dq_flower.compression.config import CompressionConfig
    from dq_flower.compression.mod import compression_mod
    from dq_flower.compression.strategy import CompressedUpdates
    from dq_flower.dq.server.strategy import DQStrategy

__all__ = ["DQStrategy", "GradientStrategy", "CompressedUpdates", "compression_mod",
           "CompressionConfig", "MeasuredGrid", "Ledger", "DQConfig", "GradientConfig",
           "DataSpec", "client", "codecs", "simulate", "RunResult"]
__version__ = "0.1.0"

#: Imported (with PyTorch) on first use, so that a client without it imports the package.
_LAZY = {"DQStrategy": "dq_flower.dq.server.strategy",
         "GradientStrategy": "dq_flower.baselines.strategy",
         "CompressedUpdates": "dq_flower.compression.strategy",
         "compression_mod": "dq_flower.compression.mod",
         "CompressionConfig": "dq_flower.compression.config"}


def __getattr__(name: str) -> Any:
    """The strategies, imported (with PyTorch) on first use."""
    if name in _LAZY:
        with explain_missing(f"dq_flower.{name}"):  # a client-only install: name the extra
            return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
