"""The server's standardisation of a raw table inside its own training (DQ only).

Also the batch norms' statistics, which follow the server's steps (:func:`tracked_statistics`).

A table of raw columns (amounts in thousands beside ratios in hundredths) read by a model
whose first layer is an ``nn.Linear`` defeats every optimizer alike: its first outputs are
in the thousands at the user's initialisation, and a step that suits one column is a
thousand times too large or too small for another. The server trains that layer on
standardised columns instead, and only inside its own training: for a phase the layer
holds ``W' = W * std`` and ``b' = b + W @ mean`` while a forward pre-hook feeds it
``(x - mean) / std`` (the same function), and afterwards ``W = W' / std`` and
``b = b' - W @ mean`` are written back, so every model the nodes and the user get reads
raw columns as before (DESIGN: the server may normalise inside its own training, never
what the user's model sees).

It is decided once, on the held-out rows of the first phase, where the columns' spreads
differ by :data:`SPREAD_RATIO` times or more (not a series' lags, all in kW): there a
gradient step that suits one column is thousands of times too large for another, whatever
the layer's outputs (a price in tens to hundreds beside one-hot columns left SGD at 45.6%,
FedAvg 73.2%). Where the layer's outputs on the raw rows are also more than
:data:`RAW_FACTOR` times as large as on the standardised rows and above :data:`RAW_FACTOR`,
the first phase starts the layer from the user's initial weights as if they were for
standardised columns (:attr:`InputScale.fresh_start`): the start a user who standardised the
table would have had; otherwise (a layer fit for the raw columns, a model trained on them
before) the layer keeps its function.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch
from torch import nn

from dq_flower.server.common import log_round

__all__ = ["InputScale", "Standardising", "RAW_FACTOR", "SPREAD_RATIO", "SCALE_ROWS",
           "first_linear", "held_out_rows", "tracked_statistics", "MIN_NORM_MOMENTUM"]

#: How much larger than on standardised rows (and than 1) the layer's raw outputs must be.
RAW_FACTOR = 10.0
#: How many times the widest column's spread must be the narrowest's.
SPREAD_RATIO = 100.0
#: Held-out rows the decision reads, at most.
SCALE_ROWS = 4096


def first_linear(model: nn.Module, x: torch.Tensor) -> nn.Linear | None:
    """The ``nn.Linear`` the model hands its input ``x`` to as it is, if the first it calls.

    Read in eval mode (no buffer changes, no dropout draws); a model that fails: ``None``.
    """
    seen: list[nn.Module] = []
    first: list[bool] = []

    def note(module: nn.Module, args: tuple[Any, ...]) -> None:
        if not first:
            first.append(bool(args) and args[0] is x)
            seen.append(module)

    hooks = [m.register_forward_pre_hook(note) for m in model.modules()
             if isinstance(m, nn.Linear)]
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            model(x)
    except Exception:  # noqa: BLE001 - a model that cannot read the rows: left alone
        return None
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    layer = seen[0] if first and first[0] else None
    return layer if isinstance(layer, nn.Linear) else None


def held_out_rows(store: Any, spec: Any, eligible: bool) -> np.ndarray | None:
    """The first held-out rows of a store of flat values, where ``eligible``; else ``None``."""
    if (not eligible or store is None or spec is None or len(spec.sample_shape) != 1
            or spec.vocab or not store.holdout_mask.any()):
        return None
    return next(store.holdout_batches(SCALE_ROWS))[0]


class Standardising:
    """Whether, and with which column means and spreads, the server standardises (once)."""

    def __init__(self) -> None:
        self.decided = False
        self.mean: np.ndarray | None = None  # None: not standardised
        self.std: np.ndarray | None = None
        self.fresh_start = False  # the next phase starts the layer as for standardised columns

    @staticmethod
    def spreads(values: torch.Tensor, layer: nn.Linear
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """Columns' means, spreads and varying spreads, where those differ enough; else None.

        Enough: :data:`SPREAD_RATIO`-fold. Means are zeros where ``layer`` has no bias to
        carry a shift; a constant column's spread is 1.
        """
        mean, std = values.mean(0), values.std(0)
        varying = std[std > 0]
        if varying.numel() < 2 or varying.max() < SPREAD_RATIO * varying.min():
            return None  # columns of one kind (a series' lags in kW): the optimizers cope
        return (mean if layer.bias is not None else torch.zeros_like(mean),
                torch.where(std > 0, std, torch.ones_like(std)), varying)

    def adopt(self, mean: torch.Tensor, std: torch.Tensor, fresh_start: bool, said: str,
              noun: str) -> bool:
        """Standardise by ``mean`` and ``std``; log ``said`` and how the first phase starts."""
        self.mean, self.std = mean.double().numpy(), std.double().numpy()
        self.fresh_start = fresh_start
        log_round("dq", 0, f"{said}, its weights written back for raw {noun} ("
                  + (f"the first phase starts it from its initial weights as for standardised "
                     f"{noun})" if fresh_start else "the same function as given)"))
        return True

    @property
    def wanted(self) -> bool:
        """Whether a phase needs held-out rows: to decide, or to find the layer it scales."""
        return not self.decided or self.mean is not None

    def state(self) -> dict[str, Any]:
        """The decision, for checkpoints."""
        return {"decided": self.decided, "mean": self.mean, "std": self.std}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (a checkpoint from before it: undecided)."""
        state = state or {}
        self.decided = bool(state.get("decided", False))
        self.mean, self.std = state.get("mean"), state.get("std")
        self.fresh_start = False

    def found(self, model: nn.Module, x: np.ndarray | None,
              find: Callable[[nn.Module, torch.Tensor], nn.Linear | None]
              ) -> tuple[nn.Linear, torch.Tensor, torch.Tensor] | None:
        """The layer ``find`` picks on a few rows of ``x`` with the means and spreads, if any."""
        xt = None if x is None or self.mean is None else torch.as_tensor(
            np.ascontiguousarray(x[:8]), dtype=next(model.parameters()).dtype)
        layer = None if xt is None else find(model, xt)
        if layer is None:
            return None
        w = layer.weight
        return (layer, torch.as_tensor(self.mean, dtype=w.dtype, device=w.device),
                torch.as_tensor(self.std, dtype=w.dtype, device=w.device))


class InputScale(Standardising):
    """A raw table's columns, standardised for the model's first layer."""

    def decide(self, model: nn.Module, rows: np.ndarray) -> bool:
        """Decide on flat held-out ``rows`` (raw columns) whether to standardise; once."""
        self.decided = True
        if rows.ndim != 2 or rows.shape[0] < 2:
            return False
        x = torch.as_tensor(np.ascontiguousarray(rows[:SCALE_ROWS]),
                            dtype=next(model.parameters()).dtype)
        layer = first_linear(model, x)
        if layer is None:
            return False
        if (found := self.spreads(x, layer)) is None:
            return False
        mean, std, varying = found
        with torch.no_grad():
            raw = layer(x).pow(2).mean().sqrt().item()
            scaled = layer((x - mean) / std).pow(2).mean().sqrt().item()
        return self.adopt(mean, std, raw > RAW_FACTOR * max(1.0, scaled),
                          f"raw columns (spreads {float(varying.min()):.3g} to "
                          f"{float(varying.max()):.3g}): the server trains the model's first "
                          "layer on them standardised", "columns")

    @contextmanager
    def standardised(self, model: nn.Module, rows: np.ndarray | None
                     ) -> Iterator[nn.Linear | None]:
        """The model's first layer on standardised columns for the ``with`` block.

        ``rows``: held-out rows (:func:`held_out_rows`), which decide once and find the
        layer; nothing happens where they are ``None`` or the table is not standardised.
        """
        if rows is not None and not self.decided:
            self.decide(model, rows)
        found = self.found(model, rows, first_linear)
        if found is None:
            yield None
            return
        layer, mean, std = found
        w, b = layer.weight, layer.bias
        with torch.no_grad():
            if not self.fresh_start:  # W' = W * std, b' = b + W @ mean: the same function
                if b is not None:
                    b.add_(w @ mean)
                w.mul_(std)
        self.fresh_start = False
        hook = layer.register_forward_pre_hook(
            lambda _m, args: ((args[0] - mean) / std, *args[1:]))
        try:
            yield layer
        finally:
            hook.remove()
            with torch.no_grad():
                w.div_(std)
                if b is not None:
                    b.sub_(w @ mean)

#: The least momentum of a batch-norm layer's running statistics while the server trains.
MIN_NORM_MOMENTUM = 0.1


@contextmanager
def tracked_statistics(model: nn.Module) -> Iterator[None]:
    """Batch norms' running statistics follow the server's training (restored on exit).

    torchvision's MobileNet and EfficientNet build theirs with momentum 0.01 (or ``None``, a
    running average): the statistics lag the weights a few hundred steps, every held-out
    score (in eval mode) stayed at chance, and each phase stopped early (mobilenet_v3_small
    on Fashion-MNIST: 9.3%; 83.4% with momentum 0.1). Here at least
    :data:`MIN_NORM_MOMENTUM`.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    kept = [m.momentum for m in norms]
    for m in norms:
        m.momentum = max(m.momentum or 0.0, MIN_NORM_MOMENTUM)
    try:
        yield
    finally:
        for m, momentum in zip(norms, kept, strict=True):
            m.momentum = momentum
