"""Tests for node-local data files: load_node_data / save_node_data / NodeData."""

from __future__ import annotations

import numpy as np
import pytest

from dq_flower.harness.tasks.data import (
    NODE_DATA_CONFIG_KEY,
    NodeData,
    load_node_data,
    save_node_data,
)


def _arrays(n: int = 10, m: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 3, 4)) * 4.0 + 2.0  # float64, well outside [0, 1]
    y = np.arange(n) % 3
    xt = rng.standard_normal((m, 3, 4))
    yt = np.arange(m) % 3
    return x, y, xt, yt


def test_round_trip_with_test_split_keeps_shape_and_values(tmp_path):
    x, y, xt, yt = _arrays()
    path = save_node_data(tmp_path / "node0", x, y, xt, yt)
    assert path == tmp_path / "node0.npz" and path.is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["node0.npz"]  # no temp left
    data = load_node_data(path)
    assert isinstance(data, NodeData)
    assert data.train_x.shape == (10, 3, 4) and data.test_x.shape == (4, 3, 4)
    assert data.sample_shape == (3, 4) and data.num_train == 10 and data.has_test
    assert data.train_x.dtype == np.float32 and data.train_y.dtype == np.int64
    np.testing.assert_array_equal(data.train_x, x.astype(np.float32))
    np.testing.assert_array_equal(data.test_x, xt.astype(np.float32))
    np.testing.assert_array_equal(data.train_y, y)
    np.testing.assert_array_equal(data.test_y, yt)
    assert not data.is_regression


def test_round_trip_without_test_split_and_float_targets(tmp_path):
    x, _, _, _ = _arrays()
    y = np.random.default_rng(1).standard_normal((10, 2))
    path = save_node_data(str(tmp_path / "sub" / "node1.npz"), x, y)
    data = load_node_data(str(path))
    assert data.test_x is None and data.test_y is None and not data.has_test
    assert data.train_y.dtype == np.float32 and data.train_y.shape == (10, 2)
    assert data.is_regression
    np.testing.assert_array_equal(data.train_y, y.astype(np.float32))
    np.testing.assert_array_equal(data.train_x, x.astype(np.float32))
    with np.load(path) as f:
        assert sorted(f.files) == ["x_train", "y_train"]


def test_save_overwrites_in_place(tmp_path):
    x, y, _, _ = _arrays()
    path = save_node_data(tmp_path / "n.npz", x, y)
    save_node_data(path, x[:5] + 1.0, y[:5])
    data = load_node_data(path)
    assert data.num_train == 5
    np.testing.assert_array_equal(data.train_x, (x[:5] + 1.0).astype(np.float32))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["n.npz"]


def test_x_y_aliases_and_extra_keys(tmp_path):
    x, y, xt, yt = _arrays()
    np.savez(tmp_path / "a.npz", x=x, y=y, x_test=xt, y_test=yt, note=np.array([1]))
    data = load_node_data(tmp_path / "a.npz")
    np.testing.assert_array_equal(data.train_x, x.astype(np.float32))
    np.testing.assert_array_equal(data.train_y, y)
    assert data.has_test
    np.savez(tmp_path / "both.npz", x=x, x_train=x, y_train=y)
    with pytest.raises(ValueError, match="alias 'x'"):
        load_node_data(tmp_path / "both.npz")


def test_missing_file_names_path_and_config_key(tmp_path):
    missing = tmp_path / "nope.npz"
    with pytest.raises(FileNotFoundError) as info:
        load_node_data(missing)
    assert str(missing) in str(info.value)
    assert NODE_DATA_CONFIG_KEY == "data-file" and "data-file" in str(info.value)


def test_missing_keys_list_the_keys_present(tmp_path):
    np.savez(tmp_path / "k.npz", features=np.zeros((3, 2)), labels=np.zeros(3))
    with pytest.raises(ValueError, match=r"x_train.*\['features', 'labels'\]"):
        load_node_data(tmp_path / "k.npz")
    x, y, xt, _ = _arrays()
    np.savez(tmp_path / "half.npz", x_train=x, y_train=y, x_test=xt)
    with pytest.raises(ValueError, match=r"y_test.*keys present: \['x_test', 'x_train'"):
        load_node_data(tmp_path / "half.npz")


def test_mismatched_lengths_and_shapes(tmp_path):
    x, y, xt, yt = _arrays()
    np.savez(tmp_path / "len.npz", x_train=x, y_train=y[:-1])
    with pytest.raises(ValueError, match="len.npz.*sample count: 10 vs 9"):
        load_node_data(tmp_path / "len.npz")
    np.savez(tmp_path / "tlen.npz", x_train=x, y_train=y, x_test=xt, y_test=yt[:-1])
    with pytest.raises(ValueError, match="x_test and y_test disagree"):
        load_node_data(tmp_path / "tlen.npz")
    np.savez(tmp_path / "shape.npz", x_train=x, y_train=y, x_test=xt[:, :2], y_test=yt)
    with pytest.raises(ValueError, match="sample shape"):
        load_node_data(tmp_path / "shape.npz")
    np.savez(tmp_path / "kind.npz", x_train=x, y_train=y, x_test=xt, y_test=yt + 0.5)
    with pytest.raises(ValueError, match="does not match y_train"):
        load_node_data(tmp_path / "kind.npz")


def test_bad_values_and_bad_files(tmp_path):
    x, y, _, _ = _arrays()
    bad = x.copy()
    bad[2, 1, 1] = np.nan
    with pytest.raises(ValueError, match="x_train contains NaN"):
        save_node_data(tmp_path / "nan.npz", bad, y)
    assert not (tmp_path / "nan.npz").exists()  # checked before anything is written
    with pytest.raises(ValueError, match=">= 0"):
        save_node_data(tmp_path / "neg.npz", x, y - 1)
    with pytest.raises(ValueError, match="both x_test and y_test"):
        save_node_data(tmp_path / "half.npz", x, y, x_test=x)
    with pytest.raises(ValueError, match="empty"):
        save_node_data(tmp_path / "empty.npz", x[:0], y[:0])
    with pytest.raises(ValueError, match=r"labels must have shape \(n,\)"):
        save_node_data(tmp_path / "lab2d.npz", x, y[:, None])
    np.savez(tmp_path / "inf.npz", x_train=x, y_train=np.full(10, np.inf))
    with pytest.raises(ValueError, match="inf.npz.*y_train.*NaN or infinite"):
        load_node_data(tmp_path / "inf.npz")
    (tmp_path / "text.npz").write_text("not an archive")
    with pytest.raises(ValueError, match="not a readable .npz"):
        load_node_data(tmp_path / "text.npz")
    np.save(tmp_path / "single.npy", x)
    with pytest.raises(ValueError, match="single .npy"):
        load_node_data(tmp_path / "single.npy")
    np.savez(tmp_path / "obj.npz", x_train=np.array([{"a": 1}] * 10, dtype=object), y_train=y)
    with pytest.raises(ValueError, match="obj.npz"):
        load_node_data(tmp_path / "obj.npz")
