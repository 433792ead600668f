"""Kill the server with SIGKILL mid-run, resume from its checkpoint, end where an
uninterrupted run ends: the same history rows (bytes included), model and store.

The crash point is deterministic: the server process sends itself SIGKILL right after a
chosen round's history row, before that round's checkpoint is written, so the resumed run
replays the rounds after its last checkpoint (rounds its clients already served).
"""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dq_flower.harness.checkpoint import CHECKPOINT_NAME, load_latest, save_atomic
from tests.faults import server_process

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 8


def _run(workdir: Path, method: str, every: int, kill_after: int = 0) -> int:
    """Run tests/faults/server_process.py to its end (or its own SIGKILL); the exit code."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.faults.server_process", str(workdir), str(ROUNDS),
         method, str(every), str(kill_after)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        return proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def _rows(workdir: Path) -> list[dict]:
    """History rows without measured times (``*_s``; per-client entries keep their bytes)."""
    out = []
    for row in json.loads((workdir / "history.json").read_text()):
        kept = {k: v for k, v in row.items() if not k.endswith("_s") and k != "clients"}
        kept["clients"] = [entry[1:] for entry in row.get("clients", [])]
        out.append(kept)
    return out


def test_atomic_save_keeps_the_previous_checkpoint_when_writing_fails(tmp_path):
    save_atomic(tmp_path, {"round": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_atomic(tmp_path, {"round": 2, "bad": Unpicklable()})
    assert load_latest(tmp_path)["round"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


@pytest.mark.parametrize(("method", "every", "kill_after"), [
    ("dq", 1, 5),          # checkpoint of round 4: round 5 is replayed
    ("ef-signsgd", 1, 5),  # a baseline whose clients keep error-feedback state
])
def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path, method, every, kill_after):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    server_process.main(str(straight), ROUNDS, method, every)  # in this process

    assert _run(killed, method, every, kill_after) == -signal.SIGKILL
    assert not (killed / "history.json").exists()
    resumes_from = kill_after - 1 - (kill_after - 1) % every
    assert load_latest(killed / "ckpt")["round"] == resumes_from
    assert _run(killed, method, every) == 0  # resume

    rows, expected = _rows(killed), _rows(straight)
    assert [r["round"] for r in rows] == list(range(ROUNDS + 1))
    # every round's bytes (per direction, cumulative, per client) and payload bits, and
    # its accuracy and loss, exactly as in the uninterrupted run
    assert all(r["up_bytes"] > 0 and r["up_payload_bits"] > 0 for r in expected[1:])
    for got, want in zip(rows, expected, strict=True):
        assert got == want, f"round {want['round']}"
    np.testing.assert_array_equal(np.load(killed / "final.npy"), np.load(straight / "final.npy"))
    if method == "dq":
        assert (killed / "stored.txt").read_text() == (straight / "stored.txt").read_text()
    assert np.isfinite(np.load(killed / "final.npy")).all()


class _CrashError(Exception):
    pass


@pytest.mark.parametrize("method", ["dq", "ef-signsgd"])
def test_resume_from_an_older_checkpoint_with_error_feedback_state(tmp_path, method):
    # In process (the crash is an exception from the history callback after round 5,
    # before its checkpoint; checkpoints every 3 rounds): rounds 4 and 5 are replayed.
    # tests/faults/test_resume_state.py covers DQ without compensation, which passes.
    from dq_flower.harness.client_app import app as client_app
    from dq_flower.harness.inprocess import InProcessGrid
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config

    def config(name):
        return build_run_config(method, num_clients=3, rounds=6, seed=4,
                                checkpoint_dir=str(tmp_path / name), checkpoint_every=3,
                                **server_process.KNOBS[method])

    def crash_after_5(row):
        if row["round"] == 5:
            raise _CrashError

    straight = run_server(InProcessGrid(client_app, 3), config("straight"))
    grid = InProcessGrid(client_app, 3)  # the clients outlive the server
    with pytest.raises(_CrashError):
        run_server(grid, config("crashed"), on_round=crash_after_5)
    assert load_latest(tmp_path / "crashed")["round"] == 3
    resumed = run_server(grid, config("crashed"))
    assert len(resumed.history) == len(straight.history)
    for got, want in zip(resumed.history[1:], straight.history[1:], strict=True):
        assert (got["up_bytes"], got["up_payload_bits"], got["loss"]) == (
            want["up_bytes"], want["up_payload_bits"], want["loss"]), f"round {want['round']}"
