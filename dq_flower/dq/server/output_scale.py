"""The server's standardisation of float targets' columns inside its own training (DQ only).

Several float targets on very different scales (a rate about 1 beside a price about
10,000) read from a model whose last layer is an ``nn.Linear`` with an output per target
defeat one step size: Adam moves each weight by about its step, so a step that lets the
price's row of that layer travel its thousands throws the rate's row about by as much (the
rate's error 26.5 spreads for the price's 0.10), and one that suits the rate leaves the price
at its start. The server trains that layer's rows in units of their targets' spreads
instead, and only inside its own training: for a phase the layer holds ``W' = W / std``
and ``b' = (b - mean) / std`` row by row while a forward hook hands on ``out * std +
mean`` (the same function, the user's loss on raw targets), and afterwards ``W = W' *
std`` and ``b = b' * std + mean`` are written back, so every model the nodes and the user
get predicts raw targets (DESIGN: the server may normalise inside its own training, never
what the user's model sees).

It is decided once, on the held-out rows of the first phase, where the target columns'
spreads differ by :data:`~.input_scale.SPREAD_RATIO` times or more. Where the model's
outputs are far from the targets (their squared error, in the columns' spreads, more than
:data:`~.input_scale.RAW_FACTOR` times that of the same outputs read as standardised
targets), the first phase starts the layer from the user's weights as if they were for
standardised targets (:attr:`OutputScale.fresh_start`): the start of a user who
standardised the targets; otherwise (a model trained on them before) it keeps its function.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from dq_flower.dq.server.input_scale import (
    RAW_FACTOR,
    SCALE_ROWS,
    InputScale,
    Standardising,
    held_out_rows,
)

__all__ = ["OutputScale", "last_linear", "held_out_targets", "standardised"]


def last_linear(model: nn.Module, x: torch.Tensor) -> nn.Linear | None:
    """The ``nn.Linear`` whose output the model returns as it is, if any (eval mode)."""
    outs: dict[int, nn.Module] = {}

    def note(module: nn.Module, _args: tuple[Any, ...], out: Any) -> None:
        outs[id(out)] = module

    hooks = [m.register_forward_hook(note) for m in model.modules() if isinstance(m, nn.Linear)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            out = model(x)
    except Exception:  # noqa: BLE001 - a model that cannot read the rows: left alone
        return None
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    layer = outs.get(id(out)) if isinstance(out, torch.Tensor) else None
    return layer if isinstance(layer, nn.Linear) else None


def held_out_targets(data: Any, eligible: bool) -> tuple[np.ndarray, np.ndarray] | None:
    """The first held-out rows (shaped) and targets, several floats a row; else ``None``."""
    store, spec = data.store, data.spec
    if (not eligible or store is None or spec is None or spec.target != "float"
            or spec.target_dim < 2 or not store.holdout_mask.any()):
        return None
    x, y = next(store.holdout_batches(SCALE_ROWS))[:2]
    return data.shaped(x), y.reshape(len(x), -1)


class OutputScale(Standardising):
    """Float targets' columns, standardised for the model's last layer."""

    def decide(self, model: nn.Module, x: np.ndarray, y: np.ndarray) -> bool:
        """Decide on held-out rows ``x`` (shaped) and targets ``y`` whether to standardise."""
        self.decided = True
        if y.ndim != 2 or y.shape[0] < 2 or y.shape[1] < 2:
            return False
        dtype = next(model.parameters()).dtype
        xt = torch.as_tensor(np.ascontiguousarray(x[:SCALE_ROWS]), dtype=dtype)
        yt = torch.as_tensor(np.ascontiguousarray(y[:SCALE_ROWS]), dtype=torch.float64)
        layer = last_linear(model, xt)
        if layer is None or layer.out_features != y.shape[1]:
            return False
        if (found := self.spreads(yt, layer)) is None:
            return False  # targets of one kind: one step suits them all
        mean, std, varying = found
        was_training = model.training
        model.eval()
        with torch.no_grad():
            out = model(xt).double().reshape(yt.shape)
        model.train(was_training)
        raw = (((out - yt) / std) ** 2).mean().item()
        fresh = ((out - (yt - mean) / std) ** 2).mean().item()
        return self.adopt(mean, std, raw > RAW_FACTOR * max(1.0, fresh),
                          f"float targets of spreads {float(varying.min()):.3g} to "
                          f"{float(varying.max()):.3g}: the server trains the model's last "
                          "layer for them standardised", "targets")

    @contextmanager
    def standardised(self, model: nn.Module, rows: tuple[np.ndarray, np.ndarray] | None
                     ) -> Iterator[nn.Linear | None]:
        """The model's last layer for standardised targets in the ``with`` block.

        ``rows``: held-out rows (shaped) and targets (:func:`held_out_targets`), which decide
        once and find the layer; nothing happens where ``None`` or not standardised.
        """
        if rows is not None and not self.decided:
            self.decide(model, *rows)
        found = self.found(model, None if rows is None else rows[0], last_linear)
        if found is None:
            yield None
            return
        layer, mean, std = found
        w, b = layer.weight, layer.bias
        with torch.no_grad():
            if not self.fresh_start:  # W' = W / std, b' = (b - mean) / std: the same function
                w.div_(std[:, None])
                if b is not None:
                    b.sub_(mean).div_(std)
        self.fresh_start = False
        hook = layer.register_forward_hook(lambda _m, _args, out: out * std + mean)
        try:
            yield layer
        finally:
            hook.remove()
            with torch.no_grad():
                w.mul_(std[:, None])
                if b is not None:
                    b.mul_(std).add_(mean)


@contextmanager
def standardised(model: nn.Module, data: Any, scales: tuple[InputScale, OutputScale] | None
                 ) -> Iterator[None]:
    """A raw table's columns and float targets standardised for the block, as decided.

    ``scales``: the server's two decisions (``None``: neither applies to this training).
    """
    if scales is None:
        yield
        return
    inputs, outputs = scales
    rows = held_out_rows(data.store, data.spec, inputs.wanted)
    with inputs.standardised(model, rows), \
            outputs.standardised(model, held_out_targets(data, outputs.wanted)):
        yield
