"""Data sets, partitions, models and parameter helpers for dq_flower.

``from_arrays`` here builds a `Dataset` from numpy arrays; the model-record helper of
the same name lives in `dq_flower.model_ops` (alias ``load_arrays``).
"""

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

__all__ = [
    "DATASET_NAMES",
    "MODEL_NAMES",
    "PARTITION_SCHEMES",
    "Dataset",
    "evaluate",
    "flat_grad",
    "from_arrays",
    "get_flat",
    "load_arrays",
    "load_dataset",
    "load_dataset_cached",
    "load_partition",
    "loss_and_grad",
    "make_model",
    "num_params",
    "partition_indices",
    "save_npz",
    "set_flat",
    "to_arrays",
]
