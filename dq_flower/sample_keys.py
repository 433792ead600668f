"""A dict sample's input and target keys: the names given, else the common ones.

Split from :mod:`dq_flower.data_input`, which reads a device's data set through
:func:`dict_keys`; :func:`tell_once` logs a node's reading of its data once.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from logging import INFO
from typing import Any, TypeAlias

import numpy as np

from dq_flower.input_arrays import to_numpy
from dq_flower.wire.input_parts import layout_name

__all__ = ["Keys", "SAMPLE_KEYS", "LABEL_KEYS", "MASK_KEYS", "dict_keys", "is_number",
           "tell_once", "hashable_keys", "target_parts", "target_row"]

#: ``keys=`` of a dict sample: ``(input key, target key)``, or ``(input keys, target key)``:
#: columns of one number each read side by side (``(["age", "bmi"], "label")``), or, where
#: one is an array, the model's inputs in that order (``(("acc", "gyro"), "activity")``).
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


def is_number(value: Any, batch: bool) -> bool:
    """One number (a batch's column of them): a 0-d tensor or array, a numpy or Python one."""
    if isinstance(value, (bool, int, float, np.number, np.bool_)):
        return not batch
    if getattr(value, "ndim", None) != int(batch) or isinstance(value, (str, bytes)):
        return False
    return to_numpy(value).dtype.kind in "biuf"


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
            if k != target and not is_number(v, batch)]
    if text:
        raise ValueError(f"dict samples of one value a column: {', '.join(text)} not a number"
                         " (encode a text column as numbers, one mapping for every node)")
    return (*[str(k) for k in sample if k != target], target)


def _array_inputs(sample: Mapping[str, Any], target: str | None, batch: bool,
                  what: str) -> tuple[str, ...] | None:
    """A dict of several arrays (none an input's name): their keys, in order, its target last.

    The target is the first of :data:`LABEL_KEYS` present, else the one number beside the
    arrays (further numbers, an id, are left out); ``None`` where fewer than two arrays are
    left; ``ValueError`` where the target cannot be told.
    """
    arrays = [str(k) for k, v in sample.items() if np.ndim(v) > int(batch) and k != target]
    if len(arrays) < 2:
        return None
    numbers = [str(k) for k, v in sample.items() if is_number(v, batch) and not _names_id(k)]
    if target is None and len(numbers) != 1:
        raise ValueError(
            f"{what} is a dict with keys {sorted(map(str, sample))}: its arrays "
            f"{', '.join(map(repr, arrays))} read as the model's inputs, but no target is "
            f"among {LABEL_KEYS} and {len(numbers)} values beside them are single numbers: "
            f"pass keys=((input keys), target key), e.g. keys=(({', '.join(map(repr, arrays))}"
            f"), {(numbers or ['target'])[0]!r})")
    return (*arrays, target or numbers[0])


def _names_id(key: object) -> bool:
    """Whether a dict sample's ``key`` names an id (``record_id``, ``writerId``, ``idx``)."""
    words = re.split(r"[^a-z0-9]+", re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", str(key)).lower())
    return words[-1] in ("id", "ids", "idx", "index", "uid", "uuid")


#: The dicts whose inputs were reported (once each).
_TOLD: set[tuple[str, ...]] = set()


def _tell(kind: str, keys: tuple[str, ...], how: str) -> None:
    """Log once which keys of a dict sample are its inputs (``how``) and which its target."""
    tell_once(("dict samples of %s: inputs %s %s, target %r", kind, ", ".join(keys[:-1]),
                how, keys[-1]))


def tell_once(line: tuple[str, ...], level: int = INFO) -> None:
    """Log ``line`` (a format and its values) once in this process, in the node's log."""
    if line not in _TOLD:
        _TOLD.add(line)
        from flwr.common.logger import log  # Flower's logger: the node's log

        log(level, *line)


def dict_keys(sample: Mapping[str, Any], keys: Keys | None, what: str,
              batch: bool = False) -> tuple[str | tuple[str, ...], str]:
    """The (input, target) keys of a dict sample: ``keys``, else common names; or ValueError.

    A sample of two keys, one of them a common name, has the other for the other part; of
    two other keys, the one holding a single value is the target; beside a named input, the
    one number whose key names no id (``record_id``, ``idx``; text is left out too). A
    sample of one number a column has a tuple of its columns for its input (``batch``: a
    loader's batch of them), one of several arrays and no input's name a tuple of the
    arrays' keys (several inputs).
    """
    seen = sorted(str(k) for k in sample)
    if keys is not None:
        if len(keys) != 2 or not isinstance(keys[1], str):
            raise ValueError("keys must be (input key, target key) or (input keys, target "
                             f"key), e.g. ([\"age\", \"bmi\"], \"label\") or ((\"acc\", \"gyro\"), "
                             f"\"activity\"), got {keys!r}")
        if not isinstance(keys[0], str) and not len(keys[0]):
            raise ValueError(f"keys={keys!r} names no input")
        inputs = (keys[0],) if isinstance(keys[0], str) else tuple(keys[0])
        missing = [k for k in (*inputs, keys[1]) if k not in sample]
        if missing:
            raise ValueError(f"{what} has keys {seen}; keys={hashable_keys(keys)!r} names "
                             f"{missing}, which it lacks")
        return (keys[0] if isinstance(keys[0], str) else inputs), keys[1]
    columns = _table_columns(sample, batch)
    if columns is not None:
        _tell("one number a column", columns, "side by side")
        return columns[:-1], columns[-1]
    found = [next((k for k in names if k in sample), None)
             for names in (SAMPLE_KEYS, LABEL_KEYS)]
    if found[0] is None and (several := _array_inputs(sample, found[1], batch, what)):
        _tell("several arrays", several, "in the model's order")
        return several[:-1], several[-1]
    rest = [str(k) for k in sample if k not in found]
    if found.count(None) == 1 and len(rest) == 1:  # two keys, one known: the other is the other
        found[found.index(None)] = rest[0]
    scalars = [k for k in rest if np.ndim(sample[k]) == 0]
    numbers = [k for k in rest if is_number(sample[k], batch) and not _names_id(k)]
    if found[0] is not None and found[1] is None and len(rest) > 1 and len(numbers) == 1:
        found[1] = numbers[0]  # {"features": row, "diagnosis": 1, "record_id": 7, "ward": "A"}
        tell_once(("dict samples: input %r, target %r, the one number not named as an id (%s"
                   " left out)", str(found[0]), numbers[0], ", ".join(sorted(set(rest) - {
                       numbers[0]}))))
    if found == [None, None] and len(rest) == 2 and len(scalars) == 1:  # {"x": row, "y": 3}
        found = [next(k for k in rest if k != scalars[0]), scalars[0]]
    if found[0] is None or found[1] is None:
        raise ValueError(
            f"{what} is a dict with keys {seen}; found no "
            f"{'input' if found[0] is None else 'target'} among "
            f"{SAMPLE_KEYS if found[0] is None else LABEL_KEYS}: pass "
            "keys=(input key, target key), e.g. keys=(\"img\", \"label\"), or for one "
            "number a column or several inputs keys=(input keys, target key), e.g. "
            "keys=([\"age\", \"bmi\"], \"label\") or keys=((\"acc\", \"gyro\"), \"label\")")
    return found[0], found[1]


def hashable_keys(keys: Keys | None) -> tuple[Any, ...] | None:
    """``keys`` as a tuple of strings and tuples (a list of input keys as a tuple)."""
    if keys is None:
        return None
    return tuple(k if isinstance(k, str) else tuple(k) for k in keys)


def target_parts(data: Any) -> tuple[str, ...]:
    """``name=layout`` of each part of a dict target, ``(x, {"label": 3, "ink": 0.2})``.

    ``("label=i", "ink=f")`` (a layout as :func:`~dq_flower.wire.input_parts.layout_name`
    names it); ``()`` where the first item's target is not a dict. Its values travel side
    by side (:func:`target_row`); the server hands the user's loss the dict again.
    """
    try:
        first = getattr(data, "dataset", data)[0]  # a DataLoader's data set
    except (LookupError, TypeError, ValueError, NotImplementedError):
        return ()
    target = first[1] if isinstance(first, (tuple, list)) and len(first) > 1 else None
    if not isinstance(target, Mapping):
        return ()
    return tuple(f"{k}={layout_name(np.shape(v), to_numpy(v).dtype.kind in 'biu')}"
                 for k, v in target.items())


def target_row(target: Mapping[str, Any], batch: bool, what: str) -> np.ndarray:
    """A dict target's values side by side, float32: ``(k,)`` a sample, ``(n, k)`` a batch."""
    values = {k: to_numpy(v) for k, v in target.items()}
    if bad := [str(k) for k, v in values.items() if v.dtype.kind not in "biuf"]:
        raise ValueError(f"{what}'s target {bad[0]!r} is not a number or an array of them")
    return np.concatenate([v.astype(np.float32).reshape((len(v), -1) if batch else (-1,))
                           for v in values.values()], axis=-1)
