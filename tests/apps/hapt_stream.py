"""A user's app: ``hapt_cnn``'s persons as sensor streams, their windows arriving round by round.

The same 8 training persons, windows, 1-D CNN and test set as ``hapt_cnn``; each node's
windows keep their recording order (HAPT's two sessions of each person, each following the
same protocol of activities), and by round ``r`` of the app's 6 a node holds the first
``ceil(r n / 6)`` of its ``n`` windows: in round 1 only the protocol's first activities.
The user's loader reads what the phone has recorded so far each round. FedAvg trains one
epoch per round on it with SGD (lr 0.05, momentum 0.9, batch 32).
"""

from __future__ import annotations

import math

from tests.apps import hapt_cnn
from tests.apps.hapt_cnn import Net, PersonWindows, local_train, test_set

__all__ = ["Net", "local_train", "test_set", "load_local_data"]

NAME = "hapt-stream"
NUM_NODES = hapt_cnn.NUM_NODES
ROUNDS = 6
STREAM = True
available = hapt_cnn.available


def load_local_data(partition_id: int, server_round: int) -> PersonWindows:
    x, y = hapt_cnn.load_local_data(partition_id).x, hapt_cnn.load_local_data(partition_id).y
    held = math.ceil(min(int(server_round), ROUNDS) * len(y) / ROUNDS)
    return PersonWindows(x[:held], y[:held])
