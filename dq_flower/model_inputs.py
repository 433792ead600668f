"""A model of several inputs called with one flat tensor: its parts split off by a hook.

A device whose samples hold several inputs (``TensorDataset(x_num, x_cat, y)``, for a model
called ``model(x_num, x_cat)``) sends them side by side in one flat row
(:func:`dq_flower.data_input.as_inputs`), their layouts in the data spec's ``inputs``.
Wherever DQ then calls ``model(x)`` on such rows, :class:`InputSplit`, a forward pre-hook,
hands the model its inputs: each part reshaped, integer parts rounded to int64 (an
embedding's ids). A call with several arguments, the user's own, passes untouched.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from dq_flower.wire.input_parts import part_layout

__all__ = ["InputSplit", "split_inputs", "HOOK_ATTR"]

#: The attribute of a model that holds its :class:`InputSplit` (one a model).
HOOK_ATTR = "_dq_input_split"


class InputSplit:
    """Forward pre-hook: a flat ``(n, d)`` tensor becomes the model's inputs ``parts``."""

    def __init__(self, parts: tuple[str, ...]) -> None:
        self.set(parts)

    def set(self, parts: tuple[str, ...]) -> None:
        """Split into ``parts`` from now on."""
        self.parts = tuple(parts)
        self.layouts = [part_layout(p) for p in self.parts]
        self.width = sum(math.prod(shape) for shape, _ in self.layouts)

    def __call__(self, _module: nn.Module, args: tuple) -> tuple | None:
        """The inputs split from one flat tensor; ``None`` (unchanged) for any other call."""
        if len(args) != 1 or not isinstance(args[0], torch.Tensor):
            return None
        flat = args[0]
        if flat.ndim != 2 or flat.shape[1] != self.width:
            return None
        inputs, start = [], 0
        for shape, integer in self.layouts:
            size = math.prod(shape)
            part = flat[:, start:start + size].reshape(flat.shape[0], *shape)
            inputs.append(part.round().long() if integer else part)
            start += size
        return tuple(inputs)


def split_inputs(model: nn.Module, parts: tuple[str, ...]) -> None:
    """Have ``model`` split flat rows into ``parts`` (set once, the layouts updated after).

    ``()`` leaves every call untouched (a hook set before, by another reply's layouts, stays
    but splits nothing).
    """
    hook = getattr(model, HOOK_ATTR, None)
    if isinstance(hook, InputSplit):
        hook.set(parts)
        return
    if not parts:
        return
    hook = InputSplit(parts)
    model.register_forward_pre_hook(hook)
    setattr(model, HOOK_ATTR, hook)
