"""``examples/resume.py``: each strategy resumes from its ``state_dict`` in a fresh ServerApp.

The example runs on the in-process grid (Flower's ``run_simulation`` without Ray, as
``tests/test_docs.py`` runs it); docs/plugin.md shows it and its output.
"""

from __future__ import annotations

import contextlib
import io
import re
import runpy
from pathlib import Path

import flwr.simulation
import numpy as np
import pytest
import torch
from flwr.app import Context, RecordDict

from dq_flower.harness.inprocess import InProcessGrid

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "resume.py"


def _run_simulation_inprocess(server_app, client_app, num_supernodes, **_ignored):
    context = Context(run_id=1, node_id=1, node_config={}, state=RecordDict(), run_config={})
    server_app(InProcessGrid(client_app, num_supernodes), context)


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example run once: its module namespace, its output and its folder."""
    folder = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(folder)
        mp.setattr(flwr.simulation, "run_simulation", _run_simulation_inprocess)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            namespace = runpy.run_path(str(EXAMPLE), run_name="__main__")
    return namespace, out.getvalue(), folder


@pytest.mark.parametrize("kind", ["dq", "gradient", "compressed"])
def test_the_resumed_run_continues_from_round_2(example, kind):
    _, out, folder = example
    rounds = [int(r) for r in re.findall(rf"^{kind}: round (\d+),", out, re.M)]
    assert rounds == [1, 2, 3]
    assert f"{kind}: resumed after round 2" in out
    assert torch.load(folder / "resume-checkpoints" / f"{kind}.pt",
                      weights_only=False)["round"] == 3


def test_the_resumed_dq_server_holds_the_store_it_saved(example):
    _, out, _ = example
    stored = dict(re.findall(r"^dq: (round 2|resumed after round 2), .*?(\d+) samples", out,
                             re.M))
    assert stored["resumed after round 2"] == stored["round 2"] != "0"


def _flat(state, prefix=""):
    """Nested state as (path, numpy array) pairs, for an exact comparison."""
    if isinstance(state, dict):
        return [p for k in sorted(state, key=str) for p in _flat(state[k], f"{prefix}/{k}")]
    if isinstance(state, (list, tuple)):
        return [p for i, v in enumerate(state) for p in _flat(v, f"{prefix}/{i}")]
    value = state.numpy() if isinstance(state, torch.Tensor) else state
    return [(prefix, np.asarray(value) if isinstance(value, np.ndarray) else value)]


@pytest.mark.parametrize("kind", ["dq", "gradient", "compressed"])
def test_a_fresh_strategy_loads_the_checkpoint_whole(example, kind):
    namespace, _, folder = example
    saved = torch.load(folder / "resume-checkpoints" / f"{kind}.pt", weights_only=False)
    strategy = namespace["make_strategy"](kind, namespace["Net"]())
    strategy.load_state_dict(saved["strategy"])
    again = _flat(strategy.state_dict())
    assert [p for p, _ in again] == [p for p, _ in _flat(saved["strategy"])]
    for (path, a), (_, b) in zip(again, _flat(saved["strategy"]), strict=True):
        if isinstance(a, np.ndarray):
            np.testing.assert_array_equal(a, b, err_msg=path)
        else:
            assert a == b, path
