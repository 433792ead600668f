"""Layouts of several inputs laid side by side in one flat sample (the data spec's ``inputs``).

A layout is ``f`` or ``i`` (float or integer input) followed by its shape's sizes joined by
``x`` (``f5``, ``i3``, ``f40x3``); ``f`` or ``i`` alone is one value a sample, shape ``()``.
The device writes them (:func:`dq_flower.data_input.as_inputs`), the spec carries them and
:mod:`dq_flower.model_inputs` splits rows by them.
"""

from __future__ import annotations

import math

__all__ = ["MAX_PARTS", "ONE_INPUT_KEY", "INPUT_NAMES_KEY", "NAN_ZERO_KEY", "layout_name",
           "part_layout", "parts_width"]

#: The server's ask where its model takes one input and a node's samples held several: a
#: ``TensorDataset`` of more than two tensors is read as ``(x, y)``, the others left out.
ONE_INPUT_KEY = "one-input"
#: The names of the server's model's ``forward`` inputs, joined by commas, where it takes
#: several: a dict sample holding them gives them to it in that order.
INPUT_NAMES_KEY = "input-names"
#: The server's model reads a missing value (NaN) of its input as it reads 0
#: (``torch.nan_to_num(x)`` first): a node sends its rows with NaN values as 0.
NAN_ZERO_KEY = "nan-zero"

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
