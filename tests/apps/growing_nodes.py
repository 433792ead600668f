"""A user's app: four nodes whose data grows every round, as a sensor stream's does.

scikit-learn's first 1,400 digits (8x8 pixels 0..16, the model scaling them itself), dealt
to four nodes in turn (350 each); by round ``r`` a node holds its first ``90 + 30 r`` rows
(120 in round 1, 300 in round 7), read again each round as the user's loader does. FedAvg
trains one epoch per round with SGD (lr 0.05, momentum 0.9, batch 32); the last 397
digits test.

Not one of the zoo's apps: it shows DQ go on asking for the rows a node gains after it has
sent all it held (``tests/apps/test_growing_nodes.py``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from tests.apps import one_class_nodes
from tests.apps.one_class_nodes import Net, local_train, test_set
from tests.apps.sample_weights import digits

__all__ = ["Net", "local_train", "test_set", "load_local_data", "rows_by"]

NAME = "growing-nodes"
NUM_NODES = 4
ROUNDS = 7
STREAM = True
available = one_class_nodes.available


def rows_by(server_round: int) -> int:
    """The rows each node holds in round ``server_round``."""
    return 90 + 30 * int(server_round)


def load_local_data(partition_id: int, server_round: int) -> DataLoader:
    x, y = (a[:1400][partition_id::NUM_NODES][:rows_by(server_round)] for a in digits())
    tensors = TensorDataset(*(torch.from_numpy(np.ascontiguousarray(a)) for a in (x, y)))
    return DataLoader(tensors, batch_size=32, shuffle=True,
                      generator=torch.Generator().manual_seed(partition_id))
