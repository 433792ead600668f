"""A DQ client without PyTorch: its side of a round runs where any import of torch raises.

Each test starts the package's ClientApp in a subprocess whose ``sys.meta_path`` refuses
torch (``client_worker.py --block-torch``), gives it its own ``data-file`` as an edge
device has, and runs the real server loop (``run_server`` with ``DQStrategy``) against it
through the in-process grid, next to a normal in-process node. Every worker is stopped by
its pid when its test ends.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.tasks.data import load_partition, save_node_data
from dq_flower.server.common import ClientFailureError
from tests.edge.helpers import SubprocessClient

BUDGET = 48
ROUNDS = 2
EDGE = NODE_ID_BASE  # node 0 has no PyTorch; node 1 is a normal in-process node


def _edge_file(tmp_path):
    """Node 0's partition of digits (2 partitions) as the device's own ``.npz`` file."""
    x, y, _ = load_partition("digits", 0, 2, "iid", 0.5, 0, None)
    x = x.reshape(-1, 1, 8, 8)  # the sample shape the named task uses
    return save_node_data(tmp_path / "edge" / "local.npz", x, y), len(y)


def _grid(edge: SubprocessClient, data_file, num_nodes=2) -> InProcessGrid:
    def route(msg, context):
        return edge(msg, context) if context.node_id == EDGE else client_app(msg, context)

    grid = InProcessGrid(route, num_nodes)
    grid.contexts[EDGE].node_config["data-file"] = str(data_file)
    return grid


def test_a_dq_data_round_runs_on_a_node_that_cannot_import_torch(tmp_path):
    data_file, n_edge = _edge_file(tmp_path)
    log = tmp_path / "blocked.txt"
    run_config = build_run_config("dq", dataset="digits", model="logreg", num_clients=2,
                                  rounds=ROUNDS, budget=BUDGET, bits=2, scorer="uniform",
                                  entropy_coder="zlib", upload_schedule="fixed")
    with SubprocessClient(block_torch=True, block_log=log) as edge:
        result = run_server(_grid(edge, data_file), run_config)
        statuses = list(edge.statuses)
    assert "torch" in sys.modules  # this (server) process has it; the worker never did
    assert len(statuses) == ROUNDS
    assert not any(s["torch"] for s in statuses), statuses
    assert not log.exists(), log.read_text()  # nothing even tried to import torch
    history = result.history
    for row in history[1:]:
        assert (row["replies"], row["rejected"], row["failed"]) == (2, 0, 0), row
        assert row["selected"] == 2 * BUDGET
    # the server stores both nodes' samples, the torch-free node's included
    assert history[-1]["stored"] == 2 * ROUNDS * BUDGET
    assert n_edge > ROUNDS * BUDGET
    assert history[-1]["accuracy"] > history[0]["accuracy"] + 0.2, history


def test_numpy_and_dict_sample_data_need_no_torch(tmp_path):
    # dq_train itself, on numpy arrays and on a data set of numpy items, with torch blocked
    import subprocess

    from tests.edge.helpers import HERE, REPO

    code = f"""
import sys
sys.path.insert(0, {str(HERE)!r})
import torch_blocker
torch_blocker.install()
import numpy as np
from dq_flower.data_input import as_arrays
x = np.arange(24, dtype=np.float32).reshape(6, 4)
y = np.array([0, 1, 2, 0, 1, 2])
class Items:
    def __len__(self):
        return 6
    def __getitem__(self, i):
        return x[i], y[i]
for data in ((x, y), Items()):
    xa, ya = as_arrays(data)
    assert xa.shape == (6, 4) and ya.tolist() == y.tolist()
try:
    as_arrays(object())
except TypeError as exc:
    print("refused:", exc)
import dq_flower.client
try:
    dq_flower.client.gradient_train
except ImportError as exc:
    print("gradient_train:", exc)
print("torch loaded:", "torch" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=str(REPO), timeout=120, check=True).stdout
    assert "refused: data must be numpy arrays" in out
    assert "gradient_train: gradient_train (the compressed-gradient baselines) needs " \
           "PyTorch" in out
    assert "torch loaded: False" in out


def test_a_model_knob_fails_the_torch_free_node_and_the_round_goes_on(tmp_path, caplog):
    data_file, _ = _edge_file(tmp_path)
    run_config = build_run_config("dq", dataset="digits", model="logreg", num_clients=2,
                                  rounds=ROUNDS, budget=BUDGET, scorer="gradnorm",
                                  upload_schedule="fixed")
    with SubprocessClient(block_torch=True) as edge:
        result = run_server(_grid(edge, data_file), run_config)
        statuses = list(edge.statuses)
    assert len(statuses) == ROUNDS and not any(s["torch"] for s in statuses)
    # the normal node trains; the torch-free node's failed reply is counted and logged
    for row in result.history[1:]:
        assert (row["replies"], row["failed"]) == (1, 1), row
    assert result.history[-1]["stored"] == ROUNDS * BUDGET
    failures = [r.getMessage() for r in caplog.records if "failed:" in r.getMessage()]
    assert len(failures) == ROUNDS, failures
    assert all(f"node {EDGE} (partition" in f and "scorer='gradnorm' needs PyTorch" in f
               for f in failures), failures


@pytest.mark.parametrize("knob, words", [
    ({"compensation": "qsgd"}, "compensation='qsgd' needs PyTorch"),
    ({"upload_mode": "gradient"}, "upload-mode (a gradient round) needs PyTorch"),
])
def test_a_run_whose_only_node_lacks_torch_stops_naming_the_knob(tmp_path, knob, words):
    data_file, _ = _edge_file(tmp_path)
    run_config = build_run_config("dq", dataset="digits", model="logreg", num_clients=1,
                                  rounds=ROUNDS, budget=BUDGET, max_failed_rounds=1, **knob)
    with SubprocessClient(block_torch=True) as edge, \
            pytest.raises(ClientFailureError) as info:
        run_server(_grid(edge, data_file, num_nodes=1), run_config)
    message = str(info.value)
    assert words in message and "pip install" in message, message
    assert "upload-mode='data'" in message  # what this node can use instead


def test_fp16_without_torch_gives_torch_bits():
    import torch

    from dq_flower.codecs import model as floats

    rng = np.random.default_rng(3)
    x = np.concatenate([rng.standard_normal(20_000) * 10.0 ** rng.integers(-9, 5, 20_000),
                        [0.0, -0.0, 65504.0, -65504.0, 6e-8, 3e-8, 1e-10]]).astype(np.float32)
    half = x.astype(np.float16)  # the cast a node without torch makes
    assert np.array_equal(half.view(np.uint16),
                          torch.from_numpy(x).half().numpy().view(np.uint16))
    assert np.array_equal(floats._to_half(x).view(np.uint16), half.view(np.uint16))


def test_compression_mod_codes_a_numpy_apps_update_on_a_node_that_cannot_import_torch():
    # Prepare: Flower's FedAvg inside CompressedUpdates, one node without PyTorch whose own
    # train() moves each weight a tenth of the way to 1; fp16 (near-exact), then 2-bit QSGD
    from flwr.app import Array, ArrayRecord, ConfigRecord
    from flwr.serverapp.strategy import FedAvg

    import dq_flower
    from tests.edge import numpy_mod_app

    rng = np.random.default_rng(0)
    start = {"w": rng.standard_normal((20, 30)).astype(np.float32),
             "b": np.zeros(30, np.float32)}
    want = {k: v + 0.19 * (numpy_mod_app.TARGET - v) for k, v in start.items()}  # 2 rounds
    coords = sum(v.size for v in start.values())
    bits = {}
    with SubprocessClient(block_torch=True, app="tests.edge.numpy_mod_app:app") as edge:
        for codec in ("fp16", "qsgd"):
            strategy = dq_flower.CompressedUpdates(
                FedAvg(fraction_evaluate=0.0, min_available_nodes=1, min_train_nodes=1),
                codec=codec)
            # Execute
            result = strategy.start(
                grid=InProcessGrid(edge, 1), num_rounds=2, train_config=ConfigRecord({}),
                initial_arrays=ArrayRecord({k: Array(v) for k, v in start.items()}))
            got = dict(zip(start, result.arrays.to_numpy_ndarrays(), strict=True))
            bits[codec] = sum(float(m["up-payload-bits"])
                              for m in result.evaluate_metrics_serverapp.values())
            if codec == "fp16":  # FedAvg aggregated the update the mod coded, decoded
                for name in start:
                    np.testing.assert_allclose(got[name], want[name], atol=2e-3)
            else:
                assert all(np.isfinite(v).all() for v in got.values())
        # Assert: the worker never had torch; QSGD sent about 2 bits a coordinate
        assert len(edge.statuses) == 4 and not any(s["torch"] for s in edge.statuses)
    assert bits["qsgd"] < 2.2 * 2 * coords < bits["fp16"]
