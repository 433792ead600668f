"""A node's check that the server's model reads its raw rows as well as their codes.

The server trains on decoded codes; the node holds the raw rows the model will be used on.
With the server's model at hand, a node compares the model's loss on a small seeded sample
of its rows, raw and as the server would decode them (the same rows: a paired comparison),
with the loss it scores by (``dq_train``'s ``loss_fn``, else the default for its targets).
Only where raw rows read clearly worse does the reply carry the figures
(:mod:`dq_flower.wire.raw_fit`); elsewhere nothing is added, so the reply is the same as
without the check. The server reads them in :mod:`dq_flower.dq.server.bit_width`. Rows that
are their own targets (an autoencoder's) read no worse raw by their loss; for them the
figures are the share of the codes' error the model passes on and its bound
(:class:`~dq_flower.dq.raw_gap.Gain`).

This module imports PyTorch: :mod:`.train` imports it only where a model is at hand.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from dq_flower.dq.raw_gap import (
    GAIN_MAX,
    RATIO,
    T_MIN,
    Gain,
    Gap,
    gained,
    paired,
    row_gains,
    row_losses,
)
from dq_flower.model_ops import LossFn
from dq_flower.seeding import Purpose, round_rng
from dq_flower.wire.dq_batch import DataSpec, range_mode
from dq_flower.wire.raw_fit import CODED_LOSS_KEY, RAW_LOSS_KEY, ROWS_COMPARED, ROWS_KEY

__all__ = ["Gap", "Gain", "RATIO", "T_MIN", "coded_fit", "round_fit"]

#: Rows compared (fewer where the node holds fewer); below :data:`MIN_ROWS` no check
ROWS, MIN_ROWS = ROWS_COMPARED, 16
#: The widest codes a check is made at (nothing finer to move to)
TOP_BITS = 8


def coded_fit(model: torch.nn.Module, x_flat: np.ndarray, y: np.ndarray,
              sample_shape: tuple[int, ...], quantizer: Any, loss_fn: LossFn | None,
              seeds: tuple[int, int, int], own: bool = False) -> Gap | Gain | None:
    """The model's :class:`Gap` on a seeded sample of ``(x_flat, y)`` (``None``: no check).

    ``own``: the rows are their own targets, its :class:`Gain` instead.

    ``x_flat``: the rows the node may send, flat; ``quantizer``: the round's, as the rows
    are coded (its ``bits``); ``seeds``: (round seed, round, client) of the draw, a stream
    of its own (:attr:`Purpose.FIDELITY`) so the reply's other draws are untouched.
    """
    n = x_flat.shape[0]
    if n < MIN_ROWS or int(quantizer.bits) >= TOP_BITS:
        return None
    rng = round_rng(*seeds, Purpose.FIDELITY)
    idx = np.sort(rng.choice(n, size=min(ROWS, n), replace=False))
    coded = quantizer.decode(quantizer.encode(x_flat[idx], rng))
    raw = x_flat[idx].astype(coded.dtype)  # counts, as numbers (int64 would read as ids)
    if own:
        gains = row_gains(model, raw, coded, sample_shape)
        return None if gains is None else gained(gains)
    losses = row_losses(model, (raw, coded), y[idx], sample_shape, loss_fn)
    return None if losses is None else paired(*losses)


def round_fit(model: torch.nn.Module, cfg: Any, spec: DataSpec, x_flat: np.ndarray,
              y: np.ndarray, config: dict[str, Any], key: int,
              loss_fn: LossFn | None) -> dict[str, Any]:
    """The reply metrics of a data round's check of ``(x_flat, y)`` under its knobs ``cfg``.

    Empty where raw rows do not read clearly worse, and before round 2 (the model of round
    1 is the untrained one). Rows coded per sample or per channel only (a table's feature
    ranges are the node's own state, and its codes are 4 bits at ``bits = 0``); id rows are
    sent exactly.
    """
    mode = range_mode(cfg.ranges, spec.sample_shape, spec.mixed_units)
    first = int(config["server-round"]) <= 1
    if first or spec.vocab or mode == "feature":
        return {}
    seed = int(config.get("round-seed", 0))
    quantizer = cfg.sample_quantizer(mode, spec.channels, dither_seed=seed,
                                     sample_shape=spec.sample_shape)
    gap = coded_fit(model, x_flat, y, spec.sample_shape, quantizer, loss_fn,
                    (seed, int(config["server-round"]), key), spec.target == "inputs")
    if gap is None or not gap.clear:
        return {}
    if isinstance(gap, Gain):
        return {RAW_LOSS_KEY: gap.gain, CODED_LOSS_KEY: GAIN_MAX, ROWS_KEY: gap.rows}
    return {RAW_LOSS_KEY: gap.raw, CODED_LOSS_KEY: gap.coded, ROWS_KEY: gap.rows}
