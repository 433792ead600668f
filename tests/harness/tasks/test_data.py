"""Tests for dq_flower.harness.tasks.data: loaders on real-format files, partitions."""

from __future__ import annotations

import gzip
import os
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

from dq_flower.harness.tasks.data import (
    Dataset,
    from_arrays,
    load_dataset,
    load_partition,
    parse_idx,
    partition_indices,
    save_npz,
)
from dq_flower.harness.tasks.data.arrays import split_indices
from dq_flower.harness.tasks.data.partitions import iid_shards

# --------------------------------------------------------------------------- helpers


def _idx_bytes(arr: np.ndarray, magic: int | None = None) -> bytes:
    arr = np.ascontiguousarray(arr, dtype=np.uint8)
    if magic is None:
        magic = 0x0800 | arr.ndim
    return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def _write_idx(path: Path, arr: np.ndarray, gz: bool, magic: int | None = None) -> Path:
    data = _idx_bytes(arr, magic)
    if gz:
        path = path.with_name(path.name + ".gz")
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


def _fake_fmnist(folder: Path, gz_train: bool, gz_test: bool, h: int = 5, w: int = 4):
    rng = np.random.default_rng(1)
    folder.mkdir(parents=True, exist_ok=True)
    tx = rng.integers(0, 256, size=(12, h, w), dtype=np.uint8)
    tx[0, 0, 0] = 255
    ty = np.arange(12, dtype=np.uint8) % 10
    vx = rng.integers(0, 256, size=(6, h, w), dtype=np.uint8)
    vy = (np.arange(6, dtype=np.uint8) * 3) % 10
    _write_idx(folder / "train-images-idx3-ubyte", tx, gz_train)
    _write_idx(folder / "train-labels-idx1-ubyte", ty, gz_train)
    _write_idx(folder / "t10k-images-idx3-ubyte", vx, gz_test)
    _write_idx(folder / "t10k-labels-idx1-ubyte", vy, gz_test)
    return tx, ty, vx, vy


def _fake_cifar(root: Path, per_batch: int = 4) -> dict[str, tuple[np.ndarray, list[int]]]:
    """Write cifar-10-batches-py as torchvision expects: pickled dicts with bytes keys."""
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = {}
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        data = np.zeros((per_batch, 3072), dtype=np.uint8)
        labels = []
        for i in range(per_batch):
            k = b * per_batch + i
            data[i, :1024] = 10 + k        # red plane
            data[i, 1024:2048] = 100 + k   # green plane
            data[i, 2048:] = 200 + k % 50  # blue plane
            data[i, 5] = 255               # one bright red pixel at (row 0, col 5)
            labels.append(k % 10)
        with open(folder / name, "wb") as f:
            pickle.dump({b"batch_label": name.encode(), b"data": data, b"labels": labels,
                         b"filenames": [b"x.png"] * per_batch}, f, protocol=2)
        batches[name] = (data, labels)
    with open(folder / "batches.meta", "wb") as f:
        pickle.dump({b"label_names": [f"c{i}".encode() for i in range(10)],
                     b"num_cases_per_batch": per_batch, b"num_vis": 3072}, f, protocol=2)
    return batches


# --------------------------------------------------------------------------- digits


def test_digits_loads_real_data_scaled_and_split():
    ds = load_dataset("digits", seed=0)
    assert ds.num_train + ds.test_x.shape[0] == 1797
    assert ds.train_x.shape[1] == ds.test_x.shape[1] == 64 == ds.dim
    assert ds.input_shape == (1, 8, 8)
    assert ds.num_classes == 10
    assert ds.train_x.dtype == np.float32 and ds.train_y.dtype == np.int64
    assert ds.train_x.min() >= 0.0 and ds.train_x.max() == pytest.approx(1.0)
    assert abs(ds.test_x.shape[0] - 0.2 * 1797) <= 1
    # stratified: every class in the test split in about its global proportion
    assert np.bincount(ds.test_y, minlength=10).min() >= 35
    again = load_dataset("digits", seed=0)
    np.testing.assert_array_equal(again.train_y, ds.train_y)
    other = load_dataset("digits", seed=1)
    assert not np.array_equal(other.train_y, ds.train_y)


def test_digits_values_are_sklearn_digits_over_16():
    """The named set keeps its definition: pixels 0..16 divided by 16, same rows as before."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    bunch = load_digits()
    y = np.asarray(bunch.target, dtype=np.int64)
    for seed, frac in ((0, 0.2), (3, 0.3)):
        ds = load_dataset("digits", seed=seed, test_fraction=frac)
        # the old transform, by hand: float32 / 16, then a stratified seeded split
        x = np.asarray(bunch.data, dtype=np.float32) / np.float32(16.0)
        tr, te = train_test_split(np.arange(len(y)), test_size=frac, random_state=seed,
                                  stratify=y)
        tr, te = np.sort(tr), np.sort(te)
        np.testing.assert_array_equal(ds.train_x, x[tr])
        np.testing.assert_array_equal(ds.test_x, x[te])
        np.testing.assert_array_equal(ds.train_y, y[tr])
        np.testing.assert_array_equal(ds.test_y, y[te])
        assert ds.train_x.min() == 0.0 and ds.train_x.max() == 1.0
        assert ds.test_x.min() >= 0.0 and ds.test_x.max() <= 1.0
        assert not ds.is_regression


def test_unknown_dataset_lists_known_names():
    with pytest.raises(ValueError, match="digits.*fmnist.*cifar10"):
        load_dataset("imagenet")


# --------------------------------------------------------------------------- IDX


@pytest.mark.parametrize(("gz_train", "gz_test"), [(True, True), (False, False), (True, False)])
def test_fmnist_idx_gzipped_and_plain(tmp_path, gz_train, gz_test):
    tx, ty, vx, vy = _fake_fmnist(tmp_path / "fm", gz_train, gz_test)
    ds = load_dataset("fmnist", data_dir=str(tmp_path / "fm"))
    assert ds.input_shape == (1, 5, 4) and ds.dim == 20
    assert ds.train_x.shape == (12, 20) and ds.test_x.shape == (6, 20)
    np.testing.assert_allclose(ds.train_x, tx.reshape(12, -1) / 255.0, atol=1e-7)
    np.testing.assert_allclose(ds.test_x, vx.reshape(6, -1) / 255.0, atol=1e-7)
    np.testing.assert_array_equal(ds.train_y, ty)
    np.testing.assert_array_equal(ds.test_y, vy)
    assert ds.num_classes == 10 and ds.name == "fmnist"


def test_parse_idx_reads_big_endian_header(tmp_path):
    arr = np.arange(2 * 3 * 300, dtype=np.int64).astype(np.uint8).reshape(2, 3, 300)
    p = _write_idx(tmp_path / "a-idx3-ubyte", arr, gz=False)
    out = parse_idx(p, expected_magic=2051)
    assert out.shape == (2, 3, 300)  # 300 > 255 needs the multi-byte big-endian dim
    np.testing.assert_array_equal(out, arr)


def test_idx_corrupted_magic_is_a_clear_error(tmp_path):
    _fake_fmnist(tmp_path / "fm", True, True)
    bad = np.zeros((12, 5, 4), dtype=np.uint8)
    (tmp_path / "fm" / "train-images-idx3-ubyte.gz").unlink()
    _write_idx(tmp_path / "fm" / "train-images-idx3-ubyte", bad, gz=True, magic=0x12345678)
    with pytest.raises(ValueError, match="magic"):
        load_dataset("fmnist", data_dir=str(tmp_path / "fm"))
    # a labels file where images are expected: valid IDX, wrong magic
    p = _write_idx(tmp_path / "labels", np.zeros(4, np.uint8), gz=False)
    with pytest.raises(ValueError, match="2049.*expected 2051"):
        parse_idx(p, expected_magic=2051)


def test_idx_truncated_file_is_rejected(tmp_path):
    data = _idx_bytes(np.zeros((3, 4, 4), np.uint8))[:-5]
    p = tmp_path / "t-idx3-ubyte"
    p.write_bytes(data)
    with pytest.raises(ValueError, match="declares"):
        parse_idx(p)


def test_fmnist_missing_folder_names_folder_and_package(tmp_path):
    missing = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        load_dataset("fmnist", data_dir=str(missing))
    assert str(missing) in str(info.value)
    assert "dataset-fashion-mnist" in str(info.value)


# --------------------------------------------------------------------------- CIFAR-10


def test_cifar10_python_batches_shape_and_channel_order(tmp_path):
    batches = _fake_cifar(tmp_path)
    ds = load_dataset("cifar10", data_dir=str(tmp_path))
    assert ds.input_shape == (3, 32, 32) and ds.dim == 3072
    assert ds.train_x.shape == (20, 3072) and ds.test_x.shape == (4, 3072)
    img = ds.train_x.reshape(-1, 3, 32, 32)
    k = 7  # sample 3 of data_batch_2
    assert img[k, 0, 1, 1] == pytest.approx((10 + k) / 255)
    assert img[k, 1, 1, 1] == pytest.approx((100 + k) / 255)
    assert img[k, 2, 1, 1] == pytest.approx((200 + k) / 255)
    assert img[k, 0, 0, 5] == pytest.approx(1.0)  # row-major within the red plane
    np.testing.assert_array_equal(ds.train_y, np.arange(20) % 10)
    np.testing.assert_array_equal(ds.test_y, batches["test_batch"][1])
    assert ds.num_classes == 10


def test_cifar10_missing_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="cifar-10-batches-py"):
        load_dataset("cifar10", data_dir=str(tmp_path))


def test_cifar10_refuses_pickles_with_code(tmp_path):
    _fake_cifar(tmp_path)

    class Evil:
        def __reduce__(self):
            return (os.getcwd, ())

    with open(tmp_path / "cifar-10-batches-py" / "data_batch_3", "wb") as f:
        pickle.dump({b"data": Evil(), b"labels": []}, f)
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_dataset("cifar10", data_dir=str(tmp_path))


# --------------------------------------------------------------------------- arrays / npz


def test_npz_round_trip(tmp_path):
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(30, 2, 3, 3), dtype=np.uint8)
    y = np.arange(30) % 3
    ds = from_arrays(x, y, seed=4, name="toy")
    assert ds.input_shape == (2, 3, 3) and ds.dim == 18
    assert ds.num_train == 24 and ds.test_x.shape == (6, 18)
    # changed: user uint8 data is no longer divided by 255; values are kept as given
    assert ds.train_x.dtype == np.float32
    allx = np.sort(np.concatenate([ds.train_x, ds.test_x]).ravel())
    np.testing.assert_array_equal(allx, np.sort(x.ravel()).astype(np.float32))
    path = save_npz(ds, tmp_path / "toy")
    assert path.suffix == ".npz"
    back = load_dataset(f"npz:{path}")
    for field in ("train_x", "train_y", "test_x", "test_y"):
        np.testing.assert_array_equal(getattr(back, field), getattr(ds, field))
    assert back.input_shape == ds.input_shape and back.num_classes == 3


def test_npz_without_test_split_is_split_by_seed(tmp_path):
    x = np.linspace(0, 50, 100 * 4).reshape(100, 4)  # max > 1: kept as given
    y = np.arange(100) % 4
    np.savez(tmp_path / "t.npz", x_train=x, y_train=y)
    a = load_dataset(f"npz:{tmp_path / 't.npz'}", seed=1, test_fraction=0.25)
    b = load_dataset(f"npz:{tmp_path / 't.npz'}", seed=1, test_fraction=0.25)
    c = load_dataset(f"npz:{tmp_path / 't.npz'}", seed=2, test_fraction=0.25)
    assert a.num_train == 75 and a.test_x.shape == (25, 4)
    np.testing.assert_array_equal(a.train_x, b.train_x)
    assert not np.array_equal(a.train_x, c.train_x)
    assert a.input_shape == (4,)
    # changed: values are no longer divided by the training maximum (50)
    allx = np.sort(np.concatenate([a.train_x, a.test_x]).ravel())
    np.testing.assert_array_equal(allx, np.sort(x.ravel()).astype(np.float32))


def test_from_arrays_keeps_values_and_label_checks():
    x = np.array([[-1.0, 1.0], [3.0, 0.0]])
    ds = from_arrays(x, [0, 1], x_test=np.array([[5.0, -2.0]]), y_test=[1])
    # changed: no min-max scaling to the training range and no clipping of the test split
    np.testing.assert_array_equal(ds.train_x, [[-1.0, 1.0], [3.0, 0.0]])
    np.testing.assert_array_equal(ds.test_x, [[5.0, -2.0]])
    # changed: float y are regression targets by default; with num_classes they must
    # be integer-valued class labels
    with pytest.raises(ValueError, match="labels"):
        from_arrays(np.zeros((2, 2)), [0.5, 1], num_classes=2)
    with pytest.raises(ValueError, match="num_classes"):
        from_arrays(np.zeros((4, 2)), [0, 1, 2, 3], num_classes=2)
    with pytest.raises(ValueError, match="sample count"):
        from_arrays(np.zeros((4, 2)), [0, 1])
    with pytest.raises(ValueError, match="shape"):
        Dataset(np.zeros((2, 3), np.float32), np.zeros(2, np.int64),
                np.zeros((1, 3), np.float32), np.zeros(1, np.int64), 2, (4,), "bad")


def _standardized(n: int = 60, d: int = 5, seed: int = 0) -> np.ndarray:
    """Standardized features with an outlier: values from about -3 to 12."""
    x = np.random.default_rng(seed).standard_normal((n, d))
    x = np.clip(x, -3.0, 3.0)
    x[n // 2, 2] = 12.0
    x[n - 1, 0] = -3.0
    return x


def test_user_arrays_are_not_rescaled(tmp_path):
    x = _standardized()
    xt = _standardized(10, seed=1)
    assert x.min() == pytest.approx(-3.0) and x.max() == 12.0
    y, yt = np.arange(60) % 3, np.arange(10) % 3
    ds = from_arrays(x, y, x_test=xt, y_test=yt)
    np.testing.assert_array_equal(ds.train_x, x.astype(np.float32))
    np.testing.assert_array_equal(ds.test_x, xt.astype(np.float32))
    # the held-out split keeps the values too
    held = from_arrays(x, y, seed=2)
    allx = np.concatenate([held.train_x, held.test_x])
    np.testing.assert_array_equal(np.sort(allx, axis=0), np.sort(x.astype(np.float32), axis=0))
    # and so does an npz file holding the user's float64 arrays
    np.savez(tmp_path / "u.npz", x_train=x, y_train=y, x_test=xt, y_test=yt)
    back = load_dataset(f"npz:{tmp_path / 'u.npz'}")
    np.testing.assert_array_equal(back.train_x, x.astype(np.float32))
    np.testing.assert_array_equal(back.test_x, xt.astype(np.float32))
    assert back.num_classes == 3 and not back.is_regression


def test_user_arrays_are_copied():
    x = np.ones((4, 2), np.float32)
    ds = from_arrays(x, [0, 1, 0, 1], x_test=x[:2].copy(), y_test=[0, 1])
    x[:] = 5.0
    assert ds.train_x.max() == 1.0


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 1e300])
@pytest.mark.parametrize("where", ["x", "x_test"])
def test_from_arrays_rejects_non_finite_inputs(bad, where):
    x, xt = np.zeros((6, 2)), np.zeros((2, 2))
    (x if where == "x" else xt)[1, 1] = bad
    with pytest.raises(ValueError, match=f"{where} contains NaN or infinite"):
        from_arrays(x, np.arange(6) % 2, x_test=xt, y_test=[0, 1])


@pytest.mark.parametrize("target_shape", [(), (2,)])
def test_float_targets_round_trip(tmp_path, target_shape):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((40, 3))
    y = rng.standard_normal((40, *target_shape)) * 100.0
    ds = from_arrays(x, y, seed=1)
    assert ds.num_classes == 0 and ds.is_regression
    assert ds.train_y.dtype == np.float32 and ds.test_y.dtype == np.float32
    assert ds.train_y.shape == (32, *target_shape) and ds.test_y.shape == (8, *target_shape)
    tr, te = split_indices(40, y, 0.2, 1)
    np.testing.assert_array_equal(ds.train_y, y[tr].astype(np.float32))
    np.testing.assert_array_equal(ds.test_y, y[te].astype(np.float32))
    np.testing.assert_array_equal(ds.train_x, x[tr].astype(np.float32))
    path = save_npz(ds, tmp_path / "reg")
    back = load_dataset(f"npz:{path}")
    assert back.num_classes == 0 and back.is_regression
    for field in ("train_x", "train_y", "test_x", "test_y"):
        a, b = getattr(back, field), getattr(ds, field)
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)
    # a plain npz with float targets and no num_classes key is a regression set too
    np.savez(tmp_path / "plain.npz", x_train=x, y_train=y)
    plain = load_dataset(f"npz:{tmp_path / 'plain.npz'}", seed=1)
    assert plain.num_classes == 0
    np.testing.assert_array_equal(plain.train_y, ds.train_y)


def test_num_classes_decides_labels_or_targets():
    x = np.zeros((6, 2))
    as_labels = from_arrays(x, np.array([0.0, 1, 2, 0, 1, 2]), x_test=x[:3],
                            y_test=np.array([0.0, 1, 2]), num_classes=3)
    assert as_labels.train_y.dtype == np.int64 and as_labels.num_classes == 3
    as_targets = from_arrays(x, [0, 1, 2, 0, 1, 2], x_test=x[:3], y_test=[0, 1, 2],
                             num_classes=0)
    assert as_targets.train_y.dtype == np.float32 and as_targets.is_regression
    with pytest.raises(ValueError, match="NaN or infinite"):
        from_arrays(x, [0.5, np.nan, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="target shape"):
        from_arrays(x, np.zeros((6, 2)), x_test=x[:2], y_test=np.zeros((2, 3)))
    with pytest.raises(ValueError, match=r"\(n,\) or \(n, k\)"):
        from_arrays(x, np.zeros((6, 2, 2)))
    with pytest.raises(ValueError, match="num_classes"):
        from_arrays(x, [0, 1, 0, 1, 0, 1], num_classes=-1)


def test_dataset_validates_targets_against_num_classes():
    x = np.zeros((3, 2), np.float32)
    f1, i1 = np.zeros(3, np.float32), np.zeros(3, np.int64)
    reg = Dataset(x, np.zeros((3, 2), np.float32), x, np.zeros((3, 2), np.float32), 0,
                  (2,), "reg")
    assert reg.is_regression
    assert not Dataset(x, i1, x, i1, 2, (2,), "cls").is_regression
    with pytest.raises(ValueError, match="float regression targets"):
        Dataset(x, i1, x, i1, 0, (2,), "bad")
    with pytest.raises(ValueError, match="integer class labels"):
        Dataset(x, f1, x, f1, 2, (2,), "bad")
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        Dataset(x, np.zeros((3, 1), np.int64), x, np.zeros((3, 1), np.int64), 2, (2,), "b")
    with pytest.raises(ValueError, match="target shape"):
        Dataset(x, np.zeros((3, 2), np.float32), x, f1, 0, (2,), "bad")
    with pytest.raises(ValueError, match=">= 1"):
        Dataset(x, i1, x, i1, -1, (2,), "bad")


# --------------------------------------------------------------------------- partitions


def _labels(n_per_class: int = 300, classes: int = 10) -> np.ndarray:
    return np.repeat(np.arange(classes), n_per_class)


def _check_disjoint(parts: list[np.ndarray], n: int, complete: bool) -> None:
    allidx = np.concatenate(parts)
    assert len(np.unique(allidx)) == len(allidx), "partitions overlap"
    assert all(len(p) > 0 for p in parts)
    assert allidx.min() >= 0 and allidx.max() < n
    if complete:
        assert len(allidx) == n


def test_iid_partitions_balanced_disjoint_complete_deterministic():
    y = _labels()
    parts = partition_indices(y, 7, "iid", seed=3)
    assert len(parts) == 7
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1
    _check_disjoint(parts, len(y), complete=True)
    # shuffled, not contiguous blocks of one class
    assert len(np.unique(y[parts[0]])) == 10
    again = partition_indices(y, 7, "iid", seed=3)
    for a, b in zip(parts, again, strict=True):
        np.testing.assert_array_equal(a, b)
    other = partition_indices(y, 7, "iid", seed=4)
    assert not np.array_equal(parts[0], other[0])


@pytest.mark.parametrize(("n", "k"), [(103, 7), (100, 10), (50, 50), (1797, 200)])
def test_iid_shards_are_flwr_datasets_iid_partitions(n, k):
    """The shards computed at once are IidPartitioner's, row for row (runs stay identical)."""
    import datasets
    from flwr_datasets.partitioner import IidPartitioner

    perm = np.random.default_rng(1).permutation(n)
    partitioner = IidPartitioner(num_partitions=k)
    partitioner.dataset = datasets.Dataset.from_dict({"idx": perm, "label": np.zeros(n)})
    got = iid_shards(perm, k)
    assert len(got) == k
    for i, shard in enumerate(got):
        expected = np.asarray(partitioner.load_partition(i)["idx"], dtype=np.int64)
        assert shard.dtype == np.int64
        np.testing.assert_array_equal(shard, expected)


def _skew(y: np.ndarray, parts: list[np.ndarray], classes: int = 10) -> float:
    """Mean total-variation distance between each partition's and the global label mix."""
    glob = np.bincount(y, minlength=classes) / len(y)
    tv = [0.5 * np.abs(np.bincount(y[p], minlength=classes) / len(p) - glob).sum()
          for p in parts]
    return float(np.mean(tv))


def test_dirichlet_skew_grows_as_alpha_shrinks():
    y = _labels()
    skews = {}
    for alpha in (100.0, 1.0, 0.1):
        parts = partition_indices(y, 10, "dirichlet", alpha=alpha, seed=0)
        _check_disjoint(parts, len(y), complete=True)
        skews[alpha] = _skew(y, parts)
    assert skews[100.0] < skews[1.0] < skews[0.1]
    assert skews[100.0] < 0.1 and skews[0.1] > 0.4
    a = partition_indices(y, 10, "dirichlet", alpha=0.3, seed=5)
    b = partition_indices(y, 10, "dirichlet", alpha=0.3, seed=5)
    for pa, pb in zip(a, b, strict=True):
        np.testing.assert_array_equal(pa, pb)


def test_pathological_gives_k_classes_each():
    y = _labels(50)
    parts = partition_indices(y, 10, "pathological", classes_per_partition=2, seed=1)
    _check_disjoint(parts, len(y), complete=False)
    for p in parts:
        assert len(np.unique(y[p])) == 2
    # first class is deterministic, so all ten classes are used
    assert len(np.unique(y[np.concatenate(parts)])) == 10


def test_partition_errors():
    with pytest.raises(ValueError, match="non-empty"):
        partition_indices(np.zeros(3, np.int64), 5)
    with pytest.raises(ValueError, match="unknown partition scheme"):
        partition_indices(_labels(5), 2, "shards")
    with pytest.raises(ValueError, match="non-empty"):
        partition_indices(np.repeat(np.arange(2), 10), 10, "dirichlet", alpha=1e-4)
    with pytest.raises(ValueError, match="classes_per_partition"):
        partition_indices(_labels(5, 3), 2, "pathological", classes_per_partition=4)


def test_partition_cache_returns_fresh_arrays():
    y = _labels(20)
    first = partition_indices(y, 4, "dirichlet", alpha=0.5, seed=9)
    keep = first[0].copy()
    first[0][:] = -1
    second = partition_indices(y, 4, "dirichlet", alpha=0.5, seed=9)
    np.testing.assert_array_equal(second[0], keep)


def test_load_partition_returns_only_its_rows(tmp_path):
    rng = np.random.default_rng(0)
    ds = from_arrays(rng.random((80, 3, 2), dtype=np.float32), np.arange(80) % 4,
                     x_test=rng.random((8, 3, 2), dtype=np.float32), y_test=np.arange(8) % 4)
    path = save_npz(ds, tmp_path / "d.npz")
    name = f"npz:{path}"
    seen = []
    for pid in range(4):
        x, y, ids = load_partition(name, pid, 4, "dirichlet", alpha=1.0, seed=2)
        assert x.shape == (len(ids), 6) and y.shape == (len(ids),)
        np.testing.assert_array_equal(x, ds.train_x[ids])
        np.testing.assert_array_equal(y, ds.train_y[ids])
        assert x.flags.writeable and ids.dtype == np.int64
        seen.append(ids)
    _check_disjoint(seen, 80, complete=True)
    with pytest.raises(ValueError, match="partition_id"):
        load_partition(name, 4, 4)


@pytest.mark.parametrize("target_shape", [(), (3,)])
def test_iid_partitions_of_float_targets(target_shape):
    y = np.random.default_rng(0).standard_normal((101, *target_shape))
    parts = partition_indices(y, 4, "iid", seed=3)
    _check_disjoint(parts, 101, complete=True)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    # IID shards depend on the sample count only: the same as for any labels
    for a, b in zip(parts, partition_indices(np.arange(101) % 5, 4, "iid", seed=3),
                    strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("scheme", ["dirichlet", "pathological"])
def test_label_schemes_refuse_float_targets(scheme):
    y = np.linspace(0.0, 1.0, 50)
    with pytest.raises(ValueError, match=f"'{scheme}'.*float.*iid"):
        partition_indices(y, 2, scheme)


def test_load_partition_of_a_regression_set(tmp_path):
    rng = np.random.default_rng(0)
    ds = from_arrays(rng.standard_normal((40, 2, 2)) * 5.0, rng.standard_normal((40, 2)),
                     x_test=rng.standard_normal((6, 2, 2)), y_test=rng.standard_normal((6, 2)))
    name = f"npz:{save_npz(ds, tmp_path / 'r.npz')}"
    seen = []
    for pid in range(3):
        x, y, ids = load_partition(name, pid, 3, "iid", seed=1)
        assert x.shape == (len(ids), 4) and y.shape == (len(ids), 2)
        assert y.dtype == np.float32
        np.testing.assert_array_equal(x, ds.train_x[ids])
        np.testing.assert_array_equal(y, ds.train_y[ids])
        seen.append(ids)
    _check_disjoint(seen, 40, complete=True)
    with pytest.raises(ValueError, match="dirichlet"):
        load_partition(name, 0, 3, "dirichlet", alpha=0.5, seed=1)
