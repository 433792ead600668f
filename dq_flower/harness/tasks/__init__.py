"""Data sets, partitions, models and parameter helpers for dq_flower.

``from_arrays`` here builds a `Dataset` from numpy arrays; the model-record helper of
the same name lives in `dq_flower.model_ops` (alias ``load_arrays``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dq_flower.harness.tasks.data import (
    DATASET_NAMES,
    PARTITION_SCHEMES,
    Dataset,
    from_arrays,
    load_dataset,
    load_dataset_cached,
    load_partition,
    partition_indices,
    save_npz,
)

#: Names that need PyTorch, imported on first use (a node's data loads without it).
_LAZY = {"MODEL_NAMES": "dq_flower.harness.tasks.models",
         "make_model": "dq_flower.harness.tasks.models",
         **{name: "dq_flower.model_ops" for name in (
             "evaluate", "flat_grad", "get_flat", "load_arrays", "loss_and_grad", "num_params",
             "set_flat", "to_arrays")}}

if TYPE_CHECKING:
    from dq_flower.harness.tasks.models import MODEL_NAMES, make_model
    from dq_flower.model_ops import (
        evaluate,
        flat_grad,
        get_flat,
        load_arrays,
        loss_and_grad,
        num_params,
        set_flat,
        to_arrays,
    )

__all__ = ["DATASET_NAMES", "MODEL_NAMES", "PARTITION_SCHEMES", "Dataset", "evaluate",
           "flat_grad", "from_arrays", "get_flat", "load_arrays", "load_dataset",
           "load_dataset_cached", "load_partition", "loss_and_grad", "make_model", "num_params",
           "partition_indices", "save_npz", "set_flat", "to_arrays"]


def __getattr__(name: str) -> Any:
    """The model helpers, imported (with PyTorch) on first use."""
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
