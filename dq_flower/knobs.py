"""Knob groups that several configs share: robust aggregation, the optimizer, a strategy's.

Configs inherit the first two, so the knobs stay flat (``DQConfig(lr=0.1)``,
``clip-factor``); ``cfg.robust`` and ``cfg.optimizer_config`` return a config's group as its
own dataclass. :class:`StrategyConfig` holds the keyword arguments a strategy takes beside
its method's config (``seed``, ``fraction-train``, ...), as Flower's strategies take them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dq_flower.knob import MAX_NODES, at_least, between, knob, one_of

__all__ = ["RobustConfig", "OptimizerConfig", "StrategyConfig", "OPTIMIZERS"]

#: The server optimizers (:func:`dq_flower.server.common.make_optimizer`).
OPTIMIZERS = ("sgd", "adam")


def _values(cfg: Any, group: type) -> dict[str, Any]:
    """The values in ``cfg`` of the fields that ``group`` declares."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(group)}


@dataclass(frozen=True)
class RobustConfig:
    """Knobs of the robust aggregation of client vectors (updates, gradients, compensations).

    ``clip-factor``, ``min-cosine`` and ``weight-cap`` at their defaults mean "not set".
    """

    trim_fraction: float = knob(0.2, between(0, 0.5, high_open=True), doc=(
        "fraction cut at each end by the `trimmed-mean` aggregation"))
    clip_norm: float = knob(0.0, at_least(0, "0 = off"), doc=(
        "clip every client's vector to this L2 norm before aggregating (0: off)"))
    clip_factor: float = knob(1.0, at_least(0, "0 = off"), unset=1.0, doc=(
        "clip each client's vector to this multiple of the round's median norm before "
        "combining (0: off)"))
    min_cosine: float = knob(-0.1, between(-1, 1, note="-1 = off"), unset=-0.1, doc=(
        "leave a node's vector out of the round's mean while it points against the mean "
        "of the round's other vectors on average over its last 10 rounds (-1: off)"))
    weight_cap: float = knob(2.0, at_least(0, "0 = off"), unset=2.0, doc=(
        "a client's example count weighs at most this multiple of the round's median "
        "(0: off)"))
    norm_bound_factor: float = knob(5.0, at_least(0, "0 = off"), doc=(
        "reject a vector above this multiple of recent median norms (0: off)"))

    @property
    def robust(self) -> RobustConfig:
        """The robust-aggregation knobs of this config, as a :class:`RobustConfig`."""
        return RobustConfig(**_values(self, RobustConfig))


@dataclass(frozen=True)
class OptimizerConfig:
    """Knobs of the server's optimizer."""

    optimizer: str = knob("sgd", one_of(OPTIMIZERS), doc=(
        "`sgd` (momentum, weight decay) or `adam`"))
    lr: float = knob(0.1, lambda v: None if v > 0 else f"must be > 0, got {v}",
                     doc="server learning rate")
    momentum: float = knob(0.9, between(0, 1, high_open=True), doc="server momentum")
    weight_decay: float = knob(0.0, at_least(0), doc="server weight decay")

    @property
    def optimizer_config(self) -> OptimizerConfig:
        """The optimizer knobs of this config, as an :class:`OptimizerConfig`."""
        return OptimizerConfig(**_values(self, OptimizerConfig))


@dataclass(frozen=True)
class StrategyConfig:
    """Keyword arguments of ``DQStrategy`` and ``GradientStrategy`` beside their config.

    Checked as a strategy is built; ``from_run_config`` reads them by their hyphenated keys.
    """

    seed: int = knob(0, doc=(
        "root of every random choice (node sampling, round seeds, minibatches)"))
    fraction_train: float = knob(1.0, between(0, 1, low_open=True), doc=(
        "fraction of the connected nodes sampled each round"))
    min_available_nodes: int = knob(1, between(1, MAX_NODES), doc=(
        "nodes that must be connected before a round samples (as in Flower's strategies)"))
    fraction_evaluate: float = knob(0.0, between(0, 1), doc=(
        "fraction of the nodes that evaluate the model on their own held-out rows each "
        "round (0: off)"))
    min_evaluate_nodes: int = knob(1, between(0, MAX_NODES), doc=(
        "nodes that must be connected before a round evaluates"))
