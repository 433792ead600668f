"""Flower's PyTorch quickstart (offline, on digits) and its DQ and compressed-update twins.

``examples/quickstart-pytorch`` is laid out as Flower's own quickstart: its ``Net``,
``train()``, ``test()``, a loader of dict samples (a flwr-datasets partition of a Hugging
Face data set with ``with_transform``), knobs in its pyproject. Its twins change a few lines:
``quickstart-pytorch-dq`` (data quantization) and ``quickstart-pytorch-compressed`` (its own
``train()`` kept, the update coded by ``compression_mod``). The fast tests count those lines
and run each app in process; the slow one runs all three with ``flwr run`` in simulation.
"""

from __future__ import annotations

import difflib
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import tomllib
from flwr.app import Context, RecordDict

import dq_flower
from dq_flower.deploy.flower_cli import flower_env, flower_executable
from dq_flower.deploy.supervisor import free_port, start_process, wait_for_port
from dq_flower.harness.inprocess import InProcessGrid

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BASE = EXAMPLES / "quickstart-pytorch"
TWINS = {"dq": EXAMPLES / "quickstart-pytorch-dq",
         "compressed": EXAMPLES / "quickstart-pytorch-compressed"}
CODE = ["pytorchexample/client_app.py", "pytorchexample/server_app.py",
        "pytorchexample/task.py"]


def code_lines(path: Path) -> list[str]:
    """The file's lines without comments and blank lines."""
    out = []
    for line in path.read_text().splitlines():
        code = line.split("  # ")[0].rstrip() if not line.lstrip().startswith("#") else ""
        if code.strip():
            out.append(code)
    return out


def changed_lines(a: list[str], b: list[str]) -> tuple[int, int, int]:
    """(changed, added, removed): a replaced line counts once in ``changed``."""
    changed = added = removed = 0
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if op != "equal":
            changed += max(i2 - i1, j2 - j1)
            added += j2 - j1
            removed += i2 - i1
    return changed, added, removed


def twin_diff(name: str) -> tuple[int, int, int]:
    totals = [0, 0, 0]
    for rel in CODE:
        for k, v in enumerate(changed_lines(code_lines(BASE / rel), code_lines(TWINS[name] / rel))):
            totals[k] += v
    return totals[0], totals[1], totals[2]


def test_moving_to_dq_changes_at_most_10_lines():
    changed, added, removed = twin_diff("dq")
    assert added + removed <= 10, (changed, added, removed)


def test_moving_to_compressed_updates_changes_at_most_4_lines_and_keeps_train():
    changed, added, removed = twin_diff("compressed")
    assert changed <= 4 and removed <= 1, (changed, added, removed)
    base = (BASE / "pytorchexample/task.py").read_text()
    assert (TWINS["compressed"] / "pytorchexample/task.py").read_text() == base
    body = code_lines(BASE / "pytorchexample/client_app.py")
    twin = code_lines(TWINS["compressed"] / "pytorchexample/client_app.py")
    start = body.index("def train(msg: Message, context: Context):")
    assert twin[twin.index(body[start]):][:25] == body[start:start + 25]


def _readme_diff_blocks(readme: Path) -> list[list[str]]:
    blocks, current = [], None
    for line in readme.read_text().splitlines():
        if line == "```diff":
            current = []
        elif line == "```" and current is not None:
            blocks.append(current)
            current = None
        elif current is not None:
            current.append(line)
    return blocks


@pytest.mark.parametrize("readme", [EXAMPLES / "quickstart-dq/README.md"])
def test_a_readmes_diff_against_flowers_quickstart_is_made_of_the_apps_real_lines(readme):
    # every +/- line of a `--- base / +++ twin` block is a line of that file, in that app
    checked = 0
    for block in _readme_diff_blocks(readme):
        old = new = None
        for line in block:
            if line.startswith("--- "):
                old = EXAMPLES / line[4:]
            elif line.startswith("+++ "):
                new = EXAMPLES / line[4:]
            elif line[:1] in "+-" and old is not None and new is not None:
                source = new if line[0] == "+" else old
                assert line[1:] in source.read_text().splitlines(), (source, line)
                checked += 1
    assert checked >= 10


def test_the_counter_counts():
    assert changed_lines(["a", "b", "c"], ["a", "x", "c", "d"]) == (2, 2, 1)
    assert code_lines(BASE / "pytorchexample/__init__.py") == [
        '"""pytorchexample: A Flower / PyTorch app."""']


def run_in_process(app_dir: Path, tmp_path: Path, monkeypatch, rounds: int = 3):
    """The app's ServerApp on an in-process grid of 4 nodes running its ClientApp."""
    for mod in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
        del sys.modules[mod]
    monkeypatch.syspath_prepend(str(app_dir))
    tmp_path.mkdir(parents=True, exist_ok=True)
    monkeypatch.chdir(tmp_path)  # final_model.pt is written to the working directory
    from pytorchexample import client_app, server_app

    with (app_dir / "pyproject.toml").open("rb") as f:
        config = dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])
    config["num-server-rounds"] = rounds
    nodes = InProcessGrid(client_app.app, 4)
    for ctx in nodes.contexts.values():  # the run config reaches every node, as in Flower
        ctx.run_config = config
    grid = dq_flower.MeasuredGrid(nodes)
    results = {}
    original = server_app.global_evaluate

    def spy(server_round, arrays):
        out = original(server_round, arrays)
        results[server_round] = dict(out)
        return out

    monkeypatch.setattr(server_app, "global_evaluate", spy)
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(grid, context)
    for mod in [m for m in sys.modules if m.split(".")[0] == "pytorchexample"]:
        del sys.modules[mod]
    assert (tmp_path / "final_model.pt").exists()
    return grid, results


def test_the_three_apps_run_in_process(tmp_path, monkeypatch):
    base_grid, base = run_in_process(BASE, tmp_path / "base", monkeypatch)
    cu_grid, cu = run_in_process(TWINS["compressed"], tmp_path / "cu", monkeypatch)
    dq_grid, dq = run_in_process(TWINS["dq"], tmp_path / "dq", monkeypatch)
    # 3 rounds of 1 epoch: measured 0.49 (FedAvg), 0.47 (2-bit QSGD updates), 0.89 (DQ)
    assert base[3]["accuracy"] > base[0]["accuracy"] + 0.2
    assert cu[3]["accuracy"] > cu[0]["accuracy"] + 0.2
    assert base_grid.up_bytes >= 8 * cu_grid.up_bytes
    assert dq[3]["accuracy"] > 0.5 and dq_grid.up_bytes < base_grid.up_bytes
    # DQ at its defaults: within 2 points of FedAvg's accuracy with at most a fifth of its
    # uplink, on the same app and rounds
    assert dq[3]["accuracy"] >= base[3]["accuracy"] - 0.02
    assert 5 * dq_grid.up_bytes <= base_grid.up_bytes
    print(f"fedavg {base[3]['accuracy']:.3f} {base_grid.up_bytes} B; dq {dq[3]['accuracy']:.3f} "
          f"{dq_grid.up_bytes} B; compressed {cu[3]['accuracy']:.3f} {cu_grid.up_bytes} B")


@pytest.mark.slow
def test_flwr_run_the_three_apps_in_simulation(tmp_path):
    ray_tmp = Path(tempfile.mkdtemp(prefix="dq-ray-"))
    env = flower_env(flwr_home=tmp_path / "flwr-home", ray_tmpdir=ray_tmp)
    port = free_port()
    (tmp_path / "flwr-home").mkdir()
    (tmp_path / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    superlink = start_process(
        [flower_executable("flower-superlink"), "--simulation", "--insecure",
         "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
         "--port", str(port)],
        log_path=tmp_path / "superlink.log", env=env, cwd=tmp_path, name="superlink")
    outputs = {}
    try:
        wait_for_port("127.0.0.1", port, 60, superlink)
        for name, app_dir in {"base": BASE, **TWINS}.items():
            before = (app_dir / "pyproject.toml").read_bytes()
            done = subprocess.run(
                [flower_executable("flwr"), "run", ".", "sim",
                 "--federation-config", "num-supernodes=4", "--stream"],
                cwd=app_dir, env=env, capture_output=True, text=True, timeout=240,
                check=False)
            outputs[name] = done.stdout + done.stderr
            assert done.returncode == 0, outputs[name]
            assert (app_dir / "pyproject.toml").read_bytes() == before
        ls = subprocess.run([flower_executable("flwr"), "ls", "sim", "--format", "json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                            check=True)
        runs = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]
    finally:
        superlink.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert [r["status"] for r in runs] == ["finished:completed"] * 3, outputs
    for name, out in outputs.items():
        assert "configure_train: Sampled 4 nodes (out of 4)" in out, (name, out[-3000:])
        assert "aggregate_train: Received 4 results and 0 failures" in out, (name, out[-3000:])
    assert "compressed-updates" in outputs["compressed"]
