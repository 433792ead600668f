"""Atomic checkpoints: what is saved is what is loaded, one file, no leftovers, durable."""

import os

import numpy as np
import pytest
import torch

from dq_flower.harness import checkpoint
from dq_flower.harness.checkpoint import CHECKPOINT_NAME, load_latest, save_atomic


def test_nothing_saved_loads_as_none(tmp_path):
    assert load_latest(tmp_path / "missing") is None
    assert load_latest(tmp_path) is None


def test_save_then_load_returns_the_same_state_in_a_new_folder(tmp_path):
    state = {"round": 3, "arrays": {"w": torch.arange(6.0).reshape(2, 3)},
             "store": {"codes": np.arange(10, dtype=np.uint8), "rng": {"state": 2**70}},
             "history": [{"round": 0, "accuracy": 0.1}]}
    target = save_atomic(tmp_path / "a" / "b", state)
    assert target == tmp_path / "a" / "b" / CHECKPOINT_NAME
    loaded = load_latest(tmp_path / "a" / "b")
    assert loaded["round"] == 3 and loaded["history"] == state["history"]
    assert torch.equal(loaded["arrays"]["w"], state["arrays"]["w"])
    np.testing.assert_array_equal(loaded["store"]["codes"], state["store"]["codes"])
    assert loaded["store"]["codes"].dtype == np.uint8
    assert loaded["store"]["rng"] == {"state": 2**70}


def test_a_new_save_replaces_the_old_one_and_leaves_one_file(tmp_path, monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    for rnd in (1, 2, 3):
        save_atomic(tmp_path, {"round": rnd})
        assert load_latest(tmp_path)["round"] == rnd
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]
    assert len(synced) == 3  # every checkpoint is flushed to disk before it replaces the old


def test_a_failed_save_keeps_the_previous_checkpoint_and_no_temporary_file(tmp_path):
    save_atomic(tmp_path, {"round": 1})

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        save_atomic(tmp_path, {"round": 2, "bad": Unpicklable()})
    assert load_latest(tmp_path)["round"] == 1
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]
