"""A device's own training data, as the client functions accept it.

``data`` may be a pair of numpy arrays ``(x, y)``, a map-style data set of ``(x, y)`` pairs
or dicts (keys from :data:`SAMPLE_KEYS`, :data:`LABEL_KEYS` or ``keys=("img", "label")``),
or a ``DataLoader`` over either. A dict of one number a column (a table read as a Hugging
Face ``Dataset``) is its columns side by side, in the dict's order, less its target
(``keys=(["age", "bmi"], "label")`` names them). Every form becomes, in a fixed row order,
float32 ``x`` ``(n, *sample_shape)`` as given, and int64 class labels or float32 targets
``y``. Torch's types are checked only where torch is already imported.

Samples of several inputs (``TensorDataset(x_num, x_cat, y)``, items ``((x1, x2), y)``, for a
model called ``model(x1, x2)``) become one flat row each, the parts side by side, with
their layout (:func:`as_inputs`; :mod:`dq_flower.wire.input_parts`); :func:`as_arrays`
refuses them.
"""

from __future__ import annotations

import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from logging import INFO
from typing import Any, TypeAlias

import numpy as np

from dq_flower.wire.input_parts import layout_name, parts_width
from dq_flower.wire.targets import ids_below  # one rule for ids and class indices

__all__ = ["as_arrays", "as_inputs", "ids_below", "is_class_target", "dict_keys",
           "Keys", "SAMPLE_KEYS", "LABEL_KEYS"]

#: ``keys=`` of a dict sample: ``(input key, target key)``, or ``(input keys, target key)``,
#: a list of columns of one number each read side by side (``(["age", "bmi"], "label")``).
Keys: TypeAlias = "tuple[str | Sequence[str], str]"

#: Names of a dict sample's input, in order of preference (flwr-datasets' image sets use
#: ``img`` or ``image``, Hugging Face processors ``pixel_values``; sensor windows
#: ``signal``; Hugging Face tokenizers ``input_ids``, padded to one length).
SAMPLE_KEYS = ("img", "image", "pixel_values", "pixels", "x", "features", "signal",
               "input_ids", "inputs")
#: Names of a dict sample's target, in order of preference (``fine_label``: flwr-datasets'
#: CIFAR-100; ``character``: its FEMNIST).
LABEL_KEYS = ("label", "labels", "y", "target", "fine_label", "character")
#: A tokenizer's further inputs beside ``input_ids``, in the order transformers models take
#: them (``forward(input_ids, attention_mask, token_type_ids)``): read as more inputs.
MASK_KEYS = ("attention_mask", "token_type_ids")

#: Converted arrays by ``(id(data), keys)``, dropped when ``data`` is collected.
_CACHE: dict[tuple[Any, ...], tuple[Any, tuple[np.ndarray, np.ndarray, tuple[str, ...]]]] = {}


def is_class_target(y: np.ndarray) -> bool:
    """Whether ``y`` holds class labels (integers or booleans) rather than float targets."""
    return np.issubdtype(y.dtype, np.integer) or y.dtype == np.bool_


#: What to do with a model of several inputs where they are not read (the gradient baselines).
SEVERAL_INPUTS = ("these devices train on one input tensor a sample: concatenate the inputs "
                  "(torch.cat of the flattened parts) and split them in the model's forward "
                  "(DQStrategy's dq_train takes several)")


def _to_numpy(value: Any) -> np.ndarray:
    torch = sys.modules.get("torch")  # never imported here
    if torch is not None and isinstance(value, torch.Tensor):
        return value.detach().cpu().numpy()
    if hasattr(value, "toarray") and hasattr(value, "nnz"):  # a SciPy sparse matrix (TF-IDF)
        return np.asarray(value.toarray())
    out = np.asarray(value)
    if out.dtype == object and hasattr(value, "to_numpy") and hasattr(value, "isna"):
        return _pandas_numbers(value, out)
    return out


def _pandas_numbers(value: Any, mixed: np.ndarray) -> np.ndarray:
    """A pandas frame or series whose columns are all numbers or booleans, as one array.

    ``pd.get_dummies`` (bool columns beside float ones) and nullable ``Int64`` columns make
    ``np.asarray`` an object array; they are numbers: int64 where every column is integer or
    bool and no value is missing, else float64 (a missing value as NaN, refused later with
    its reason). ``mixed`` (the object array) is returned where a column is not a number.
    """
    dtypes = list(value.dtypes) if hasattr(value, "columns") else [value.dtype]
    try:
        kinds = {np.dtype(getattr(d, "numpy_dtype", d)).kind for d in dtypes}
    except TypeError:  # a dtype numpy does not know (categories, strings)
        return mixed
    if not kinds <= set("biuf"):
        return mixed
    if kinds <= set("biu") and not bool(np.asarray(value.isna()).any()):
        return value.to_numpy(dtype=np.int64)
    return value.to_numpy(dtype=np.float64, na_value=np.nan)


def _normalise(x: Any, y: Any, what: str) -> tuple[np.ndarray, np.ndarray]:
    xa, ya = _to_numpy(x), _to_numpy(y)
    if xa.ndim < 1 or ya.ndim < 1:
        raise ValueError(f"{what}: x and y need a leading sample axis")
    if xa.shape[0] != ya.shape[0]:
        raise ValueError(f"{what}: x has {xa.shape[0]} samples, y has {ya.shape[0]}")
    if xa.ndim == 1:
        xa = xa.reshape(-1, 1)
    if not (np.issubdtype(xa.dtype, np.number) or xa.dtype == np.bool_):
        named = [f"{c!r} ({t})" for c, t in getattr(x, "dtypes", {}).items()
                 if str(t) in ("object", "category", "string", "str")]
        raise ValueError(f"{what}: x must be numeric, got dtype {xa.dtype}"
                         + (f": columns {', '.join(named)}" if named else "")
                         + " (a table's text columns: encode them as numbers, one mapping for "
                         "every node; a category column: frame[col].cat.codes, the same "
                         "categories everywhere)")
    xa = np.ascontiguousarray(xa, dtype=np.float32)
    if xa.size and not np.isfinite(xa).all():
        raise ValueError(f"{what}: x contains NaN or infinite values: DQ quantizes values, so "
                         "fill missing ones on the device before dq_train (as your model "
                         "would, e.g. np.nan_to_num, or each column's mean)")
    if is_class_target(ya) and ya.ndim > 1 and ya[0].size > 1:
        ya = _several_labels(ya, what)
    if is_class_target(ya):
        ya = ya.astype(np.int64).reshape(-1)
        if ya.size and ya.min() < 0:
            raise ValueError(f"{what}: class labels must be >= 0, got {int(ya.min())}")
    elif np.issubdtype(ya.dtype, np.floating):
        ya = np.ascontiguousarray(ya, dtype=np.float32)
        if ya.ndim > 2 and not (ya.shape == xa.shape and np.array_equal(ya, xa)):
            raise ValueError(f"{what}: float targets must be (n,) or (n, k) (or the samples "
                             f"themselves, an autoencoder's), got {ya.shape}")
        if ya.size and not np.isfinite(ya).all():
            raise ValueError(f"{what}: y contains NaN or infinite values")
    else:
        hint = ("; map class names to ids with one mapping for every node (a fixed list of "
                "names; a LabelEncoder fitted on each node's own labels numbers them apart)"
                if ya.dtype.kind in "OUS" else "")
        raise ValueError(f"{what}: y must hold integer labels or float targets, "
                         f"got dtype {ya.dtype}{hint}")
    return xa, ya


def _several_labels(ya: np.ndarray, what: str) -> np.ndarray:
    """Integer targets of several values a sample: 0/1 labels ``(n, k)`` as float32 targets.

    (``MultiLabelBinarizer`` and ``one_hot`` give them as integers; a multi-label model's
    loss reads them as floats.) Anything else is refused: one class label a sample is what
    DQ's rows carry, and a flattened ``(n, h, w)`` mask would pair labels with other rows.
    """
    if ya.ndim == 2 and ya.size and np.isin(ya, (0, 1)).all():
        return ya.astype(np.float32)
    raise ValueError(
        f"{what}: integer targets of shape {ya.shape}: DQ takes one class label a sample "
        "(n,), 0/1 labels (n, k) for several labels a sample, or float targets; labels per "
        "element of a sample (segmentation masks, per-token tags) are not supported")


def _number(value: Any, batch: bool) -> bool:
    """One number (a batch's column of them): a 0-d tensor or array, a numpy or Python one."""
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return not batch
    if getattr(value, "ndim", None) != int(batch) or isinstance(value, (str, bytes)):
        return False
    return _to_numpy(value).dtype.kind in "biuf"


def _table_columns(sample: Mapping[str, Any], batch: bool) -> tuple[str, ...] | None:
    """A dict of one number a column (none an input's name): its columns, its target last.

    The target is the first of :data:`LABEL_KEYS` present; ``None`` where the dict is not
    such a table (one column beside its target reads as before).
    """
    if len(sample) < 3 or any(k in sample for k in SAMPLE_KEYS) \
            or not all(np.ndim(v) == int(batch) for v in sample.values()):
        return None
    target = next((k for k in LABEL_KEYS if k in sample), None)
    if target is None:
        return None
    text = [f"{k!r} ({type(v).__name__})" for k, v in sample.items()
            if k != target and not _number(v, batch)]
    if text:
        raise ValueError(f"dict samples of one value a column: {', '.join(text)} not a number"
                         " (encode a text column as numbers, one mapping for every node)")
    return (*[str(k) for k in sample if k != target], target)


#: The tables whose columns were reported stacked (once each).
_TOLD: set[tuple[str, ...]] = set()


def _tell_columns(columns: tuple[str, ...]) -> None:
    if columns not in _TOLD:
        _TOLD.add(columns)
        from flwr.common.logger import log  # Flower's logger: the node's log

        log(INFO, "dict samples of one number a column: inputs %s side by side, target %r",
            ", ".join(columns[:-1]), columns[-1])


def dict_keys(sample: Mapping[str, Any], keys: Keys | None, what: str,
              batch: bool = False) -> tuple[str | tuple[str, ...], str]:
    """The (input, target) keys of a dict sample: ``keys``, else common names; or ValueError.

    A sample of two keys, one of them a common name, has the other for the other part; of
    two other keys, the one holding a single value is the target. A sample of one number
    a column has a tuple of its columns for its input (``batch``: a loader's batch of them).
    """
    seen = sorted(str(k) for k in sample)
    if keys is not None:
        if len(keys) != 2 or not isinstance(keys[1], str):
            raise ValueError("keys must be (input key, target key) or (input keys, target "
                             f"key), e.g. ([\"age\", \"bmi\"], \"label\"), got {keys!r}")
        inputs = (keys[0],) if isinstance(keys[0], str) else tuple(keys[0])
        missing = [k for k in (*inputs, keys[1]) if k not in sample]
        if missing:
            raise ValueError(f"{what} has keys {seen}; keys={_hashable(keys)!r} names "
                             f"{missing}, which it lacks")
        if isinstance(keys[0], str):
            return keys[0], keys[1]
        wide = [f"{k!r} {tuple(np.shape(sample[k]))}" for k in inputs
                if not _number(sample[k], batch)]
        if wide or not inputs:
            raise ValueError(f"{what}: a list of input keys names columns of one number each; "
                             + (f"{', '.join(wide)} not" if wide else "it names none"))
        return inputs, keys[1]
    columns = _table_columns(sample, batch)
    if columns is not None:
        _tell_columns(columns)
        return columns[:-1], columns[-1]
    found = [next((k for k in names if k in sample), None)
             for names in (SAMPLE_KEYS, LABEL_KEYS)]
    rest = [str(k) for k in sample if k not in found]
    if found.count(None) == 1 and len(rest) == 1:  # two keys, one known: the other is the other
        found[found.index(None)] = rest[0]
    scalars = [k for k in rest if np.ndim(sample[k]) == 0]
    if found == [None, None] and len(rest) == 2 and len(scalars) == 1:  # {"x": row, "y": 3}
        found = [next(k for k in rest if k != scalars[0]), scalars[0]]
    if found[0] is None or found[1] is None:
        raise ValueError(
            f"{what} is a dict with keys {seen}; found no "
            f"{'input' if found[0] is None else 'target'} among "
            f"{SAMPLE_KEYS if found[0] is None else LABEL_KEYS}: pass "
            "keys=(input key, target key), e.g. keys=(\"img\", \"label\"), or for one "
            "number a column keys=(input keys, target key), e.g. keys=([\"age\", \"bmi\"], "
            "\"label\")")
    return found[0], found[1]


def _hashable(keys: Keys | None) -> tuple[Any, ...] | None:
    """``keys`` as a tuple of strings and tuples (a list of input keys as a tuple)."""
    if keys is None:
        return None
    return tuple(k if isinstance(k, str) else tuple(k) for k in keys)


def _pair(item: Any, keys: Keys | None, what: str, masks: bool = False,
          batch: bool = False) -> tuple[Any, Any]:
    if isinstance(item, Mapping) and any(isinstance(v, Mapping) for v in item.values()):
        raise ValueError(f"{what} is a dict of dicts (keys {sorted(map(str, item))}): give "
                         "one input and one target an item, {\"image\": tensor, \"label\": "
                         "int} (a Dataset whose __getitem__ flattens them)")
    if isinstance(item, Mapping):
        kx, ky = dict_keys(item, keys, what, batch)
        if isinstance(kx, tuple):  # columns of one number each, side by side
            return np.stack([_to_numpy(item[k]).astype(np.float32) for k in kx], -1), item[ky]
        more = [k for k in MASK_KEYS if k in item and k != ky] if kx == "input_ids" else []
        if masks and more:  # (input_ids, attention_mask): the model's inputs, in its order
            return (item[kx], *[item[k] for k in more]), item[ky]
        return item[kx], item[ky]
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise ValueError(f"{what} must be a pair (x, y) or a dict, got {type(item).__name__}")
    if isinstance(item[0], Mapping):
        raise ValueError(f"{what} holds a dict of inputs before its target: give the inputs "
                         "as a tuple ((x1, x2), y), or one input tensor")
    x = item[0]
    if isinstance(x, (tuple, list)) and len(x) > 1 and all(hasattr(v, "shape") for v in x):
        return tuple(x), item[1]  # several inputs: arrays or tensors, not a list of numbers
    return (np.asarray(x) if isinstance(x, tuple) else x), item[1]


def _joined(pairs: list[tuple[Any, Any]], join: Callable[[list], np.ndarray]
            ) -> tuple[Any, np.ndarray]:
    """The pairs' inputs joined (per part where each is a tuple of inputs) and targets."""
    first = pairs[0][0]
    if isinstance(first, tuple):
        if not all(isinstance(x, tuple) and len(x) == len(first) for x, _ in pairs):
            raise ValueError("the samples hold different numbers of inputs")
        parts = [_joined([(x[k], y) for x, y in pairs], join)[0] for k in range(len(first))]
        return tuple(parts), join([_to_numpy(y) for _, y in pairs])
    xs = [_to_numpy(x) for x, _ in pairs]
    shapes = sorted({x.shape[1:] if join is np.concatenate else x.shape for x in xs})
    if len(shapes) > 1:  # e.g. a tokenizer's ids without padding
        raise ValueError(f"the samples have different shapes ({shapes[0]} and {shapes[-1]}):"
                         " give every sample one shape (pad token ids to one length)")
    return join(xs), join([_to_numpy(y) for _, y in pairs])


def _flattened(inputs: tuple[Any, ...], y: Any, what: str
               ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Several inputs a sample side by side in one flat row each, with their layout."""
    arrays = [_to_numpy(a) for a in inputs]
    if any(a.ndim < 1 or a.shape[0] != arrays[0].shape[0] for a in arrays):
        raise ValueError(f"{what}: the inputs have different numbers of samples")
    n = arrays[0].shape[0]
    parts = tuple(layout_name(a.shape[1:], is_class_target(a)) for a in arrays)
    try:
        parts_width(parts)  # the rule the server reads them by
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    x, ya = _normalise(np.concatenate([a.reshape(n, -1).astype(np.float32) for a in arrays],
                                      axis=1), y, what)
    return x, ya, parts


def _convert(data: Any, keys: Keys | None = None, one_input: bool = False,
             masks: bool = False) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    torch = sys.modules.get("torch")
    if torch is not None:
        # PyTorch: loaded only where a model is at hand
        from torch.utils.data import DataLoader, Dataset, IterableDataset

        if isinstance(data, IterableDataset):
            raise TypeError(
                f"data is an IterableDataset ({type(data).__name__}): read it through a "
                "DataLoader (DataLoader(data, batch_size=...)), or give a map-style Dataset")

    if hasattr(data, "columns") and hasattr(data, "iloc"):  # a whole pandas frame
        raise TypeError(
            "data is a pandas DataFrame: give its features and its target apart, "
            "(frame.drop(columns=\"target\"), frame[\"target\"]), with your target's column")
    if isinstance(data, (tuple, list)) and len(data) == 2 \
            and not isinstance(data[0], (tuple, Mapping)):
        return (*_normalise(data[0], data[1], "data (x, y)"), ())
    if torch is not None and isinstance(data, DataLoader):
        inner = data.dataset
        if not isinstance(inner, IterableDataset) and hasattr(inner, "__len__"):
            return _convert(inner, keys, one_input, masks)
        pairs = [_pair(batch, keys, "a DataLoader batch", masks, True) for batch in data]
        if not pairs:
            raise ValueError("the DataLoader yielded no batches")
        return _with_layout(*_joined(pairs, np.concatenate), "DataLoader")
    if (torch is not None and isinstance(data, Dataset)) or (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if (torch is not None and isinstance(data, torch.utils.data.TensorDataset)
                and len(data.tensors) >= 2):
            if len(data.tensors) > 2 and not one_input:  # (x1, x2, ..., y): a model's inputs
                return _flattened(data.tensors[:-1], data.tensors[-1], "TensorDataset")
            return (*_normalise(data.tensors[0], data.tensors[1], "TensorDataset"), ())
        name = type(data).__name__
        items = [data[i] for i in range(len(data))]
        if not items:
            raise ValueError(f"{name} is empty")
        pairs = [_pair(item, keys, f"{name}[{i}]", masks) for i, item in enumerate(items)]
        return _with_layout(*_joined(pairs, np.stack), name)
    raise TypeError("data must be numpy arrays (x, y), a map-style data set of (x, y) pairs "
                    f"or dicts, or a DataLoader; got {type(data).__name__}")


def _with_layout(x: Any, y: np.ndarray, what: str
                 ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    if isinstance(x, tuple):
        return _flattened(x, y, what)
    return (*_normalise(x, y, what), ())


def as_arrays(data: Any, keys: Keys | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The device's data as ``(x, y)`` numpy arrays (see the module docstring).

    Raises ``TypeError`` for an unsupported type, ``ValueError`` for inconsistent,
    non-finite or empty data, dict keys not found, or samples of several inputs.
    """
    x, y, parts = as_inputs(data, keys, masks=False)  # a tokenizer's mask left out
    if parts:
        raise ValueError(f"samples of {len(parts)} inputs: {SEVERAL_INPUTS}")
    return x, y


def as_inputs(data: Any, keys: Keys | None = None, one_input: bool = False,
              masks: bool = True) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(x, y, parts)``: as :func:`as_arrays`, and samples of several inputs flattened.

    ``parts`` names each input's layout (``"f5"``: 5 floats, ``"i3"``: 3 integers, ``"f3x4"``:
    a (3, 4) float input), ``x`` holding them side by side; ``()`` for one input.
    ``one_input`` (the server's ask, its model taking one input): a ``TensorDataset`` of more
    than two tensors is ``(x, y, ...)``, the others (sample weights) left out, and a dict's
    ``input_ids`` its only input. ``masks``: a dict's :data:`MASK_KEYS` beside its
    ``input_ids`` are more inputs (unless ``one_input``); other keys than its input and
    target (an id, a second label) are left out.
    """
    masks = masks and not one_input
    key = (id(data), _hashable(keys), one_input, masks)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is data:
        return hit[1]
    arrays = _convert(data, keys, one_input, masks)
    try:
        ref = weakref.ref(data)
    except TypeError:  # tuples and lists cannot be weakly referenced: convert each time
        return arrays
    _CACHE[key] = (ref, arrays)
    weakref.finalize(data, _CACHE.pop, key, None)
    return arrays
