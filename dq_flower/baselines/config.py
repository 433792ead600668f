"""Typed configs of the baselines: compressed-gradient SGD and Flower's FedAvg."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.codecs import CONTEXT, coder_for, make
from dq_flower.codecs.entropy import available
from dq_flower.codecs.uniform import SAMPLE_CODERS
from dq_flower.config import CodecParams, check
from dq_flower.knob import (
    MAX_EPOCHS,
    MAX_ROWS,
    MAX_STEPS,
    above,
    at_least,
    between,
    inherit,
    knob,
    one_of,
)
from dq_flower.knobs import OptimizerConfig, RobustConfig

__all__ = ["GradientConfig", "FedAvgConfig", "DOWNLINKS", "AGGREGATIONS", "ERROR_FEEDBACK",
           "PER_TENSOR", "CODEC_DEFAULTS", "ENTROPY_CODERS"]

#: How the server sends the model to the clients (``auto``: ``sign`` under majority vote,
#: else ``float32``).
DOWNLINKS = ("auto", "float32", "fp16", "sign")
#: How the server combines the decoded client vectors (``auto``: ``majority`` for the
#: ``sign`` codec, else ``mean``); ``median`` (coordinate-wise) and ``trimmed-mean`` are
#: robust to a minority of bad clients.
AGGREGATIONS = ("auto", "mean", "majority", "median", "trimmed-mean")
#: When the clients wrap the codec in error feedback (``auto``: where the codec is biased
#: and the aggregation is the mean).
ERROR_FEEDBACK = ("auto", "on", "off")
#: Whether each parameter tensor is coded on its own (``auto``: for PowerSGD, which needs
#: the layers' matrix shapes, and TernGrad, whose scale is per tensor).
PER_TENSOR = ("auto", "on", "off")
PER_TENSOR_CODECS = ("powersgd", "terngrad")
#: Codec parameters of the baselines where they differ from the codec's own defaults;
#: ``codec-params`` and the ``levels``/``bucket``/``ratio``/``rank`` knobs override them.
CODEC_DEFAULTS: dict[str, dict[str, Any]] = {
    "qsgd": {"levels": 4, "bucket": 512},
    "orq": {"levels": 3, "bucket": 512},
    "bingrad": {"bucket": 512},
    "topk": {"ratio": 0.01},
    "powersgd": {"rank": 2},
}
#: Lossless coders of every payload (``entropy-coder``); ``zstd`` needs ``zstandard``.
#: ``context`` (DQ's default, a model of quantized sample codes) is accepted so that one run
#: config serves every method; the registry's ``coder_for`` resolves it per codec.
ENTROPY_CODERS = SAMPLE_CODERS
#: Codec parameters that are also run-config keys of their own (``None``: not set; the run
#: config spells it 0).
CODEC_PARAM_KNOBS = ("levels", "bucket", "ratio", "rank")


def _off_or_positive(value: Any) -> str | None:
    return None if value >= 1 else f"must be >= 1 (None or 0 = not set), got {value}"


def _coder_here(value: Any) -> str | None:
    if value not in ENTROPY_CODERS:
        return f"must be one of {ENTROPY_CODERS}, got {value!r}"
    if value not in (*available(), CONTEXT):
        return f"{value!r} needs the optional 'zstandard' package: pip install zstandard"
    return None


@dataclass(frozen=True)
class GradientConfig(RobustConfig, OptimizerConfig):
    """Knobs of distributed SGD with compressed uploads (the gradient baselines).

    Every field is a :class:`~dq_flower.knob.Knob` (checked as it is set; its ``doc`` is
    the knob table of ``docs/baselines.md``). Every knob a method may set itself has a
    run-config spelling of "not set" (``""``, ``0``, ``"auto"``) so that one run config
    (``pyproject.toml``) can list them all without overriding a method's own choices; in
    Python that is ``None`` (or the same spelling). With ``local_epochs`` E >= 1 each client
    runs E epochs and sends the pseudo-gradient ``(w_0 - w) / (client_lr * steps)``; the
    server multiplies each decoded update by ``client_lr * steps`` before the weighted
    mean, so ``lr = 1`` with momentum 0 is FedAvg exactly. With majority vote ``lr`` is the
    size of the sign step and ``momentum`` the clients' own (Signum).
    """

    codec: str = knob("identity", client=True, doc=(
        "registry codec of the uploads (each method sets its own)"))
    codec_params: CodecParams = knob(CodecParams(), client=True, unset="", coerce=CodecParams,
                                     doc=(
        "codec parameters (`codec-params.levels = 4`, or the text `\"levels=4,bucket=512\"`; "
        "in Python a dict), layered over the baseline defaults (`qsgd` levels 4 bucket 512, "
        "`orq` levels 3 bucket 512, `bingrad` bucket 512, `topk` ratio 0.01, `powersgd` "
        "rank 2)"))
    levels: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding the codec parameter `levels`"))
    bucket: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding the codec parameter `bucket`"))
    ratio: float | None = knob(None, lambda v: None if 0 < v <= 1 else (
        f"must be in (0, 1] (None or 0 = not set), got {v}"), client=True, unset=0.0,
        doc="top-k's kept fraction")
    rank: int | None = knob(None, _off_or_positive, client=True, unset=0, doc=(
        "shortcut overriding PowerSGD's `rank`"))
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
    error_feedback: str = knob("auto", one_of(ERROR_FEEDBACK), client=True, unset="auto",
                               doc="`on`, `off`; `auto` = on for biased codecs under mean "
                                   "aggregation")
    per_tensor: str = knob("auto", one_of(PER_TENSOR), client=True, unset="auto", doc=(
        "`on`, `off`; `auto` = on for `powersgd` and `terngrad`"))
    entropy_coder: str = knob("zlib", _coder_here, client=True, doc=(
        "lossless stage of every upload and of the model broadcast: `none`, `zlib`, `lzma`, "
        "`zstd` (with `pip install zstandard`), `context` (the codes "
        "of `qsgd` and `terngrad` modelled, `zlib` for the other codecs and the broadcast); "
        "per message only where it shrinks it"))
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
        try:
            self.make_codec()
        except ValueError as exc:
            key = "codec" if "unknown codec" in str(exc) else "codec-params"
            raise ValueError(f"{key}: {exc}") from None

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
    def segmented(self) -> bool:
        """Whether the update is coded per parameter tensor (``per_tensor`` resolved)."""
        if self.per_tensor == "auto":
            return self.codec in PER_TENSOR_CODECS
        return self.per_tensor == "on"

    @property
    def epochs_mode(self) -> bool:
        """Whether clients run whole local epochs (``local_epochs`` set, >= 1)."""
        return self.local_epochs is not None

    @property
    def epochs(self) -> int:
        """``local_epochs``, 0 where it is not set."""
        return self.local_epochs or 0

    @property
    def coder(self) -> str:
        """``entropy_coder`` as the registry resolves it for ``codec``."""
        return coder_for(self.codec, self.entropy_coder)

    @property
    def entropy(self) -> str:
        """The uploads' lossless coder: ``entropy`` of ``codec_params``, else ``entropy_coder``."""
        return str(self.codec_kwargs.get("entropy", self.entropy_coder))

    def make_codec(self):
        """The upload codec: the registry codec, entropy-coded with :attr:`entropy`."""
        return make(self.codec, **{**self.codec_kwargs, "entropy": self.entropy})

    @property
    def codec_kwargs(self) -> dict[str, Any]:
        """The codec's parameters: defaults, then ``codec_params``, then the shortcut knobs."""
        params = dict(CODEC_DEFAULTS.get(self.codec, {}))
        params.update(self.codec_params)
        for name in CODEC_PARAM_KNOBS:
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        return params


@dataclass(frozen=True)
class FedAvgConfig:
    """Client knobs of Flower's FedAvg (the server side is ``flwr.serverapp.strategy.FedAvg``)."""

    local_epochs: int = knob(1, at_least(1), unset=0, doc=(
        "E, epochs over the partition per round (`0` or `None`: not set, 1)"))
    client_lr: float = knob(0.1, above(0), doc="client SGD step size")
    batch_size: int = knob(32, at_least(1), doc="client minibatch")
    client_momentum: float = knob(0.0, between(0, 1, high_open=True), doc=(
        "client SGD momentum (restarted every round)"))
