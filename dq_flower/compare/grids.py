"""The step-size grids learning-rate tuning searches, one per method family.

Each method tunes the step sizes it has (:mod:`dq_flower.compare.tune`):

- ``dq``: its server ``lr`` in 0.01, 0.03, 0.1, 0.3;
- gradient baselines with one local step: the server ``lr`` in 0.01, 0.03, 0.1, 0.3;
- ``signsgd`` (majority vote): the sign step ``lr`` in 0.001, 0.003, 0.01;
- gradient baselines with ``local-steps`` > 1: the server ``lr`` (applied to the mean
  local update; 1 is FedAvg's step) in 0.3, 1, 3 times ``client-lr`` in 0.03, 0.1, 0.3
  (nine runs);
- ``fedavg`` and the ``fedavg-*`` methods: ``client-lr`` in 0.01, 0.03, 0.1, 0.3 (the
  server step is FedAvg's own, the mean model delta).

A gradient step of 0.1 is the baselines' default and DQ's is 0.05, so every grid brackets
the default with a factor of about 3 either side; signSGD's step moves every coordinate by
``lr`` and needs a 30x smaller one. Tuning extends an axis whose best value sits at its
edge (:func:`dq_flower.compare.tune.extend_axes`), so a grid is a starting bracket, not a
bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

__all__ = ["DQ_LR", "GRADIENT_LR", "SIGN_LR", "LOCAL_LR", "LOCAL_CLIENT_LR", "CLIENT_LR",
           "step_axes", "grid_points", "describe_axes"]

DQ_LR = (0.01, 0.03, 0.1, 0.3)
GRADIENT_LR = (0.01, 0.03, 0.1, 0.3)
SIGN_LR = (0.001, 0.003, 0.01)
LOCAL_LR = (0.3, 1.0, 3.0)
LOCAL_CLIENT_LR = (0.03, 0.1, 0.3)
CLIENT_LR = (0.01, 0.03, 0.1, 0.3)


def _majority(config: Mapping[str, Any]) -> bool:
    aggregation = config.get("aggregation", "auto")
    return aggregation == "majority" or (aggregation == "auto" and config.get("codec") == "sign")


def step_axes(family: str, config: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    """The step-size knobs of a run and the values tuning tries for each.

    Parameters
    ----------
    family : str
        ``dq``, ``gradient``, ``fedavg`` or ``compressed``.
    config : mapping
        The run's resolved knobs (hyphenated keys, defaults included).

    Returns
    -------
    dict
        Knob -> values, in the order the grid is searched (empty for an unknown family).
    """
    if family == "dq":
        return {"lr": DQ_LR}
    if family in ("fedavg", "compressed"):  # the server averages: only the client's step
        return {"client-lr": CLIENT_LR}
    if family != "gradient":
        return {}
    if int(config.get("local-epochs", 0) or 0) > 0:
        return {"client-lr": CLIENT_LR}
    local = int(config.get("local-steps", 1) or 1) > 1
    if _majority(config):
        return {"lr": SIGN_LR, **({"client-lr": LOCAL_CLIENT_LR} if local else {})}
    if local:
        return {"lr": LOCAL_LR, "client-lr": LOCAL_CLIENT_LR}
    return {"lr": GRADIENT_LR}


def grid_points(axes: Mapping[str, tuple[float, ...]]) -> list[dict[str, float]]:
    """Every combination of the axes' values (the first axis varies slowest)."""
    keys = list(axes)
    return [dict(zip(keys, values, strict=True))
            for values in itertools.product(*(axes[k] for k in keys))]


def describe_axes(axes: Mapping[str, Any]) -> str:
    """``"0.01, 0.03, 0.1, 0.3"`` for one axis; ``"lr {..} x client-lr {..}"`` for several."""
    def values(v: Any) -> str:
        return ", ".join(f"{float(x):g}" for x in v)

    if len(axes) == 1:
        return values(next(iter(axes.values())))
    return " x ".join(f"{k} {{{values(v)}}}" for k, v in axes.items())
