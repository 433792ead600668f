"""The store with its codes on disk (``store-dir``): the same store as in memory, beyond RAM.

Same rows, draws, eviction and checkpoints as the in-memory store for the same seed; a
checkpoint refers to the codes file instead of copying it and resumes exactly; a DQ run
with ``store-dir`` ends with the history of the run without it, also after a crash and a
resume; and a process whose data memory is capped below the store's size fills the store
and trains from it on disk, where the in-memory store runs out of memory.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dq_flower.dq.server.disk_store import CODE_FILE, CodeFile, DiskSampleStore
from dq_flower.dq.server.store import SampleStore, StoredRows

ROOT = Path(__file__).resolve().parents[2]
WIDTH = 5


def _rows(ids, node=7, holdout_every=0, seed=0):
    """Rows of random codes; side information ``(id, 1)``; every ``holdout_every``-th held out."""
    ids = np.asarray(ids, dtype=np.int64)
    n = ids.size
    rng = np.random.default_rng(seed + int(ids[0]) if n else seed)
    return StoredRows(
        codes=rng.integers(0, 256, (n, WIDTH), dtype=np.uint8),
        side=np.stack([ids.astype(np.float32), np.ones(n, np.float32)], axis=1),
        labels=ids % 10, weights=1.0 + (ids % 3).astype(np.float32),
        node=np.full(n, node, dtype=np.uint64), ids=ids,
        dither=np.zeros((n, 0), np.int64),
        holdout=(ids % holdout_every == 0) if holdout_every else None)


def _dequantize(codes, side, dither):
    """Float rows: the side's id, then the codes."""
    assert dither.shape == (codes.shape[0], 0)
    return np.concatenate([side[:, :1], codes.astype(np.float32)], axis=1)


def _fill(store, batches):
    for ids, node in batches:
        store.add(_rows(ids, node=node, holdout_every=7))


def _draws(store, seed=3, count=20, batch=16):
    rng = np.random.default_rng(seed)
    return [store.draw(batch, rng, weights=("node" if i % 2 else "importance"))
            for i in range(count)]


def _assert_same_draws(a, b):
    for (xa, ya, wa), (xb, yb, wb) in zip(a, b, strict=True):
        np.testing.assert_array_equal(xa, xb)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(wa, wb)


BATCHES = [(range(0, 40), 7), (range(100, 130), 8), (range(40, 90), 7), (range(200, 260), 9)]


@pytest.mark.parametrize(("max_samples", "eviction"), [(0, "fifo"), (70, "fifo"),
                                                       (70, "random")])
def test_disk_store_draws_what_the_memory_store_draws(tmp_path, max_samples, eviction):
    memory = SampleStore(_dequantize, max_samples=max_samples, eviction=eviction, seed=4)
    disk = DiskSampleStore(_dequantize, tmp_path, max_samples=max_samples, eviction=eviction,
                           seed=4)
    _fill(memory, BATCHES)
    _fill(disk, BATCHES)
    assert len(disk) == len(memory) == (max_samples or 180)
    assert disk.evicted == memory.evicted == (110 if max_samples else 0)
    assert disk.nbytes == memory.nbytes
    assert disk.disk_bytes == 180 * WIDTH  # evicted rows keep their place in the file
    for node in (7, 8, 9):
        np.testing.assert_array_equal(disk.received(node), memory.received(node))
        assert disk.node_weight(node) == memory.node_weight(node)
    _assert_same_draws(_draws(disk), _draws(memory))
    for a, b in zip(disk.holdout_batches(8), memory.holdout_batches(8), strict=True):
        for u, v in zip(a, b, strict=True):
            np.testing.assert_array_equal(u, v)
    mem_state, disk_state = memory.state(), disk.state()
    assert "codes" not in disk_state  # the checkpoint refers to the file
    for key in ("labels", "ids", "node", "weights", "side", "holdout", "evicted_ids"):
        np.testing.assert_array_equal(disk_state[key], mem_state[key])


def test_the_file_grows_by_doubling_and_keeps_its_rows(tmp_path):
    codes = np.random.default_rng(0).integers(0, 256, (100, 3), dtype=np.uint8)
    code_file = CodeFile.create(tmp_path, 3, min_rows=8)
    sizes = []
    for start in range(0, 100, 10):
        slots = code_file.append(codes[start:start + 10])
        np.testing.assert_array_equal(slots, np.arange(start, start + 10))
        sizes.append(code_file.path.stat().st_size // 3)
    assert sizes == [16, 32, 32, 64, 64, 64, 128, 128, 128, 128]
    np.testing.assert_array_equal(code_file.read(np.arange(100)), codes)
    np.testing.assert_array_equal(code_file.read(np.array([97, 3, 50])), codes[[97, 3, 50]])
    assert code_file.nbytes == 300


def test_resume_from_a_checkpoint_draws_what_the_uninterrupted_store_draws(tmp_path):
    # the run goes on after its checkpoint (appending rows to the file), then restarts
    # from the checkpoint and receives different rows: those overwrite the appended ones
    disk = DiskSampleStore(_dequantize, tmp_path, max_samples=100, eviction="random", seed=1)
    memory = SampleStore(_dequantize, max_samples=100, eviction="random", seed=1)
    for store in (disk, memory):
        _fill(store, BATCHES[:3])
    checkpoint = disk.state()
    assert sum(v.nbytes for v in checkpoint.values() if isinstance(v, np.ndarray)) \
        < disk.nbytes  # no codes in it
    _fill(disk, [(range(500, 600), 5)])  # served after the checkpoint, then lost
    resumed = DiskSampleStore(_dequantize, tmp_path, max_samples=100, eviction="random",
                              seed=99)
    resumed.load_state(checkpoint)
    for store in (resumed, memory):
        _fill(store, BATCHES[3:])
    _assert_same_draws(_draws(resumed), _draws(memory))
    assert resumed.received(5).size == 0


def test_an_in_memory_checkpoint_resumes_on_disk(tmp_path):
    memory = SampleStore(_dequantize, max_samples=60, seed=2)
    _fill(memory, BATCHES)
    disk = DiskSampleStore(_dequantize, tmp_path, max_samples=60, seed=2)
    disk.load_state(memory.state())
    _assert_same_draws(_draws(disk), _draws(memory))
    assert disk.disk_bytes == 60 * WIDTH


def test_a_checkpoint_of_another_file_or_of_a_disk_store_in_memory_is_refused(tmp_path):
    disk = DiskSampleStore(_dequantize, tmp_path / "a")
    _fill(disk, BATCHES)
    state = disk.state()
    with pytest.raises(ValueError, match="store-dir"):  # no codes file there
        DiskSampleStore(_dequantize, tmp_path / "b").load_state(state)
    other = DiskSampleStore(_dequantize, tmp_path / "c")
    _fill(other, [(range(1000, 1180), 3)])  # as many rows, other codes
    with pytest.raises(ValueError, match="store-dir.*does not hold the rows"):
        DiskSampleStore(_dequantize, tmp_path / "c").load_state(state)
    with pytest.raises(ValueError, match="store-dir"):
        SampleStore(_dequantize).load_state(state)


def test_the_knob_is_checked_and_read_from_a_run_config(tmp_path):
    from dq_flower.dq.config import DQConfig

    (tmp_path / "file").write_text("")
    with pytest.raises(ValueError, match="store-dir: must be a directory"):
        DQConfig(store_dir=str(tmp_path / "file"))
    assert DQConfig().store_dir == ""
    assert DQConfig(store_dir=str(tmp_path / "new")).store_dir == str(tmp_path / "new")

    import torch

    from dq_flower import DQStrategy

    strategy = DQStrategy.from_run_config(torch.nn.Linear(4, 3),
                                          {"store-dir": str(tmp_path / "s")})
    assert strategy.cfg.store_dir == str(tmp_path / "s")
    assert DQStrategy(torch.nn.Linear(4, 3), store_dir=str(tmp_path)).cfg.store_dir \
        == str(tmp_path)


# ---------------------------------------------------------------- a DQ run on disk
VOLATILE = {"wall_s", "server_time_s", "client_time_s", "server_compute_s"}


class CrashError(Exception):
    pass


def _history(result):
    out = []
    for row in result.history:
        kept = {k: None if isinstance(v, float) and math.isnan(v) else v
                for k, v in row.items() if k not in VOLATILE and k != "clients"}
        kept["clients"] = [entry[1:] for entry in row.get("clients", [])]
        out.append(kept)
    return out


def test_a_run_on_disk_crashed_and_resumed_ends_like_a_run_in_memory(tmp_path):
    from dq_flower.harness.checkpoint import load_latest
    from dq_flower.harness.client_app import app as client_app
    from dq_flower.harness.inprocess import InProcessGrid
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config

    def config(name, **knobs):
        return build_run_config("dq", num_clients=3, rounds=4, seed=5, budget=40,
                                upload_schedule="fixed", server_steps=6, max_store_samples=200,
                                store_eviction="random", checkpoint_every=2,
                                checkpoint_dir=str(tmp_path / name), **knobs)

    def crash_after_round_3(row):
        if row["round"] == 3:
            raise CrashError

    straight = run_server(InProcessGrid(client_app, 3), config("memory"))
    grid = InProcessGrid(client_app, 3)  # the clients survive the server
    on_disk = config("disk", store_dir=str(tmp_path / "store"))
    with pytest.raises(CrashError):
        run_server(grid, on_disk, on_round=crash_after_round_3)
    assert load_latest(tmp_path / "disk")["round"] == 2  # round 3 is served again
    resumed = run_server(grid, on_disk)

    assert _history(resumed) == _history(straight)
    state = load_latest(tmp_path / "disk")["strategy"]["store"]
    assert "codes" not in state and (tmp_path / "store" / CODE_FILE).is_file()
    mem = load_latest(tmp_path / "memory")["strategy"]["store"]
    for key in ("labels", "ids", "weights", "side"):
        np.testing.assert_array_equal(state[key], mem[key])


# ---------------------------------------------------------------- beyond the memory limit
LIMIT_MB, STORE_MB = 256, 512


def _child(mode, directory):
    return subprocess.run(
        [sys.executable, "-m", "tests.dq.store_limit_child", mode, str(directory),
         str(LIMIT_MB), str(STORE_MB)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"})


def test_a_store_larger_than_the_memory_limit_trains_from_disk(tmp_path):
    directory = tmp_path / "store"
    try:
        done = _child("disk", directory)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["store_mb"] > 2 * LIMIT_MB - 10 and seen["vm_data_mb"] < LIMIT_MB
        assert seen["accuracy"] > 0.9  # it learned from rows drawn off the disk
        # the same process with the store in memory does not fit
        failed = _child("memory", tmp_path / "unused")
        assert failed.returncode != 0 and "MemoryError" in failed.stderr
    finally:
        shutil.rmtree(directory, ignore_errors=True)
