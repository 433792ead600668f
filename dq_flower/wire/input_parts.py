"""Layouts of several inputs laid side by side in one flat sample (the data spec's ``inputs``).

A layout is ``f`` or ``i`` (float or integer input) followed by its shape's sizes joined by
``x`` (``f5``, ``i3``, ``f40x3``); ``f`` or ``i`` alone is one value a sample, shape ``()``.
The device writes them (:func:`dq_flower.data_input.as_inputs`), the spec carries them and
:mod:`dq_flower.model_inputs` splits rows by them. Here too: how a flat sample's missing
values (NaN) travel where the server's model reads them (:func:`nan_bytes`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from dq_flower.codecs import PayloadError
from dq_flower.codecs.payload import read_raw

__all__ = ["MAX_PARTS", "ONE_INPUT_KEY", "INPUT_NAMES_KEY", "NAN_ZERO_KEY", "NAN_MASK_KEY",
           "NAN_KEY", "layout_name", "part_layout", "parts_width", "target_width", "nan_mode",
           "nan_bytes", "read_nan"]

#: The server's ask where its model takes one input and a node's samples held several: a
#: ``TensorDataset`` of more than two tensors is read as ``(x, y)``, the others left out.
ONE_INPUT_KEY = "one-input"
#: The names of the server's model's ``forward`` inputs, joined by commas, where it takes
#: several: a dict sample holding them gives them to it in that order.
INPUT_NAMES_KEY = "input-names"
#: The server's model reads a missing value (NaN) of its input as it reads 0
#: (``torch.nan_to_num(x)`` first): a node sends its rows with NaN values as 0.
NAN_ZERO_KEY = "nan-zero"
#: The server's model reads where a flat sample's values are missing (``torch.isnan(x)``
#: beside them): a node sends its rows with NaN values and where they are (:data:`NAN_KEY`).
NAN_MASK_KEY = "nan-mask"
#: The ``sample-info`` array of an upload's NaN coordinates (:func:`nan_bytes`), sent only
#: where a row holds one.
NAN_KEY = "nan"

#: Most inputs a sample may have.
MAX_PARTS = 16
#: Most sizes in one input's shape.
_MAX_DIMS = 8


def layout_name(shape: tuple[int, ...], integer: bool) -> str:
    """The layout of an input of ``shape`` (one sample's), integer or float."""
    return ("i" if integer else "f") + "x".join(str(int(s)) for s in shape)


def part_layout(part: str) -> tuple[tuple[int, ...], bool]:
    """``(shape, integer)`` of a layout; ``ValueError`` for anything else."""
    sizes = part[1:].split("x") if isinstance(part, str) and len(part) > 1 else []
    if (not isinstance(part, str) or not part or part[0] not in "fi" or len(sizes) > _MAX_DIMS
            or not all(s.isdigit() and len(s) <= 9 and int(s) > 0 for s in sizes)):
        raise ValueError(f"input part {part!r} is not f or i and sizes joined by x")
    return tuple(int(s) for s in sizes), part[0] == "i"


def parts_width(parts: tuple[str, ...]) -> int:
    """Values a flat sample of ``parts`` holds; ``ValueError`` unless 2 to 16 valid layouts."""
    if not 2 <= len(parts) <= MAX_PARTS:
        raise ValueError(f"{len(parts)} inputs a sample (2 to {MAX_PARTS} are read)")
    return sum(math.prod(part_layout(p)[0]) for p in parts)


def target_width(parts: tuple[str, ...]) -> int:
    """Values of a dict target of ``parts`` (``name=layout``); ``ValueError`` unless 1 to 16."""
    names = [p.partition("=")[0] if isinstance(p, str) else "" for p in parts]
    if not 1 <= len(parts) <= MAX_PARTS or "" in names or len(set(names)) < len(names):
        raise ValueError(f"{len(parts)} target parts, named once each, 1 to {MAX_PARTS}")
    return sum(math.prod(part_layout(p.partition("=")[2])[0]) for p in parts)


def nan_mode(config: Mapping[str, Any]) -> str:
    """What a round's ``config`` asks of NaN values: ``zero``, ``keep`` (with a mask) or ``""``."""
    return "zero" if config.get(NAN_ZERO_KEY) else "keep" if config.get(NAN_MASK_KEY) else ""


def nan_bytes(holes: np.ndarray) -> np.ndarray:
    """The NaN coordinates ``holes`` (bool ``(n, dim)``) as an upload's sample-info sends them.

    One bit a column (set: a NaN in it somewhere), then those columns' bits row by row, each
    part packed MSB first: ``ceil(dim / 8) + ceil(n * k / 8)`` bytes for ``k`` such columns.
    """
    cols = holes.any(axis=0)
    return np.concatenate([np.packbits(cols), np.packbits(holes[:, cols])])


def read_nan(info: Any, n: int, dim: int) -> tuple[np.ndarray, int]:
    """``sample-info``'s :func:`nan_bytes` as bool ``(n, dim)``, and its bytes; or PayloadError.

    Its column flags name at least one column, each holding a NaN, none past ``dim``; its
    length is exact and its padding bits are 0.
    """
    head = -(-dim // 8)
    raw = read_raw(info, NAN_KEY, "uint8", head + -(-n * dim // 8))
    cols = np.unpackbits(raw[:head], count=dim).astype(bool) if raw.size >= head else None
    k = 0 if cols is None else int(cols.sum())
    if cols is None or not k or raw.size != head + -(-n * k // 8):
        raise PayloadError(f"sample-info {NAN_KEY!r}: {raw.size} bytes are no NaN mask of {n} "
                           f"rows of {dim} values (column flags, then theirs by row)")
    bits = np.unpackbits(raw[head:], count=n * k).astype(bool).reshape(n, k)
    if not bits.any(axis=0).all() or not np.array_equal(
            np.concatenate([np.packbits(cols), np.packbits(bits)]), raw):
        raise PayloadError(f"sample-info {NAN_KEY!r}: flags a column without a NaN or sets "
                           f"bits past {dim} columns or {n} rows")
    holes = np.zeros((n, dim), dtype=bool)
    holes[:, cols] = bits
    return holes, int(raw.size)
