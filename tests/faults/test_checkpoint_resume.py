"""Kill the server with SIGKILL mid-run, resume from its checkpoint, end where an
uninterrupted run ends."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from dq_flower.harness.checkpoint import CHECKPOINT_NAME, load_latest, save_atomic

ROOT = Path(__file__).resolve().parents[2]
ROUNDS = 12


def _start(workdir: Path) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.faults.server_process", str(workdir), str(ROUNDS)],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)


def test_atomic_save_keeps_the_previous_checkpoint_when_writing_fails(tmp_path):
    save_atomic(tmp_path, {"round": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        save_atomic(tmp_path, {"round": 2, "bad": Unpicklable()})
    assert load_latest(tmp_path)["round"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


def test_sigkill_then_resume_matches_uninterrupted_run(tmp_path):
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    proc = _start(straight)
    try:
        assert proc.wait(timeout=240) == 0
    finally:
        _stop(proc)

    proc = _start(killed)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:  # kill once a mid-run checkpoint exists
            state = load_latest(killed / "ckpt") if (killed / "ckpt" / CHECKPOINT_NAME).exists() \
                else None
            if state is not None and 3 <= state["round"] < ROUNDS - 2:
                break
            assert proc.poll() is None, "the run ended before it could be killed"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        killed_at = load_latest(killed / "ckpt")["round"]
        assert killed_at < ROUNDS
    finally:
        _stop(proc)

    proc = _start(killed)  # resume
    try:
        assert proc.wait(timeout=240) == 0
    finally:
        _stop(proc)

    final_straight = np.load(straight / "final.npy")
    final_resumed = np.load(killed / "final.npy")
    np.testing.assert_allclose(final_resumed, final_straight, rtol=1e-5, atol=1e-6)
    assert (killed / "stored.txt").read_text() == (straight / "stored.txt").read_text()
    history = load_latest(killed / "ckpt")["history"]
    assert [r["round"] for r in history] == list(range(ROUNDS + 1))
    assert torch.isfinite(torch.from_numpy(final_resumed)).all()
