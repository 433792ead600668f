"""Data sets, node-local data files and federated partitions.

A data set is flat float32 rows plus int64 class labels or float32 regression targets
(``num_classes == 0``); ``Dataset.input_shape`` keeps the sample shape. The named data
sets are normalised by their own loaders (digits / 16, Fashion-MNIST and CIFAR-10 / 255);
user data (`from_arrays`, ``npz:<path>``, node-local files of `load_node_data`) is only
cast to float32 and checked to be finite. Partitions are computed on the labels alone.
"""

from __future__ import annotations

from dq_flower.harness.tasks.data.arrays import Dataset, from_arrays, save_npz
from dq_flower.harness.tasks.data.loaders import (
    load_dataset,
    load_dataset_cached,
    load_task_dataset,
    parse_idx,
    validation_view,
)
from dq_flower.harness.tasks.data.node_data import (
    NODE_DATA_CONFIG_KEY,
    NodeData,
    load_node_data,
    save_node_data,
)
from dq_flower.harness.tasks.data.partitions import load_partition, partition_indices

__all__ = ["NODE_DATA_CONFIG_KEY", "Dataset", "NodeData", "from_arrays", "load_dataset",
           "load_dataset_cached", "load_task_dataset", "validation_view", "load_node_data",
           "load_partition", "parse_idx", "partition_indices", "save_node_data", "save_npz"]
