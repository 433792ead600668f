"""HAPT sensor windows from a node that cannot import PyTorch, under DQ.

The edge device holds one person's 2.56 s windows ``(n, 6, 128)`` of a HAPT file in the
packaged format (written by ``tests/harness/tasks/hapt_files.py``) as its own
``data-file``; the package's ClientApp serves it in a subprocess whose imports of torch
raise (``client_worker.py --block-torch``), next to a normal in-process node holding the
other training person. The server runs DQ with the ``cnn1d`` model on the ``hapt`` task.
"""

from __future__ import annotations

import numpy as np

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.tasks.data import load_partition, save_node_data
from dq_flower.harness.tasks.data.hapt import HAPT_FILE
from tests.edge.helpers import SubprocessClient
from tests.harness.tasks.hapt_files import synthetic_persons, write_hapt_pickle

BUDGET = 16
ROUNDS = 2
EDGE = NODE_ID_BASE  # node 0 has no PyTorch; node 1 is a normal in-process node


def test_a_node_without_torch_uploads_its_hapt_windows_under_dq(tmp_path):
    data_dir = tmp_path / "hapt"
    write_hapt_pickle(data_dir / HAPT_FILE, synthetic_persons((1, 2, 3), seed=1,
                                                              recordings=3))
    # person 1's windows (the natural partition's node 0) as the device's own file
    x, y, _ = load_partition("hapt", 0, 2, "natural", data_dir=str(data_dir))
    windows = x.reshape(-1, 6, 128)
    data_file = save_node_data(tmp_path / "edge" / "local.npz", windows, y)
    run_config = build_run_config("dq", dataset="hapt", model="cnn1d", num_clients=2,
                                  rounds=ROUNDS, partition="natural", data_dir=str(data_dir),
                                  budget=BUDGET, scorer="uniform", upload_schedule="fixed")
    log = tmp_path / "blocked.txt"
    with SubprocessClient(block_torch=True, block_log=log) as edge:
        def route(msg, context):
            return edge(msg, context) if context.node_id == EDGE else client_app(msg, context)

        grid = InProcessGrid(route, 2)
        grid.contexts[EDGE].node_config["data-file"] = str(data_file)
        history = run_server(grid, run_config).history
        statuses = list(edge.statuses)
    assert len(statuses) == ROUNDS and not any(s["torch"] for s in statuses), statuses
    assert not log.exists(), log.read_text()  # nothing even tried to import torch
    for row in history[1:]:
        assert (row["replies"], row["rejected"], row["failed"]) == (2, 0, 0), row
        assert row["selected"] == 2 * BUDGET
    assert history[-1]["stored"] == 2 * ROUNDS * BUDGET and len(y) > ROUNDS * BUDGET
    # a 2-bit window of 768 values (bits auto), coded by the context model: well under its
    # 192 B, and no reference rows beside them (16 rows of 8 bits a node cost more than half
    # the windows received before them; sent, they were 530 B a window stored)
    per_window = history[-1]["up_bytes"] / history[-1]["stored"]
    assert per_window < 192, per_window
    assert np.isfinite(history[-1]["accuracy"])
