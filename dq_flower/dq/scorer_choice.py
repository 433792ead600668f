"""Which scorer and selection rule a node runs, and whether its round needs the model.

Both ends read this module (it imports neither PyTorch nor Flower). ``scorer="auto"`` (the
default) is resolved per node: a node that said in an earlier reply that it holds the
model (its ``can-score`` metric: :func:`dq_flower.client.dq_train` was given ``model=``)
scores its rows by the model's predictive entropy; every other node, a node the server has
not heard from, and every node while the server has trained nothing, draws uniformly and
gets no model. ``selection_rule="auto"`` draws rows with probability in proportion to
model scores (``sample``, each row weighted ``1/(n p)``) and uniformly otherwise
(``topk`` of equal scores).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["AUTO", "AUTO_SCORER_KEY", "CAN_SCORE_KEY", "MODEL_SCORER", "model_knob", "node_rule",
           "node_scorer"]

#: The knob value resolved per node.
AUTO = "auto"
#: The scorer ``auto`` resolves to on a node that holds the model.
MODEL_SCORER = "entropy"
#: Reply metric: 1 where the node holds the model and can run a model-based scorer.
CAN_SCORE_KEY = "can-score"
#: Round config key: 1 where the run's scorer is ``auto`` (a node that can hold the model
#: should say so, even in a round it is sent ``uniform``).
AUTO_SCORER_KEY = "scorer-auto"


def node_scorer(scorer: str, can_score: bool) -> str:
    """The scorer a node runs: ``auto`` resolved by whether it can score, others as set."""
    if scorer != AUTO:
        return scorer
    return MODEL_SCORER if can_score else "uniform"


def node_rule(rule: str, scorer: str) -> str:
    """The selection rule a node runs with its (resolved) ``scorer``."""
    if rule != AUTO:
        return rule
    return "topk" if scorer == "uniform" else "sample"


def model_knob(config: Mapping[str, Any]) -> str | None:
    """The knob that makes a round need the model (and PyTorch), or ``None``.

    ``config`` is the round's config record as a node receives it: a gradient round
    (``upload-mode`` gradient or auto), a ``scorer`` other than ``uniform`` (``auto`` is
    resolved by the server before it is sent), or a ``compensation`` other than ``none``
    needs the model; a data round with neither does not (the server sends no model then).
    """
    if config.get("round-mode", "data") == "gradient":
        return "upload-mode (a gradient round)"
    scorer = str(config.get("scorer", "uniform"))
    if scorer not in ("uniform", AUTO):
        return f"scorer={scorer!r}"
    compensation = str(config.get("compensation", "none"))
    if compensation != "none":
        return f"compensation={compensation!r}"
    return None
