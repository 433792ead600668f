"""A real deployment where one SuperNode's Python cannot import torch.

A TLS SuperLink with SuperNode authentication on 127.0.0.1, node 0 started with a
``sitecustomize`` on its ``PYTHONPATH`` that refuses any import of torch (in the SuperNode
and in every ClientApp process it starts), node 1 a normal node. Both bring their own data
file. A DQ run with the uniform scorer trains on both; a run with the ``gradnorm`` scorer
fails node 0's rounds with the knob named, and the run goes on with node 1. The fixture
stops every process it started by pid. About a minute and a half, hence ``slow``; the fast
version of the check is ``tests/edge/test_torch_free_client.py``.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from dq_flower.deploy.local import LocalDeployment
from dq_flower.harness.tasks.data import load_partition, save_node_data

APP_DIR = Path(__file__).resolve().parents[2]
EDGE_TESTS = APP_DIR / "tests" / "edge"
BUDGET = 64

SITECUSTOMIZE = """
import os, sys
sys.path.insert(0, {edge!r})
import torch_blocker
torch_blocker.install()
with open(os.environ["DQ_TORCH_BLOCK_MARK"], "a") as f:
    f.write(f"{{os.getpid()}} {{' '.join(sys.argv)[:200]}}\\n")
"""

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mixed_deployment(tmp_path_factory):
    root = tmp_path_factory.mktemp("torch-free")
    files = []
    for k in range(2):
        x, y, _ = load_partition("digits", k, 2, "iid", 0.5, 0, None)
        files.append(save_node_data(root / f"device-{k}" / "local.npz",
                                    x.reshape(-1, 1, 8, 8), y))
    blocker = root / "no-torch"
    blocker.mkdir()
    (blocker / "sitecustomize.py").write_text(SITECUSTOMIZE.format(edge=str(EDGE_TESTS)))
    mark, log = root / "blocker-active.txt", root / "blocked-imports.txt"
    path = os.pathsep.join(p for p in (str(blocker), os.environ.get("PYTHONPATH", "")) if p)
    env = {"PYTHONPATH": path, "DQ_TORCH_BLOCK_MARK": str(mark), "DQ_TORCH_BLOCK_LOG": str(log)}
    with LocalDeployment(root / "deployment", num_nodes=2, tls=True, supernode_auth=True,
                         data_files=files, node_env={0: env}) as dep:
        yield dep, mark, log
    assert dep.superlink is not None and dep.superlink.poll() is not None
    assert all(p.poll() is not None for p in dep.supernodes)


def test_a_supernode_without_torch_trains_with_dq_next_to_a_normal_one(mixed_deployment):
    dep, mark, log = mixed_deployment
    results = dep.workdir / "uniform.json"
    # the fixed schedule: every node sends its budget every round (2 x 2 x BUDGET rows)
    dep.run(APP_DIR, {"num-server-rounds": 2, "budget": BUDGET, "model": "logreg",
                      "scorer": "uniform", "upload-schedule": "fixed",
                      "results-path": str(results)},
            timeout=300)
    history = json.loads(results.read_text())["history"]
    print(f"\naccuracy by round {[r['accuracy'] for r in history]}; "
          f"stored {history[-1]['stored']}")
    for row in history[1:]:
        assert (row["replies"], row["rejected"], row["failed"]) == (2, 0, 0), row
    assert history[-1]["stored"] == 2 * 2 * BUDGET
    assert history[-1]["accuracy"] > history[0]["accuracy"] + 0.2, history
    # the blocker ran in node 0's SuperNode and in the ClientApp processes it started
    started = mark.read_text().splitlines()
    assert any("flower-supernode" in line for line in started), started
    assert any("flwr-clientapp" in line for line in started), started
    assert not log.exists(), log.read_text()  # nothing there even tried to import torch


def test_a_model_knob_fails_only_the_torch_free_node_and_the_run_says_why(mixed_deployment):
    dep, _, _ = mixed_deployment
    results = dep.workdir / "gradnorm.json"
    # the fixed schedule scores with the model from round 1 (the adaptive one starts uniform)
    dep.run(APP_DIR, {"num-server-rounds": 1, "budget": BUDGET, "model": "logreg",
                      "scorer": "gradnorm", "upload-schedule": "fixed",
                      "results-path": str(results)}, timeout=300)
    row = json.loads(results.read_text())["history"][1]
    assert (row["replies"], row["failed"]) == (1, 1), row
    assert row["stored"] == BUDGET  # node 1's samples, scored with the model
    text = (dep.logs / "flwr-run.log").read_text()
    assert "scorer='gradnorm' needs PyTorch" in text, text[-3000:]
    assert "pip install" in text
    # docs/deploy.md shows this run's lines about the failed reply (node ids aside)
    page = (APP_DIR / "docs" / "deploy.md").read_text()
    shown = page[page.index("which checks these lines"):].split("```")[1]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    for line in shown.strip().splitlines()[1:4]:  # after the block's language
        pattern = re.escape(re.sub(r"node \d+", "node NODE", line)).replace("NODE", r"\d+")
        assert re.search(pattern, plain), (line, plain[-3000:])
