"""A device's own training data, as the client functions accept it.

``data`` may be a pair of numpy arrays ``(x, y)``, a map-style data set of ``(x, y)`` pairs
or dicts (keys from :data:`SAMPLE_KEYS`, :data:`LABEL_KEYS` or ``keys=("img", "label")``),
or a ``DataLoader`` over either. A dict of one number a column (a table read as a Hugging
Face ``Dataset``) is its columns side by side, in the dict's order, less its target
(``keys=(["age", "bmi"], "label")`` names them); a dict of several arrays (no input's name
among them) is several inputs, in the dict's order (``keys=(("acc", "gyro"), "activity")``).
A ``DataLoader`` with a ``collate_fn`` of its own is read through it (:func:`_collated`).
Every form becomes, in a fixed row order, float32 ``x`` ``(n, *sample_shape)`` as given,
and int64 class labels or float32 targets ``y``. Torch's types are checked only where torch
is already imported.

Samples of several inputs (``TensorDataset(x_num, x_cat, y)``, items ``((x1, x2), y)``, for a
model called ``model(x1, x2)``) become one flat row each, the parts side by side, with
their layout (:func:`as_inputs`; :mod:`dq_flower.wire.input_parts`); :func:`as_arrays`
refuses them.
"""

from __future__ import annotations

import itertools
import sys
import weakref
from collections.abc import Callable, Mapping, Sequence
from logging import WARNING
from typing import Any

import numpy as np

from dq_flower.input_arrays import is_class_target, missing_values, normalise, to_numpy
from dq_flower.sample_keys import (
    LABEL_KEYS,
    MASK_KEYS,
    SAMPLE_KEYS,
    Keys,
    dict_keys,
    hashable_keys,
    is_number,
    target_parts,
    target_row,
    tell_once,
)
from dq_flower.wire.input_parts import layout_name, parts_width
from dq_flower.wire.targets import ids_below  # one rule for ids and class indices

__all__ = ["as_arrays", "as_inputs", "ids_below", "is_class_target", "dict_keys", "target_parts",
           "forward_keys", "Keys", "SAMPLE_KEYS", "LABEL_KEYS"]

#: Converted arrays by ``(id(data), keys)``, dropped when ``data`` is collected.
_CACHE: dict[tuple[Any, ...], tuple[Any, tuple[np.ndarray, np.ndarray, tuple[str, ...]]]] = {}


#: What to do with a model of several inputs where they are not read (the gradient baselines).
SEVERAL_INPUTS = ("these devices train on one input tensor a sample: concatenate the inputs "
                  "(torch.cat of the flattened parts) and split them in the model's forward "
                  "(DQStrategy's dq_train takes several)")


def forward_keys(data: Any, names: Sequence[str]) -> Keys | None:
    """``keys=`` of dict samples holding a model's inputs ``names`` (its ``forward``'s).

    The leading ones the first sample holds, two or more, in that order (``{"x", "length",
    "label"}`` for ``forward(x, length)``), its target a target name; else ``None``.
    """
    try:
        first = getattr(data, "dataset", data)[0]  # a DataLoader's data set
    except (LookupError, TypeError, ValueError, NotImplementedError):  # the common names decide
        return None
    if not isinstance(first, Mapping):
        return None
    taken = tuple(itertools.takewhile(lambda name: name in first, names))
    target = next((k for k in LABEL_KEYS if k in first and k not in taken), None)
    return (taken, target) if len(taken) > 1 and target is not None else None


def _pair(item: Any, keys: Keys | None, what: str, masks: bool = False,
          batch: bool = False) -> tuple[Any, Any]:
    if isinstance(item, Mapping) and any(isinstance(v, Mapping) for v in item.values()):
        raise ValueError(f"{what} is a dict of dicts (keys {sorted(map(str, item))}): give "
                         "one input and one target an item, {\"image\": tensor, \"label\": "
                         "int} (a Dataset whose __getitem__ flattens them)")
    if isinstance(item, Mapping):
        kx, ky = dict_keys(item, keys, what, batch)
        if isinstance(kx, tuple) and all(is_number(item[k], batch) for k in kx):  # columns
            return np.stack([to_numpy(item[k]).astype(np.float32) for k in kx], -1), item[ky]
        if isinstance(kx, tuple):  # arrays: the model's inputs, in this order
            return (tuple(item[k] for k in kx) if len(kx) > 1 else item[kx[0]]), item[ky]
        more = [k for k in MASK_KEYS if k in item and k != ky] if kx == "input_ids" else []
        if masks and more:  # (input_ids, attention_mask): the model's inputs, in its order
            return (item[kx], *[item[k] for k in more]), item[ky]
        return item[kx], item[ky]
    if not isinstance(item, (tuple, list)) or len(item) < 2:
        raise ValueError(f"{what} must be a pair (x, y) or a dict, got {type(item).__name__}")
    if isinstance(item[0], Mapping):
        raise ValueError(f"{what} holds a dict of inputs before its target: give the inputs "
                         "as a tuple ((x1, x2), y), or one input tensor")
    if isinstance(item[1], Mapping):  # several targets: side by side (target_parts)
        item = (item[0], target_row(item[1], batch, what), *item[2:])
    if len(item) > 2:  # (x, y, weight) or (x, y, sample id): not read; said once
        tell_once(("%s: items of %s values; DQ reads the first two as (x, y) and leaves out "
                    "the others (an id is not needed; DQ's server weighs no rows by a sample "
                    "weight: class weights go in DQStrategy's loss_fn; several inputs: give "
                    "((x1, x2), y))",
                    what.partition("[")[0], str(len(item))), WARNING)
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
        return tuple(parts), join([to_numpy(y) for _, y in pairs])
    xs = [to_numpy(x) for x, _ in pairs]
    shapes = sorted({x.shape[1:] if join is np.concatenate else x.shape for x in xs})
    if len(shapes) > 1:  # e.g. a tokenizer's ids without padding
        raise ValueError(f"the samples have different shapes ({shapes[0]} and {shapes[-1]}):"
                         " give every sample one shape (pad token ids to one length)")
    return join(xs), join([to_numpy(y) for _, y in pairs])


def _flattened(inputs: tuple[Any, ...], y: Any, what: str
               ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Several inputs a sample side by side in one flat row each, with their layout."""
    arrays = [to_numpy(a) for a in inputs]
    if any(a.ndim < 1 or a.shape[0] != arrays[0].shape[0] for a in arrays):
        raise ValueError(f"{what}: the inputs have different numbers of samples")
    n = arrays[0].shape[0]
    parts = tuple(layout_name(a.shape[1:], is_class_target(a)) for a in arrays)
    try:
        parts_width(parts)  # the rule the server reads them by
    except ValueError as exc:
        raise ValueError(f"{what}: {exc}") from None
    x, ya = normalise(np.concatenate([a.reshape(n, -1).astype(np.float32) for a in arrays],
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
        return (*normalise(data[0], data[1], "data (x, y)"), ())
    if torch is not None and isinstance(data, DataLoader):
        inner, default = _sampled(data), _default_collate(data.collate_fn)
        if not isinstance(inner, IterableDataset) and hasattr(inner, "__len__"):
            return _convert(inner, keys, one_input, masks) if default else \
                _collated(data, inner, keys, masks)
        pairs = [_pair(batch, keys, "a DataLoader batch", masks, True) for batch in data]
        if not pairs:
            raise ValueError("the DataLoader yielded no batches")
        if len(_shapes(pairs)) > 1:
            raise ValueError(f"the DataLoader's batches have different shapes {_shapes(pairs)}"
                             " (a collate_fn padding each batch to its own longest?): pad "
                             "every sample to one length in it (a stream is read once)")
        return _with_layout(*_joined(pairs, np.concatenate), "DataLoader")
    if (torch is not None and isinstance(data, Dataset)) or (
            hasattr(data, "__getitem__") and hasattr(data, "__len__")):
        if (torch is not None and isinstance(data, torch.utils.data.TensorDataset)
                and len(data.tensors) >= 2):
            if len(data.tensors) > 2 and not one_input:  # (x1, x2, ..., y): a model's inputs
                return _flattened(data.tensors[:-1], data.tensors[-1], "TensorDataset")
            return (*normalise(data.tensors[0], data.tensors[1], "TensorDataset"), ())
        name = type(data).__name__
        items = [data[i] for i in range(len(data))]
        if not items:
            raise ValueError(f"{name} is empty")
        pairs = [_pair(item, keys, f"{name}[{i}]", masks) for i, item in enumerate(items)]
        return _with_layout(*_joined(pairs, np.stack), name)
    raise TypeError("data must be numpy arrays (x, y), a map-style data set of (x, y) pairs "
                    f"or dicts, or a DataLoader; got {type(data).__name__}")


def _default_collate(collate: Any) -> bool:
    """Whether ``collate`` is PyTorch's own (the loader's batches are its items stacked)."""
    # PyTorch: imported already (a DataLoader)
    from torch.utils.data import default_collate, default_convert

    return collate in (default_collate, default_convert)


def _shapes(pairs: list[tuple[Any, Any]]) -> list[tuple[tuple[int, ...], ...]]:
    """The distinct shapes of the batches' inputs (each part's, less the batch axis)."""
    return sorted({tuple(to_numpy(p).shape[1:] for p in (x if isinstance(x, tuple) else (x,)))
                   for x, _ in pairs})


def _sampled(loader: Any) -> Any:
    """The loader's data set, cut to the rows its sampler draws from, in index order.

    PyTorch's sequential and random samplers draw from every row; a ``SubsetRandomSampler``
    (or any sampler with ``indices``) from its indices, a ``WeightedRandomSampler`` from the
    rows of a weight above 0, another sampler from the rows one pass of it yields (a node
    whose loader samples its share of a data set it holds whole uploads that share only).
    """
    # PyTorch: imported already (a DataLoader)
    from torch.utils.data import (
        IterableDataset,
        RandomSampler,
        SequentialSampler,
        Subset,
        WeightedRandomSampler,
    )

    data, sampler = loader.dataset, loader.sampler
    if isinstance(data, IterableDataset) or type(sampler) in (SequentialSampler, RandomSampler):
        return data
    if isinstance(sampler, WeightedRandomSampler):
        rows = np.flatnonzero(to_numpy(sampler.weights) > 0)
    else:
        rows = np.unique(np.fromiter((int(i) for i in getattr(sampler, "indices", sampler)),
                                     dtype=np.int64))
    if rows.size == len(data) and np.array_equal(rows, np.arange(len(data))):
        return data
    tell_once(("the DataLoader's %s draws %s of its data set's %s rows: those are the node's",
                type(sampler).__name__, str(rows.size), str(len(data))))
    return Subset(data, rows.tolist())


def _collated(loader: Any, data: Any, keys: Keys | None, masks: bool
              ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """A loader's items in index order through its own ``collate_fn`` (padding, tokenising).

    Batches of its batch size; where they come out of different shapes (a ``collate_fn``
    padding each batch to its own longest), every item at once, one batch the ``collate_fn``
    pads to one length, the node's longest (told once).
    """
    collate = loader.collate_fn
    items, what = [data[i] for i in range(len(data))], f"{type(data).__name__} collated"
    if not items:
        raise ValueError(f"{type(data).__name__} is empty")
    if loader.batch_sampler is None:  # batch_size=None: collate_fn maps one item at a time
        pairs = [_pair(collate(item), keys, f"{what}[{i}]", masks) for i, item in
                 enumerate(items)]
        return _with_layout(*_joined(pairs, np.stack), what)
    size = loader.batch_size or 64
    pairs = [_pair(collate(items[i:i + size]), keys, what, masks, True)
             for i in range(0, len(items), size)]
    if len(shapes := _shapes(pairs)) > 1:
        pairs = [_pair(collate(items), keys, what, masks, True)]
        tell_once(("the DataLoader's collate_fn pads each batch to its own length (%s to %s):"
                    " its %s samples read as one batch of them all, padded to %s", str(shapes[0]),
                    str(shapes[-1]), str(len(items)), str(_shapes(pairs)[0])))
    return _with_layout(*_joined(pairs, np.concatenate), what)


def _with_layout(x: Any, y: np.ndarray, what: str
                 ) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    if isinstance(x, tuple):
        return _flattened(x, y, what)
    return (*normalise(x, y, what), ())


def as_arrays(data: Any, keys: Keys | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The device's data as ``(x, y)`` numpy arrays (see the module docstring).

    Raises ``TypeError`` for an unsupported type, ``ValueError`` for inconsistent,
    non-finite or empty data, dict keys not found, or samples of several inputs.
    """
    if named := target_parts(data):
        raise ValueError(f"the samples' targets are a dict ({', '.join(named)}): DQ's "
                         "dq_train reads them (with DQStrategy's loss_fn); these devices "
                         "take one target a sample")
    x, y, parts = as_inputs(data, keys, masks=False)  # a tokenizer's mask left out
    if parts:
        raise ValueError(f"samples of {len(parts)} inputs: {SEVERAL_INPUTS}")
    return x, y


def as_inputs(data: Any, keys: Keys | None = None, one_input: bool = False, masks: bool = True,
              nan: str = "") -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """``(x, y, parts)``: as :func:`as_arrays`, and samples of several inputs flattened.

    ``parts`` names each input's layout (``"f5"``: 5 floats, ``"i3"``: 3 integers, ``"f3x4"``:
    a (3, 4) float input), ``x`` holding them side by side; ``()`` for one input.
    ``one_input`` (the server's ask, its model taking one input): a ``TensorDataset`` of more
    than two tensors is ``(x, y, ...)``, the others (sample weights) left out, and a dict's
    ``input_ids`` its only input. ``masks``: a dict's :data:`MASK_KEYS` beside its
    ``input_ids`` are more inputs (unless ``one_input``); other keys than its input and
    target (an id, a second label) are left out. ``nan``: NaN values as 0 (``"zero"``), or
    kept (``"keep"``).
    """
    masks = masks and not one_input
    key = (id(data), hashable_keys(keys), one_input, masks, nan)
    hit = _CACHE.get(key)
    if hit is not None and hit[0]() is data:
        return hit[1]
    with missing_values(nan):
        arrays = _convert(data, keys, one_input, masks)
    if one_input and arrays[2]:
        raise ValueError(f"the server's model takes one input, the samples hold "
                         f"{len(arrays[2])} ({', '.join(arrays[2])}): give a model taking "
                         "them all, or name one input (keys=(\"acc\", \"label\") of a dict)")
    try:
        ref = weakref.ref(data)
    except TypeError:  # tuples and lists cannot be weakly referenced: convert each time
        return arrays
    _CACHE[key] = (ref, arrays)
    weakref.finalize(data, _CACHE.pop, key, None)
    return arrays
