"""Data sets, node-local data files and federated partitions.

Every data set is held as flat float32 rows plus targets: int64 class labels, or float32
regression targets (``num_classes == 0``). ``Dataset.input_shape`` remembers the original
sample shape so models can reshape.

Values are never rescaled behind the user's back. The named data sets are normalised as
part of their definition, explicitly in their own loaders: scikit-learn's digits
(embedded, no download) divided by 16 (its pixel range is 0..16), Fashion-MNIST from IDX
files and CIFAR-10 from torchvision's python-pickle folder divided by 255 (uint8 pixels),
so their values lie in ``[0, 1]``. User data (any numpy pair given to `from_arrays`, any
``npz:<path>`` file) is used as given: only cast to float32 and checked to be finite.

A device's own samples live in a node-local ``.npz`` file (`load_node_data`,
`save_node_data`; node config key ``data-file``), kept in its sample shape.

Partitions are computed with flwr-datasets partitioners on an in-memory table of
``(idx, label)`` only, so partitioning never copies the samples themselves.

Modules
-------
``container``   :class:`Dataset`
``arrays``      `from_arrays`, `save_npz` and ``npz:<path>`` files; the checks of all data
``node_files``  :class:`NodeData`, `load_node_data`, `save_node_data`
``loaders``     the named data sets, `parse_idx`, `load_dataset`, `load_dataset_cached`
``validation``  `validation_view`, `load_task_dataset`
``partitions``  `partition_indices`, `load_partition`
"""

from __future__ import annotations

from dq_flower.harness.tasks.data.arrays import from_arrays, save_npz
from dq_flower.harness.tasks.data.container import Dataset
from dq_flower.harness.tasks.data.loaders import (
    DATASET_NAMES,
    DEFAULT_FMNIST_DIR,
    default_data_root,
    load_dataset,
    load_dataset_cached,
    parse_idx,
)
from dq_flower.harness.tasks.data.node_files import (
    NODE_DATA_CONFIG_KEY,
    NodeData,
    load_node_data,
    save_node_data,
)
from dq_flower.harness.tasks.data.partitions import (
    PARTITION_SCHEMES,
    load_partition,
    partition_indices,
)
from dq_flower.harness.tasks.data.validation import (
    VALIDATION_PURPOSE,
    load_task_dataset,
    validation_view,
)

__all__ = [
    "DATASET_NAMES",
    "DEFAULT_FMNIST_DIR",
    "NODE_DATA_CONFIG_KEY",
    "PARTITION_SCHEMES",
    "VALIDATION_PURPOSE",
    "Dataset",
    "NodeData",
    "default_data_root",
    "from_arrays",
    "load_dataset",
    "load_dataset_cached",
    "load_task_dataset",
    "validation_view",
    "load_node_data",
    "load_partition",
    "parse_idx",
    "partition_indices",
    "save_node_data",
    "save_npz",
]
