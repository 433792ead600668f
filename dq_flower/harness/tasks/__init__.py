"""Data sets, partitions, models and parameter helpers for dq_flower.

``from_arrays`` here builds a `Dataset` from numpy arrays; the model-record helper of
the same name lives in `dq_flower.model_ops` (alias ``load_arrays``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dq_flower.harness.tasks.data import (
    from_arrays,
    load_dataset,
    load_partition,
    partition_indices,
    save_npz,
)

#: Names that need PyTorch, imported on first use (a node's data loads without it).
_LAZY = {"make_model": "dq_flower.harness.tasks.models", "num_params": "dq_flower.model_ops"}

if TYPE_CHECKING:
    from dq_flower.harness.tasks.models import make_model
    from dq_flower.model_ops import num_params

__all__ = ["from_arrays", "load_dataset", "load_partition", "make_model", "num_params",
           "partition_indices", "save_npz"]


def __getattr__(name: str) -> Any:
    """The model helpers, imported (with PyTorch) on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
