"""The disk store as a store: changed files, two runs on one ``store-dir``, a full disk.

- a codes file changed after its checkpoint (away from any fingerprint row) is found on
  resume: the changed blocks' rows are dropped and asked for again, the rest resume; a file
  none of whose blocks match is refused;
- a second process's run on a ``store-dir`` in use is refused, naming the owner's pid; a
  lock left by a process that ended is taken over with a log line;
- the file's space is allocated before rows are written (no sparse file: no SIGBUS on a
  full tmpfs), and a disk that refuses rows (``RLIMIT_FSIZE``) stops the run with the
  server's error, every row stored before kept, no reply blamed.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dq_flower.dq.server.disk_store import (
    BLOCK_ROWS,
    CODE_FILE,
    CodeFile,
    DiskSampleStore,
    StoreDiskError,
)
from dq_flower.dq.server.store_lock import LOCK_FILE, StoreDirLockedError

from .test_store_on_disk import _dequantize, _draws, _fill

ROOT = Path(__file__).resolve().parents[2]
ROWS = 4 * BLOCK_ROWS + 40  # five blocks, the last one partial


def _filled(directory) -> DiskSampleStore:
    store = DiskSampleStore(_dequantize, directory, seed=1)
    _fill(store, [(range(0, ROWS // 2), 7), (range(5000, 5000 + ROWS - ROWS // 2), 8)])
    return store


def _fingerprint_rows(used: int) -> set[int]:
    return set(np.unique(np.linspace(0, used - 1, min(used, 64)).astype(np.int64)).tolist())


def _tamper(directory, rows) -> None:
    """Flip every bit of ``rows`` of the codes file (none of the fingerprint's rows)."""
    path = Path(directory) / CODE_FILE
    data = bytearray(path.read_bytes())
    for r in rows:
        for i in range(r * 5, r * 5 + 5):  # the rows of tests.dq.test_store_on_disk: 5 bytes
            data[i] ^= 0xFF
    path.write_bytes(bytes(data))


def test_a_file_changed_outside_the_fingerprint_rows_drops_only_the_changed_block(
        tmp_path, caplog):
    store = _filled(tmp_path)
    state = store.state()
    skip = _fingerprint_rows(ROWS)
    changed = [r for r in range(BLOCK_ROWS + 1, 2 * BLOCK_ROWS - 1) if r not in skip][:47]
    _tamper(tmp_path, changed)
    resumed = DiskSampleStore(_dequantize, tmp_path, seed=1)
    resumed.load_state(state)
    # block 1 (rows 256-511, all of client 7's) is dropped; the four others resume
    assert len(resumed) == ROWS - BLOCK_ROWS
    assert "changed since the checkpoint in 1 of its 5 blocks" in caplog.text
    gone = np.arange(BLOCK_ROWS, 2 * BLOCK_ROWS)
    assert not resumed.was_received(7, gone).any()  # asked for again
    assert resumed.was_received(7, np.arange(0, BLOCK_ROWS)).all()
    assert resumed.was_received(8, np.arange(5000, 5000 + ROWS - ROWS // 2)).all()
    # every row left decodes to what was stored
    keep = ~np.isin(np.arange(ROWS), gone)
    fresh = _filled(tmp_path / "again")
    np.testing.assert_array_equal(resumed._take(np.arange(len(resumed))).codes,
                                  fresh._take(np.flatnonzero(keep)).codes)
    # its next checkpoint is of the file as it is: a second resume drops nothing more
    again = DiskSampleStore(_dequantize, tmp_path, seed=1)
    again.load_state(resumed.state())
    assert len(again) == len(resumed)
    _draws(again)


def test_a_file_changed_in_every_block_is_refused(tmp_path):
    store = _filled(tmp_path)
    state = store.state()
    skip = _fingerprint_rows(ROWS)
    _tamper(tmp_path, [r for r in range(0, ROWS, 7) if r not in skip])
    with pytest.raises(ValueError, match="does not hold the rows of this checkpoint"):
        DiskSampleStore(_dequantize, tmp_path).load_state(state)


def test_appended_rows_keep_the_block_checksums_of_the_whole_file(tmp_path):
    code_file = CodeFile.create(tmp_path, 3, min_rows=8)
    codes = np.random.default_rng(0).integers(0, 256, (3 * BLOCK_ROWS + 5, 3), dtype=np.uint8)
    for start in range(0, len(codes), 97):  # appends that straddle block boundaries
        code_file.append(codes[start:start + 97])
    assert len(code_file.crcs) == 4
    assert code_file.crcs == code_file.block_crcs()


# ---------------------------------------------------------------- one run per store-dir
HOLDER = """
import sys, torch
from dq_flower import DQStrategy
strategy = DQStrategy(torch.nn.Linear(4, 2), store_dir=sys.argv[1])
print("ready", flush=True)
sys.stdin.read()
"""


def _env() -> dict[str, str]:
    return {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin",
            "FLWR_TELEMETRY_ENABLED": "0", "PYTHONDONTWRITEBYTECODE": "1",
            "HOME": os.environ.get("HOME", "/tmp")}


def test_a_second_run_on_a_store_dir_in_use_is_refused_and_a_stale_lock_taken_over(
        tmp_path, caplog):
    import torch

    from dq_flower import DQStrategy

    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path)], cwd=ROOT,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              env=_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ready"
        with pytest.raises(StoreDirLockedError, match=f"in use by the run of process {holder.pid}"):
            DQStrategy(torch.nn.Linear(4, 2), store_dir=str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)  # it ends without releasing its lock
        holder.wait(timeout=30)
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(holder.pid)
    strategy = DQStrategy(torch.nn.Linear(4, 2), store_dir=str(tmp_path))
    assert f"taking over the lock of process {holder.pid}" in caplog.text
    assert (tmp_path / LOCK_FILE).read_text().strip() == str(os.getpid())
    # within one process the lock is shared: a strategy rebuilt after a crash resumes
    DQStrategy(torch.nn.Linear(4, 2), store_dir=str(tmp_path))
    assert strategy.intake.store_lock is not None and strategy.intake.store_lock.held


# ---------------------------------------------------------------- a full disk
def test_the_file_space_is_allocated_before_rows_are_written(tmp_path):
    code_file = CodeFile.create(tmp_path, 16, min_rows=4096)
    code_file.append(np.ones((10, 16), dtype=np.uint8))
    st = os.stat(code_file.path)
    assert st.st_size == 4096 * 16
    assert st.st_blocks * 512 >= st.st_size  # not sparse: a full tmpfs cannot SIGBUS it


FSIZE_CHILD = """
import json, resource, sys
import numpy as np
from dq_flower.dq.server.disk_store import DiskSampleStore
from tests.dq.test_store_on_disk import _dequantize, _rows
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
store = DiskSampleStore(_dequantize, sys.argv[1])
out = {"error": None}
try:
    for start in range(0, 100000, 300):
        store.add(_rows(range(start, start + 300)))
except Exception as exc:
    out = {"error": type(exc).__name__, "message": str(exc)}
out["stored"] = len(store)
out["read"] = int(store._take(np.arange(len(store))).codes.shape[0])
ok = np.array_equal(store._take(np.arange(len(store))).codes,
                    np.concatenate([_rows(range(s, s + 300)).codes
                                    for s in range(0, len(store), 300)]))
out["intact"] = bool(ok)
print(json.dumps(out))
"""


def test_a_file_size_limit_is_the_servers_error_and_keeps_the_stored_rows(tmp_path):
    limit = 5 * 4096 * 3  # room for 12,288 rows of 5 bytes: the first doubling fails
    done = subprocess.run([sys.executable, "-c", FSIZE_CHILD, str(tmp_path), str(limit)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=_env())
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["error"] == StoreDiskError.__name__, seen
    assert "store-dir: the server cannot store 300 more rows" in seen["message"]
    # growth falls back to the rows needed: the file holds every row that fits
    assert seen["stored"] == 12000 and seen["read"] == 12000 and seen["intact"], seen
    assert os.path.getsize(tmp_path / CODE_FILE) <= limit


RUN_CHILD = """
import json, resource, sys
from flwr.app import ArrayRecord
import torch
import dq_flower
from dq_flower.harness.inprocess import InProcessGrid
from tests.faults.digits_attack import NODES, Net, _client
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
torch.manual_seed(0)
model = Net()
strategy = dq_flower.DQStrategy(model, seed=0, store_dir=sys.argv[1])
out = {"error": None}
try:
    strategy.start(grid=InProcessGrid(_client(None, NODES), NODES),
                   initial_arrays=ArrayRecord(model.state_dict()), num_rounds=8)
except Exception as exc:
    out["error"] = type(exc).__name__ + ": " + str(exc)
store = strategy.store
out["stored"] = len(store)
out["on_disk"] = store.disk_bytes // 16
x, y, w = store.draw(len(store), __import__("numpy").random.default_rng(0))
out["drawn"] = int(len(x))
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_run_whose_disk_fills_stops_with_the_servers_error_and_blames_no_reply(tmp_path):
    limit = 16 * 600  # 600 rows of the digits' 16 bytes: the adaptive schedule asks more
    done = subprocess.run([sys.executable, "-c", RUN_CHILD, str(tmp_path), str(limit)],
                          cwd=ROOT, capture_output=True, text=True, timeout=300, env=_env())
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["error"].startswith(StoreDiskError.__name__), seen
    assert "the server cannot store" in seen["error"], seen
    assert "store insertion failed" not in done.stderr  # no client blamed
    assert "the server's disk" in done.stderr
    assert 0 < seen["stored"] <= 600 and seen["stored"] == seen["on_disk"], seen


# ---------------------------------------------------------------- a run resumed from a changed file
class CrashError(Exception):
    pass


def test_a_run_resumed_from_a_changed_file_trains_on_no_changed_row(tmp_path):
    from dq_flower.harness.checkpoint import load_latest
    from dq_flower.harness.client_app import app as client_app
    from dq_flower.harness.inprocess import InProcessGrid
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config

    def config(name, **knobs):
        return build_run_config("dq", num_clients=3, rounds=5, seed=5, budget=120,
                                upload_schedule="fixed", server_steps=20,
                                checkpoint_every=2, checkpoint_dir=str(tmp_path / name),
                                **knobs)

    def crash_after_round_3(row):
        if row["round"] == 3:
            raise CrashError

    straight = run_server(InProcessGrid(client_app, 3), config("straight"))
    grid = InProcessGrid(client_app, 3)
    on_disk = config("disk", store_dir=str(tmp_path / "store"))
    with pytest.raises(CrashError):
        run_server(grid, on_disk, on_round=crash_after_round_3)
    saved = load_latest(tmp_path / "disk")["strategy"]["store"]
    assert int(saved["disk_used"][0]) == 720  # three blocks at the checkpoint
    skip = _fingerprint_rows(720)
    flipped = [r for r in range(BLOCK_ROWS, 2 * BLOCK_ROWS) if r not in skip]
    path = tmp_path / "store" / CODE_FILE
    data = bytearray(path.read_bytes())
    for r in flipped:  # every code of the row's 16 bytes moved by one level
        data[r * 16:(r + 1) * 16] = bytes(b ^ 0x55 for b in data[r * 16:(r + 1) * 16])
    path.write_bytes(bytes(data))
    resumed = run_server(grid, on_disk)
    state = load_latest(tmp_path / "disk")["strategy"]["store"]
    slots = np.asarray(state["disk_slots"]).astype(np.int64)
    assert not np.isin(flipped, slots).any()  # no changed row is trained on
    assert len(state["labels"]) >= 720  # the dropped rows were asked for again
    final = [r["accuracy"] for r in resumed.history][-1]
    control = [r["accuracy"] for r in straight.history][-1]
    assert final > control - 0.05, (final, control)
