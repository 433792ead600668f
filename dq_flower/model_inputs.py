"""A model of several inputs called with one flat tensor: its parts split off by a hook.

A device whose samples hold several inputs (``TensorDataset(x_num, x_cat, y)``, for a model
called ``model(x_num, x_cat)``) sends them side by side in one flat row
(:func:`dq_flower.data_input.as_inputs`), their layouts in the data spec's ``inputs``.
Wherever DQ then calls ``model(x)`` on such rows, :class:`InputSplit`, a forward pre-hook,
hands the model its inputs: each part reshaped, integer parts rounded to int64 (an
embedding's ids). A call with several arguments, the user's own, passes untouched.
"""

from __future__ import annotations

import inspect
import math
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import torch
from torch import nn

from dq_flower.codecs import PayloadError
from dq_flower.wire.input_parts import (
    INPUT_NAMES_KEY,
    NAN_MASK_KEY,
    NAN_ZERO_KEY,
    ONE_INPUT_KEY,
    part_layout,
)

if TYPE_CHECKING:
    from dq_flower.wire.dq_batch import DataSpec

__all__ = ["InputSplit", "split_inputs", "HOOK_ATTR", "positional_inputs", "one_input_reason",
           "input_width", "layers", "check_width", "forward_names", "input_asks",
           "reads_nan_as_zero", "nan_reading", "keeps_nan", "nan_refusal"]

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


def positional_inputs(model: nn.Module) -> int | None:
    """Positional parameters of ``model.forward`` (``None``: not known, or ``*args``)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def forward_names(model: nn.Module) -> tuple[str, ...]:
    """The names of ``model.forward``'s positional inputs where it takes two or more."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError):
        return ()
    names = tuple(p.name for p in params if p.kind in (p.POSITIONAL_ONLY,
                                                       p.POSITIONAL_OR_KEYWORD))
    return names if len(names) > 1 else ()


def input_asks(model: nn.Module, one_input: bool, spec: DataSpec | None = None
               ) -> dict[str, int | str]:
    """What a round's config asks of the nodes' inputs.

    One (``one_input``: the model takes one, a ``TensorDataset``'s further tensors left
    out), else the names of its ``forward``'s several inputs (a dict sample holding them
    gives them by name: ``{"x", "length", "label"}`` for ``forward(x, length)``); and NaN
    values sent as 0 where the model reads them so (:func:`reads_nan_as_zero`) on samples
    of ``spec``'s shape, else (no spec yet) on rows as wide as its first linear layer; or
    sent with where they are (``nan-mask``) where it reads them otherwise but finite, on
    flat samples of a known ``spec`` (:func:`keeps_nan`).
    """
    asked: dict[str, int | str] = {ONE_INPUT_KEY: 1} if one_input else {}
    names = () if one_input else forward_names(model)
    if names:
        asked[INPUT_NAMES_KEY] = ",".join(names)
    if spec is not None:
        shape = None if spec.vocab or spec.inputs else spec.sample_shape
    else:
        width = None if names else input_width(model)
        shape = None if width is None else (width,)
    reading = "" if shape is None else nan_reading(model, shape)
    if reading == "zero":
        asked[NAN_ZERO_KEY] = 1
    elif spec is not None and keeps_nan(model, spec):
        asked[NAN_MASK_KEY] = 1
    return asked


#: :func:`nan_reading`'s answers by model and sample shape (the probe runs once).
_NAN_READ: weakref.WeakKeyDictionary[nn.Module, dict[tuple, str]] = \
    weakref.WeakKeyDictionary()


def reads_nan_as_zero(model: nn.Module, shape: tuple[int, ...]) -> bool:
    """Whether ``model`` computes on samples of ``shape`` with NaN values as with 0 there."""
    return nan_reading(model, shape) == "zero"


def keeps_nan(model: nn.Module, spec: DataSpec) -> bool:
    """Whether rows of ``spec`` keep their NaN values, where they are sent with (``nan-mask``).

    Flat samples of values (one input, not ids) whose model reads NaN otherwise than 0 but
    gives finite outputs on them (:func:`nan_reading`: ``torch.isnan(x)`` beside its values).
    """
    return (len(spec.sample_shape) == 1 and not spec.vocab and not spec.inputs
            and spec.target != "tokens" and nan_reading(model, spec.sample_shape) == "keep")


def nan_refusal(model: nn.Module, spec: DataSpec | None) -> str | None:
    """Why an upload of ``spec`` may not carry a NaN mask (``None``: it may, :func:`keeps_nan`)."""
    if spec is None or len(spec.sample_shape) != 1 or spec.vocab or spec.inputs:
        return f"a NaN mask comes with samples that are not flat values ({spec})"
    if not keeps_nan(model, spec):
        return ("a NaN mask the server did not ask for: its model does not read NaN values "
                "(non-finite outputs), or reads them as 0")
    return None


def nan_reading(model: nn.Module, shape: tuple[int, ...]) -> str:
    """How ``model`` reads NaN values of samples of ``shape``: ``zero``, ``keep`` or ``""``.

    A seeded probe in eval mode: 8 normal samples, a third of their values NaN, against the
    same with 0 there. Finite outputs within float tolerance of each other: ``zero`` (a model
    that starts with ``torch.nan_to_num(x)``); finite but apart: ``keep`` (one that also
    reads where values are missing, ``torch.isnan(x)``); else ``""`` (NaN outputs, errors).
    """
    known = _NAN_READ.setdefault(model, {})
    if shape not in known:
        param = next(model.parameters(), None)
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(8, *shape, generator=gen)
        holes = torch.rand(x.shape, generator=gen) < 1 / 3
        was = model.training
        model.eval()
        try:
            with torch.no_grad():
                outs = [model(x.masked_fill(holes, v).to(
                    param.device if param is not None else "cpu")) for v in (math.nan, 0.0)]
            finite = (all(isinstance(o, torch.Tensor) for o in outs)
                      and bool(torch.isfinite(outs[0]).all()))
            known[shape] = ("" if not finite else "zero" if torch.allclose(
                outs[0], outs[1], atol=1e-5) else "keep")
        except Exception:  # noqa: BLE001 - a model that fails on them reads no NaN
            known[shape] = ""
        finally:
            model.train(was)
    return known[shape]


def one_input_reason(model: nn.Module, parts: tuple[str, ...]) -> str | None:
    """Why samples of ``parts`` fail a model of one input, ``None`` where that is not it.

    ``TensorDataset(x, y, sample_weight)`` reads as two inputs and a float target; the
    nodes are then asked for ``(x, y)`` (:data:`~dq_flower.wire.input_parts.ONE_INPUT_KEY`).
    """
    if len(parts) < 2 or positional_inputs(model) != 1:
        return None
    return (f"the model takes one input, the samples {len(parts)} (a TensorDataset(x, y, "
            "sample_weight)? every tensor but the last reads as an input; a tokenizer's "
            "attention_mask beside its input_ids?): the next rounds ask the nodes for one "
            "input, (x, y) of the first two tensors or a dict's input_ids alone, the others "
            "left out (DQ's server weighs no rows by them: class weights go in DQStrategy's "
            "loss_fn)")


def layers(model: nn.Module) -> Iterator[nn.Module]:
    """The modules holding parameters of their own, in registration order."""
    return (m for m in model.modules() if next(m.parameters(recurse=False), None) is not None)


def input_width(model: nn.Module) -> int | None:
    """Input features of flat samples: the first layer's where it is linear (else ``None``).

    A ``BatchNorm1d`` or one-dimensional ``LayerNorm`` before it normalises as many. Layers
    are leaf modules (a parameter of the model's own, a gate, is none); a model holding a
    convolution reads no flat samples, wherever its linear layers are registered (a head
    registered before the features).
    """
    if any(isinstance(m, nn.modules.conv._ConvNd) for m in model.modules()):
        return None
    found = (m for m in layers(model) if next(m.children(), None) is None)
    first = next(found, None)
    if isinstance(first, nn.BatchNorm1d) or (isinstance(first, nn.LayerNorm)
                                             and len(first.normalized_shape) == 1):
        after = next(found, None)
        width = first.num_features if isinstance(first, nn.BatchNorm1d) else sum(
            first.normalized_shape)
        first = after if isinstance(after, nn.Linear) and after.in_features == width else None
    return int(first.in_features) if isinstance(first, nn.Linear) else None


def check_width(model: nn.Module, spec: DataSpec) -> None:
    """Refuse flat samples of one input that are not as wide as the model's first layer.

    Rows narrower than a linear first layer (:func:`input_width`) that the model runs on as
    they are would train on a broadcast (a ``forward`` taking ``(x - mean) / std`` of its own
    constants); wider ones fail. Refused, naming both widths, where the model runs on rows
    of its layer's width: a model that widens its rows itself (one-hot ids, features of
    features) fails on those and passes. Raises :class:`PayloadError`; call in eval mode.
    """
    if len(spec.sample_shape) != 1 or spec.inputs or spec.vocab or spec.target == "tokens":
        return
    wanted = input_width(model)
    if wanted is None or wanted == spec.dim or not (_runs(model, wanted) and (
            spec.dim < wanted or not _runs(model, spec.dim))):
        return
    raise PayloadError(
        f"the samples are flat rows of width {spec.dim}, the model's first layer takes "
        f"width {wanted}: send every column the model reads (dict samples of one number a "
        "column: keys=([input keys], target key), or no keys)")


def _runs(model: nn.Module, width: int) -> bool:
    """Whether ``model`` runs on two zero rows of ``width`` values."""
    first = next(model.parameters())
    try:
        with torch.no_grad():
            model(torch.zeros(2, width, dtype=first.dtype, device=first.device))
    except Exception:  # noqa: BLE001  (any error: the model does not read such rows)
        return False
    return True
