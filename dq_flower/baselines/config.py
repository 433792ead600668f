"""Typed configs of the baselines: compressed-gradient SGD and Flower's FedAvg."""

from __future__ import annotations

from dataclasses import dataclass

from dq_flower.codec_choice import (
    CODEC_DEFAULTS,
    ENTROPY_CODERS,
    ERROR_FEEDBACK,
    PER_TENSOR,
    CodecChoice,
)
from dq_flower.config import (
    MAX_EPOCHS,
    MAX_ROWS,
    MAX_STEPS,
    OptimizerConfig,
    RobustConfig,
    above,
    at_least,
    between,
    check,
    inherit,
    knob,
    one_of,
)

__all__ = ["GradientConfig", "FedAvgConfig", "DOWNLINKS", "AGGREGATIONS", "ERROR_FEEDBACK",
           "PER_TENSOR", "CODEC_DEFAULTS", "ENTROPY_CODERS"]

#: How the server sends the model to the clients (``auto``: ``sign`` under majority vote,
#: else ``float32``).
DOWNLINKS = ("auto", "float32", "fp16", "sign")
#: How the server combines the decoded client vectors (``auto``: ``majority`` for the
#: ``sign`` codec, else ``mean``); ``median`` (coordinate-wise) and ``trimmed-mean`` are
#: robust to a minority of bad clients.
AGGREGATIONS = ("auto", "mean", "majority", "median", "trimmed-mean")


@dataclass(frozen=True)
class GradientConfig(CodecChoice, RobustConfig, OptimizerConfig):
    """Knobs of distributed SGD with compressed uploads (the gradient baselines).

    Every field is a :class:`~dq_flower.config.Knob` (checked as it is set; its ``doc`` is
    the knob table of ``docs/baselines.md``); the codec's are the
    :class:`~dq_flower.codec_choice.CodecChoice` group. A knob a method sets itself has a
    run-config spelling of "not set" (``""``, ``0``, ``"auto"``), so that one run config
    can list them all and leave each method its own (a method is a config subclass with
    other defaults); in Python that is ``None`` (or the same spelling). With
    ``local_epochs`` E >= 1 each client runs E epochs and sends the pseudo-gradient ``(w_0
    - w) / (client_lr * steps)``; the server multiplies each decoded update by ``client_lr
    * steps`` before the weighted mean, so ``lr = 1`` with momentum 0 is FedAvg exactly.
    With majority vote ``lr`` is the size of the sign step and ``momentum`` the clients'
    own (Signum).
    """

    local_steps: int = knob(1, between(1, MAX_STEPS), client=True, doc=(
        "tau; with more than 1, the client sends its mean trajectory gradient"))
    local_epochs: int | None = knob(None, between(1, MAX_EPOCHS, note="None or 0 = not set"),
                                     client=True, unset=0, doc=(
        "E >= 1: whole local epochs per round, FedAvg-style (the `fedavg-*` methods set 1; "
        "not with `local-steps` > 1)"))
    batch_size: int = knob(32, between(1, MAX_ROWS), client=True, doc="client minibatch per step")
    client_lr: float = knob(0.1, above(0), client=True, doc="client step size for tau > 1")
    # the groups' fields the clients read: they apply the vote (lr, weight decay) and
    # Signum's momentum themselves
    lr: float = inherit(OptimizerConfig, "lr", client=True, doc=(
        "server learning rate (`signsgd`: 0.005); under majority vote the sign step"))
    momentum: float = inherit(OptimizerConfig, "momentum", client=True, doc=(
        "server momentum; under majority vote the clients' (Signum)"))
    weight_decay: float = inherit(OptimizerConfig, "weight_decay", client=True)
    downlink: str = knob("auto", one_of(DOWNLINKS), client=True, unset="auto", doc=(
        "`float32`, `fp16`, `sign` (majority only); `auto` = `sign` under majority vote, "
        "else `float32`"))
    aggregation: str = knob("auto", one_of(AGGREGATIONS), client=True, unset="auto", doc=(
        "`mean`, `majority`, `median`, `trimmed-mean`; `auto` = majority for the `sign` "
        "codec"))
    max_failed_rounds: int = knob(3, at_least(0), doc=(
        "stop when every sampled client failed this many rounds in a row (0: never)"))
    trim_fraction: float = inherit(RobustConfig, "trim_fraction", client=True)
    clip_norm: float = inherit(RobustConfig, "clip_norm", client=True)
    norm_bound_factor: float = inherit(RobustConfig, "norm_bound_factor", client=True)

    def __post_init__(self) -> None:
        """The checks that involve two knobs (each knob checked itself as it is set)."""
        check(not (self.local_epochs and self.local_steps > 1), "local-epochs",
              f"runs whole epochs; it cannot be combined with local-steps={self.local_steps}")
        if self.majority:
            check(self.optimizer == "sgd", "optimizer",
                  "majority vote steps by the sign of the vote; use sgd")
        else:
            check(self.downlink != "sign", "downlink",
                  "'sign' (1-bit vote broadcast) needs aggregation='majority'")
        super().__post_init__()

    @property
    def majority(self) -> bool:
        """Whether the server aggregates by majority vote (``aggregation`` resolved)."""
        if self.aggregation == "auto":
            return self.codec == "sign"
        return self.aggregation == "majority"

    @property
    def downlink_mode(self) -> str:
        """``float32``, ``fp16`` or ``sign`` (``downlink`` resolved)."""
        if self.downlink == "auto":
            return "sign" if self.majority else "float32"
        return self.downlink

    @property
    def epochs_mode(self) -> bool:
        """Whether clients run whole local epochs (``local_epochs`` set, >= 1)."""
        return self.local_epochs is not None

    @property
    def epochs(self) -> int:
        """``local_epochs``, 0 where it is not set."""
        return self.local_epochs or 0


@dataclass(frozen=True)
class FedAvgConfig:
    """Client knobs of Flower's FedAvg (the server side is ``flwr.serverapp.strategy.FedAvg``)."""

    local_epochs: int = knob(1, at_least(1), unset=0, doc=(
        "E, epochs over the partition per round (`0` or `None`: not set, 1)"))
    client_lr: float = knob(0.1, above(0), doc="client SGD step size")
    batch_size: int = knob(32, at_least(1), doc="client minibatch")
    client_momentum: float = knob(0.0, between(0, 1, high_open=True), doc=(
        "client SGD momentum (restarted every round)"))
