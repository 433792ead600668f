"""The step-size grids tuning starts from, one per method family (:func:`step_axes`).

Each brackets the default step by about 3x either side (signSGD's is 30x smaller); tuning
extends an axis whose best value sits at its edge, so a grid is no bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

__all__ = ["DQ_LR", "GRADIENT_LR", "SIGN_LR", "LOCAL_LR", "LOCAL_CLIENT_LR", "CLIENT_LR",
           "step_axes", "grid_points", "describe_axes"]

DQ_LR = (0.01, 0.03, 0.1, 0.3)  # dq's server lr
GRADIENT_LR = (0.01, 0.03, 0.1, 0.3)  # gradient baselines, one local step
SIGN_LR = (0.001, 0.003, 0.01)  # majority vote's sign step
LOCAL_LR = (0.3, 1.0, 3.0)  # server lr on the mean local update (local-steps > 1) ...
LOCAL_CLIENT_LR = (0.03, 0.1, 0.3)  # ... times client-lr
CLIENT_LR = (0.01, 0.03, 0.1, 0.3)  # fedavg, fedavg-* (and local-epochs): client-lr


def _majority(config: Mapping[str, Any]) -> bool:
    aggregation = config.get("aggregation", "auto")
    return aggregation == "majority" or (aggregation == "auto" and config.get("codec") == "sign")


def step_axes(family: str, config: Mapping[str, Any]) -> dict[str, tuple[float, ...]]:
    """Knob -> values tuning tries, of a run of ``family`` with resolved knobs ``config``."""
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
    return [dict(zip(axes, values, strict=True)) for values in itertools.product(*axes.values())]


def describe_axes(axes: Mapping[str, Any]) -> str:
    """``"0.01, 0.03, 0.1, 0.3"`` for one axis; ``"lr {..} x client-lr {..}"`` for several."""
    def values(v: Any) -> str:
        return ", ".join(f"{float(x):g}" for x in v)

    if len(axes) == 1:
        return values(next(iter(axes.values())))
    return " x ".join(f"{k} {{{values(v)}}}" for k, v in axes.items())
