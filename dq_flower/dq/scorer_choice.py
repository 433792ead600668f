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

__all__ = ["AUTO", "AUTO_SCORER_KEY", "CAN_SCORE_KEY", "MODEL_SCORER", "RUN_MODEL_KNOB_KEY",
           "model_knob", "node_rule", "node_scorer", "run_model_knob"]

#: The knob value resolved per node.
AUTO = "auto"
#: The scorer ``auto`` resolves to on a node that holds the model.
MODEL_SCORER = "entropy"
#: Reply metric: 1 where the node holds the model and can run a model-based scorer.
CAN_SCORE_KEY = "can-score"
#: Round config key: 1 where the run's scorer is ``auto`` (a node that can hold the model
#: should say so, even in a round it is sent ``uniform``).
AUTO_SCORER_KEY = "scorer-auto"
#: Round config key: the knob of the run that will need the model on every node (sent from
#: the first round on, so a client function given no model fails before any work).
RUN_MODEL_KNOB_KEY = "run-model-knob"


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


def run_model_knob(scorer: str, compensation: str, upload_mode: str) -> str | None:
    """The knob of the run as configured that needs the model on every node, or ``None``.

    Unlike :func:`model_knob` (one round as sent: the first adaptive round sends
    ``uniform``), this reads the run's own knobs, so a node can refuse in round 1 what it
    could only fail later. ``scorer="auto"`` needs no model (a node without one draws
    uniformly); ``upload_mode="auto"`` is left to its rounds.
    """
    if scorer not in ("uniform", AUTO):
        return f"scorer={scorer!r}"
    if compensation != "none":
        return f"compensation={compensation!r}"
    if upload_mode == "gradient":
        return "upload_mode='gradient'"
    return None
