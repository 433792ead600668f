"""The example app in ``examples/text-dq``: in-process, and with ``flwr run``.

The app's devices hold Jane Austen's novels (Debian's ``r-cran-janeaustenr``); here they
hold six short novels written in the same R database format (``tests/text/austen_files.py``)
and the app reads them through its ``data-dir`` key, so the tests need no Debian package.
The fast test calls the app's ``ServerApp`` on an in-process grid whose nodes run its
``ClientApp`` (a few seconds); the slow one is ``flwr run`` against a simulation SuperLink
started and stopped here by its pid (about a minute).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.tasks.data.austen import NOVELS, load_austen
from dq_flower.text_input import token_windows

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

pytest.importorskip("rdata")
from tests.examples.flwr_simulation import flwr_run_in_simulation  # noqa: E402
from tests.text.austen_files import write_db  # noqa: E402  (needs rdata)

APP_DIR = Path(__file__).resolve().parents[2] / "examples" / "text-dq"
ROUNDS = 2
#: a run small enough for the tests: windows of 32 characters, a few server steps
SMALL = {"window": 32, "chars-per-device": 0, "held-out-windows": 4, "max-server-steps": 40,
         "num-server-rounds": ROUNDS}


def app_config() -> dict:
    """The run config of ``[tool.flwr.app.config]`` in the example's pyproject.toml."""
    with (APP_DIR / "pyproject.toml").open("rb") as f:
        return dict(tomllib.load(f)["tool"]["flwr"]["app"]["config"])


WORDS = ("a", "truth", "universally", "acknowledged", "that", "single", "man", "in",
         "possession", "of", "good", "fortune", "must", "want", "wife", "Elizabeth", "Darcy",
         "walked", "to", "the", "village", "before", "ball", "and", "her", "sister", "Jane",
         "said", "nothing", "more", "it")


def novel(name: str, chapters: int) -> list[str]:
    """A short novel: chapters of seeded random sentences (no window repeats another)."""
    rng = np.random.default_rng(len(name) * 100 + chapters)
    lines = [name.upper(), ""]
    for k in range(1, chapters + 1):
        words = rng.choice(WORDS, size=40)
        lines += [f"Chapter {k}", "", " ".join(words).capitalize() + ".", ""]
    return lines


@pytest.fixture
def small_db(tmp_path: Path) -> Path:
    return write_db(tmp_path / "db", {n: novel(n, 6 + k) for k, n in enumerate(NOVELS)})


@pytest.fixture
def example(monkeypatch):
    """The example's modules, importable as a user's ``flwr run`` would import them."""
    monkeypatch.syspath_prepend(str(APP_DIR))
    from text_dq import client_app, server_app, task

    return task, client_app, server_app


def check_results(out: Path, db: Path, nodes: int) -> dict:
    results = json.loads((out / "results.json").read_text())
    ppl = results["perplexity"]
    assert sorted(ppl, key=int) == [str(r) for r in range(ROUNDS + 1)]
    assert ppl["0"] > 50  # an untrained model over 101 ids
    assert ppl[str(ROUNDS)] < 0.5 * ppl["0"], ppl
    # the first ask takes every window; the nodes' text is stored once, and coded
    # losslessly it takes fewer bytes, every message counted, than the text itself
    fed = load_austen(db, seed=0)
    # a node's novels are joined and cut into windows, a last short part left out
    windows = sum(sum(len(d.train) for d in fed.devices[k::nodes]) // SMALL["window"]
                  for k in range(nodes))
    text = sum(len(d.train.encode()) for d in fed.devices)
    assert results["stored"] == windows
    assert 0 < results["up_bytes"]["1"] < text, results["up_bytes"]
    assert (out / "final_model.pt").stat().st_size > 0
    return results


def test_pyproject_declares_the_app():
    with (APP_DIR / "pyproject.toml").open("rb") as f:
        project = tomllib.load(f)
    assert "dq-flower" in project["project"]["dependencies"]
    assert project["tool"]["flwr"]["app"]["components"] == {
        "serverapp": "text_dq.server_app:app",
        "clientapp": "text_dq.client_app:app",
    }
    assert "federations" not in project["tool"]["flwr"]  # flwr run would rewrite the file
    assert app_config()["window"] == 128 and app_config()["data-dir"] == ""


def test_nodes_hold_their_novels_as_datasets_of_strings(example, small_db):
    task, _, _ = example
    fed = load_austen(small_db, seed=0)
    parts = [task.load_device_text(k, 4, 0, str(small_db)) for k in range(4)]
    assert [len(p) for p in parts] == [2, 2, 1, 1]  # six novels dealt round-robin
    assert parts[1]["text"] == [fed.devices[1].train, fed.devices[5].train]
    assert task.load_device_text(0, 4, 50, str(small_db))["text"][0] == fed.devices[0].train[:50]
    with pytest.raises(ValueError, match="chapters-per-device"):
        task.load_device_text(0, 7, 0, str(small_db))
    tokenizer = task.CharTokenizer()
    assert len(tokenizer) == 101 and tokenizer.encode("a£") == [10, 100]
    windows, vocab = token_windows(parts[0], 32, tokenizer=tokenizer)
    assert vocab == 101 and windows.shape[1] == 32
    held = task.held_out_windows(32, 4, str(small_db))
    assert held.shape[1] == 32 and 6 <= len(held) <= 24
    assert task.Net(32)(held[:3]).shape == (3, 32, 101)


def test_server_and_client_apps_in_process(example, small_db, tmp_path):
    _, client_app, server_app = example
    config = {**app_config(), **SMALL, "data-dir": str(small_db),
              "output-dir": str(tmp_path / "out")}
    grid = InProcessGrid(client_app.app, 3)
    for ctx in grid.contexts.values():  # a SuperNode's context carries the run config
        ctx.run_config = config
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(grid, context)
    check_results(tmp_path / "out", small_db, 3)


@pytest.mark.slow  # about a minute: Flower's SuperLink, Ray and 2 simulated SuperNodes
def test_flwr_run_text_dq_in_simulation(small_db, tmp_path):
    out = tmp_path / "out"
    run_config = " ".join(f"{k}={v}" for k, v in SMALL.items())
    output = flwr_run_in_simulation(
        APP_DIR, tmp_path, 2, f"{run_config} data-dir='{small_db}' output-dir='{out}'")
    assert "held-out perplexity" in output and "windows stored" in output, output
    check_results(out, small_db, 2)
