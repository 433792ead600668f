"""Atomic checkpoints: what is saved is what is loaded, one file, no leftovers, durable."""

import os

import numpy as np
import pytest
import torch

from dq_flower.harness import checkpoint
from dq_flower.harness.checkpoint import (
    CHECKPOINT_NAME,
    PREVIOUS_NAME,
    load_latest,
    read_checkpoint,
    save_atomic,
)


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


def test_a_new_save_replaces_the_old_one_and_keeps_the_one_before_beside_it(tmp_path,
                                                                          monkeypatch):
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(checkpoint.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    for rnd in (1, 2, 3):
        save_atomic(tmp_path, {"round": rnd})
        assert load_latest(tmp_path)["round"] == rnd
    assert sorted(p.name for p in tmp_path.iterdir()) == [PREVIOUS_NAME, CHECKPOINT_NAME]
    assert torch.load(tmp_path / PREVIOUS_NAME, weights_only=False)["round"] == 2
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


def test_the_new_checkpoint_is_written_beside_the_old_one_under_a_hidden_temporary_name(
        tmp_path, monkeypatch):
    # Prepare: while torch.save writes, look at the folder: the previous checkpoint must still
    # be whole, and the file being written must be a hidden ".server-state-*.tmp" in the same
    # folder (so the rename cannot cross file systems, and a leftover is never mistaken for a
    # checkpoint)
    save_atomic(tmp_path, {"round": 1})
    seen = []
    real_save = torch.save

    def watching_save(obj, fh):
        names = sorted(p.name for p in tmp_path.iterdir())
        seen.append((names, load_latest(tmp_path)["round"]))
        real_save(obj, fh)

    monkeypatch.setattr(checkpoint.torch, "save", watching_save)
    # Execute
    save_atomic(tmp_path, {"round": 2})
    # Assert
    [(names, round_on_disk)] = seen
    assert round_on_disk == 1
    assert len(names) == 2 and names[1] == CHECKPOINT_NAME
    assert names[0].startswith(".server-state-") and names[0].endswith(".tmp")
    assert len(names[0]) > len(".server-state-.tmp")  # a unique part between the two
    assert sorted(p.name for p in tmp_path.iterdir()) == [PREVIOUS_NAME, CHECKPOINT_NAME]
    assert load_latest(tmp_path)["round"] == 2


def test_an_interrupt_just_after_the_rename_propagates_unchanged_and_keeps_the_new_file(
        tmp_path, monkeypatch):
    # the temporary file is already gone (renamed): cleaning up must not turn the interrupt
    # into a FileNotFoundError
    real_replace = os.replace

    def replace_then_interrupt(src, dst):
        real_replace(src, dst)
        raise KeyboardInterrupt

    monkeypatch.setattr(checkpoint.os, "replace", replace_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_atomic(tmp_path, {"round": 4})
    assert load_latest(tmp_path)["round"] == 4
    assert [p.name for p in tmp_path.iterdir()] == [CHECKPOINT_NAME]


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(tmp_path, monkeypatch):
    # Prepare: tag the saved storages as CUDA ones, as on a GPU server
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_atomic(tmp_path, {"w": torch.arange(4.0)})
    # Execute: without CUDA, restoring to the saved location would fail; with it, the
    # tensor would land on the GPU
    loaded = load_latest(tmp_path)
    # Assert
    assert loaded["w"].device == torch.device("cpu")
    assert torch.equal(loaded["w"], torch.arange(4.0))


_CORRUPTIONS = {
    "truncated": lambda good: good[: len(good) // 2],
    "random bytes": lambda good: np.random.default_rng(0).bytes(5000),
    "empty": lambda good: b"",
}


def _corrupt(path, kind):
    if kind == "other content":  # a torch file, but not a checkpoint
        torch.save({"foo": 1}, path)
    else:
        path.write_bytes(_CORRUPTIONS[kind](path.read_bytes()))


@pytest.mark.parametrize("kind", [*_CORRUPTIONS, "other content"])
def test_an_unreadable_checkpoint_falls_back_to_the_one_before_and_says_so(tmp_path, kind,
                                                                           caplog):
    save_atomic(tmp_path, {"round": 1, "history": []})
    save_atomic(tmp_path, {"round": 2, "history": []})
    _corrupt(tmp_path / CHECKPOINT_NAME, kind)
    state, path = read_checkpoint(tmp_path, required=("round", "history"))
    assert state["round"] == 1 and path == tmp_path / PREVIOUS_NAME
    assert f"{tmp_path / CHECKPOINT_NAME} cannot be read" in caplog.text
    assert f"resuming from {PREVIOUS_NAME}, of round 1" in caplog.text


@pytest.mark.parametrize("kind", [*_CORRUPTIONS, "other content"])
def test_an_unreadable_checkpoint_with_none_before_is_refused_naming_it(tmp_path, kind):
    save_atomic(tmp_path, {"round": 1, "history": []})
    _corrupt(tmp_path / CHECKPOINT_NAME, kind)
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()
    with pytest.raises(ValueError, match="checkpoint-dir: .* cannot be read") as refused:
        read_checkpoint(tmp_path, required=("round", "history"))
    message = str(refused.value)
    assert str(tmp_path / CHECKPOINT_NAME) in message and "another checkpoint-dir" in message
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before  # left as it was


def test_two_unreadable_checkpoints_are_refused_naming_both(tmp_path):
    for rnd in (1, 2):
        save_atomic(tmp_path, {"round": rnd})
    (tmp_path / CHECKPOINT_NAME).write_bytes(b"")
    (tmp_path / PREVIOUS_NAME).write_bytes(b"x")
    with pytest.raises(ValueError) as refused:
        load_latest(tmp_path)
    assert str(tmp_path / CHECKPOINT_NAME) in str(refused.value)
    assert str(tmp_path / PREVIOUS_NAME) in str(refused.value)
