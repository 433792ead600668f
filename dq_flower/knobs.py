"""Knob groups that several methods' configs share: robust aggregation and the optimizer.

Each group is a frozen dataclass that validates itself. :class:`dq_flower.DQConfig` and
:class:`dq_flower.baselines.config.GradientConfig` inherit both, so the knobs stay flat
(``DQConfig(lr=0.1)``, ``cfg.clip_factor``, run-config key ``clip-factor``) while each group
is declared and checked once; ``cfg.robust`` and ``cfg.optimizer_config`` return a config's
group as its own dataclass. A config may override a field to give it another default or
send it to its clients (:func:`dq_flower.config.client_knob`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from dq_flower.config import check, check_robust_knobs, knob

__all__ = ["RobustConfig", "OptimizerConfig", "OPTIMIZERS"]

#: The server optimizers (:func:`dq_flower.server.common.make_optimizer`).
OPTIMIZERS = ("sgd", "adam")


def _values(cfg: Any, group: type) -> dict[str, Any]:
    """The values in ``cfg`` of the fields that ``group`` declares."""
    return {f.name: getattr(cfg, f.name) for f in dataclasses.fields(group)}


@dataclass(frozen=True)
class RobustConfig:
    """Knobs of the robust aggregation of client vectors (updates, gradients, compensations).

    Attributes
    ----------
    trim_fraction : float
        Fraction cut at each end by the ``trimmed-mean`` aggregation, in [0, 0.5).
    clip_norm : float
        Clip every client's vector to this L2 norm before aggregating (0: off).
    clip_factor : float
        Clip every client's vector to this multiple of the round's median norm before
        aggregating, so that one client moves the aggregate by at most a median norm times
        its weight share (0: off; default 1).
    min_cosine : float
        Leave a node's vector out of the round's mean while its cosine with the mean of the
        round's other vectors is below this on average over its last 10 rounds (default
        -0.1: it keeps pointing against the others; -1: off; see
        :class:`dq_flower.server.robust.DirectionScreen`).
    weight_cap : float
        A client's example weight counts at most this multiple of the round's median
        weight (0: off; default 2).
    norm_bound_factor : float
        Reject a vector whose norm exceeds this multiple of the recent rounds' median norms
        (0: off; default 5; see :mod:`dq_flower.server.robust`).

    The run config's listing of ``clip-factor``, ``min-cosine`` and ``weight-cap`` at these
    defaults means "not set": a method that sets its own (the ``fedavg-*`` methods' plain
    mean) keeps it.
    """

    trim_fraction: float = 0.2
    clip_norm: float = 0.0
    clip_factor: float = knob(1.0, unset=1.0)
    min_cosine: float = knob(-0.1, unset=-0.1)
    weight_cap: float = knob(2.0, unset=2.0)
    norm_bound_factor: float = 5.0

    def __post_init__(self) -> None:
        self.check_robust()

    def check_robust(self) -> None:
        """Raise ``ValueError`` naming the key of a robustness knob out of range."""
        check_robust_knobs(self)

    @property
    def robust(self) -> RobustConfig:
        """The robust-aggregation knobs of this config, as a :class:`RobustConfig`."""
        return RobustConfig(**_values(self, RobustConfig))


@dataclass(frozen=True)
class OptimizerConfig:
    """Knobs of the server's optimizer.

    Attributes
    ----------
    optimizer : str
        ``sgd`` (momentum, weight decay) or ``adam``.
    lr : float
        Learning rate (> 0).
    momentum : float
        SGD momentum, in [0, 1).
    weight_decay : float
        Weight decay (>= 0).
    """

    optimizer: str = "sgd"
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        self.check_optimizer()

    def check_optimizer(self) -> None:
        """Raise ``ValueError`` naming the key of a bad optimizer knob."""
        check(self.optimizer in OPTIMIZERS, "optimizer",
              f"must be sgd or adam, got {self.optimizer!r}")
        check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        check(0 <= self.momentum < 1, "momentum", f"must be in [0, 1), got {self.momentum}")
        check(self.weight_decay >= 0, "weight_decay", f"must be >= 0, got {self.weight_decay}")

    @property
    def optimizer_config(self) -> OptimizerConfig:
        """The optimizer knobs of this config, as an :class:`OptimizerConfig`."""
        return OptimizerConfig(**_values(self, OptimizerConfig))
