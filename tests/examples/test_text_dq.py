"""The example app in ``examples/text-dq``: in-process, and with ``flwr run``.

The app's devices hold Jane Austen's novels (Debian's ``r-cran-janeaustenr``); here they
hold six short novels written in the same R database format (``tests/text/austen_files.py``)
and the app reads them through its ``data-dir`` key, so the tests need no Debian package.
The fast test calls the app's ``ServerApp`` on an in-process grid whose nodes run its
``ClientApp`` (a few seconds) and checks that it prints the lines the README shows, numbers
aside; the slow ones are ``flwr run`` against a simulation SuperLink started and stopped
here by its pid (about a minute), and the run the README shows, at the app's defaults on
the Debian package's novels, in-process (about 4 minutes on one core), whose output must be
the README's, line for line.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import pytest
from flwr.app import Context, RecordDict

from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.tasks.data.austen import DEFAULT_AUSTEN_DIR, NOVELS, load_austen
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


def readme_output() -> list[str]:
    """The lines the README's "What you get" shows: its one ``text`` block there."""
    section = (APP_DIR / "README.md").read_text().split("## What you get", 1)[1]
    blocks = re.findall(r"^```\w*\n(.*?)^```$", section.split("\n## ", 1)[0], re.M | re.S)
    assert len(blocks) == 1, blocks
    return blocks[0].strip().splitlines()


def printed(output: str) -> list[str]:
    """The ServerApp's closing lines in ``output``: from the held-out windows on."""
    lines = [line.strip() for line in output.splitlines()]
    start = next(i for i, line in enumerate(lines) if line.endswith(" characters")
                 and "held-out windows" in line)
    end = next(i for i, line in enumerate(lines) if "windows stored; uplink" in line)
    return lines[start:end + 1]


def shape(line: str) -> str:
    return re.sub(r"\d+(\.\d+)?", "#", line)


def run_in_process(example, config: dict, nodes: int) -> None:
    _, client_app, server_app = example
    grid = InProcessGrid(client_app.app, nodes)
    for ctx in grid.contexts.values():  # a SuperNode's context carries the run config
        ctx.run_config = config
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(),
                      run_config=config)
    server_app.app(grid, context)


def test_docs_text_page_shows_the_readmes_output():
    page = (APP_DIR.parents[1] / "docs" / "text.md").read_text()
    section = page.split("## A Flower app to copy: `examples/text-dq`", 1)[1].split("\n## ")[0]
    blocks = re.findall(r"^```text\n(.*?)^```$", section, re.M | re.S)
    assert [b.strip().splitlines() for b in blocks] == [readme_output()]


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


def test_the_readmes_run_config_example_names_the_apps_keys():
    from flwr.common.config import parse_config_args

    readme = (APP_DIR / "README.md").read_text()
    examples = re.findall(r'--run-config "([^"]+)"', readme)
    assert examples
    for example in examples:
        assert set(parse_config_args([example])) <= set(app_config()), example


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


def test_server_and_client_apps_in_process(example, small_db, tmp_path, capsys):
    config = {**app_config(), **SMALL, "data-dir": str(small_db),
              "output-dir": str(tmp_path / "out")}
    run_in_process(example, config, 3)
    check_results(tmp_path / "out", small_db, 3)
    # the lines the README shows, numbers aside (its run has one round more)
    assert ({shape(line) for line in printed(capsys.readouterr().out)}
            == {shape(line) for line in readme_output()})


@pytest.mark.slow  # about 4 minutes on one core: 300 server steps of the char transformer
@pytest.mark.skipif(not Path(DEFAULT_AUSTEN_DIR).is_dir(),
                    reason="the README's run reads Debian's r-cran-janeaustenr")
def test_the_readmes_run_prints_what_the_readme_shows(example, capsys):
    # the app at its defaults on 6 nodes, in-process: the same numbers as flwr run
    run_in_process(example, app_config(), 6)
    assert printed(capsys.readouterr().out) == readme_output()


@pytest.mark.slow  # about a minute: Flower's SuperLink, Ray and 2 simulated SuperNodes
def test_flwr_run_text_dq_in_simulation(small_db, tmp_path):
    out = tmp_path / "out"
    run_config = " ".join(f"{k}={v}" for k, v in SMALL.items())
    output = flwr_run_in_simulation(
        APP_DIR, tmp_path, 2, f"{run_config} data-dir='{small_db}' output-dir='{out}'")
    assert "held-out perplexity" in output and "windows stored" in output, output
    check_results(out, small_db, 2)
