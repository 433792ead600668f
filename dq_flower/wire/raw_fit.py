"""A DQ node's report that the model reads its raw rows worse than their codes.

Three reply metrics (``metrics`` record), present only where the node found the gap
(:mod:`dq_flower.dq.client.fidelity`): the mean loss of the server's model on a sample of
the node's rows raw, on the same rows as the server decodes them, and how many rows. Rows
that are their own targets (an autoencoder's): the share of the codes' error the model passes
on and the share it is judged against (:class:`dq_flower.dq.raw_gap.Gain`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, NamedTuple

__all__ = ["RAW_LOSS_KEY", "CODED_LOSS_KEY", "ROWS_KEY", "ROWS_COMPARED", "RawFit", "raw_fit"]

RAW_LOSS_KEY, CODED_LOSS_KEY, ROWS_KEY = "raw-rows-loss", "coded-rows-loss", "rows-compared"
#: The most rows a node compares: a report of more is refused (one node's count would
#: otherwise outweigh the others' in the pooled figures the server says)
ROWS_COMPARED = 64


class RawFit(NamedTuple):
    """One node's report: mean losses raw and coded over ``rows`` rows."""

    raw: float
    coded: float
    rows: int


def raw_fit(metrics: Mapping[str, Any] | None) -> RawFit | None:
    """The report a reply's metrics carry (``None``: none, or not three sound figures)."""
    if metrics is None or RAW_LOSS_KEY not in metrics:
        return None
    try:
        fit = RawFit(float(metrics[RAW_LOSS_KEY]), float(metrics[CODED_LOSS_KEY]),
                     int(metrics[ROWS_KEY]))
    except (KeyError, TypeError, ValueError):
        return None
    ok = math.isfinite(fit.raw) and math.isfinite(fit.coded) and 0 < fit.rows <= ROWS_COMPARED
    return fit if ok and fit.raw >= 0 and fit.coded >= 0 else None
