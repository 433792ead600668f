"""Typed configs of the baselines: compressed-gradient SGD and Flower's FedAvg.

Like :class:`dq_flower.dq.config.DQConfig`, each is a frozen dataclass that validates itself
and raises ``ValueError`` naming the (hyphenated) key; the same fields are run-config keys
(``local-steps``) and keyword arguments of :func:`dq_flower.harness.simulate` (``local_steps``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dq_flower.codecs import make, names
from dq_flower.codecs.context_coded import coder_for
from dq_flower.codecs.entropy import available
from dq_flower.codecs.registry import codec_class
from dq_flower.codecs.uniform import SAMPLE_CODERS
from dq_flower.config import check as _check
from dq_flower.config import check_choice, clear_unset, client_knob, knob, parse_params
from dq_flower.knobs import OptimizerConfig, RobustConfig

__all__ = [
    "GradientConfig",
    "FedAvgConfig",
    "DOWNLINKS",
    "AGGREGATIONS",
    "ERROR_FEEDBACK",
    "PER_TENSOR",
    "CODEC_DEFAULTS",
    "ENTROPY_CODERS",
]

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
#: config serves every method: ``qsgd`` and ``terngrad`` uploads get their codes modelled
#: (:mod:`dq_flower.codecs.context_coded`, never larger than zlib); every other codec's
#: uploads, and the downlink model, are zlib-coded.
ENTROPY_CODERS = SAMPLE_CODERS
#: Codecs whose uploads ``context`` leaves to zlib (the run's coder is then ``zlib``).
ZLIB_UNDER_CONTEXT = tuple(n for n in names() if coder_for(codec_class(n)()) == "zlib")
#: Codec parameters that are also run-config keys of their own (``None``: not set; the run
#: config spells it 0).
CODEC_PARAM_KNOBS = ("levels", "bucket", "ratio", "rank")


@dataclass(frozen=True)
class GradientConfig(RobustConfig, OptimizerConfig):
    """Knobs of distributed SGD with compressed uploads (the gradient baselines).

    Every knob a method may set itself has a run-config spelling of "not set" (``""``,
    ``0``, ``"auto"``; :func:`dq_flower.config.knob`'s ``unset``) so that one run config
    (``pyproject.toml``) can list them all without overriding a method's own choices.

    Attributes
    ----------
    codec : str
        Registry name of the upload codec (``identity``, ``fp16``, ``qsgd``, ``terngrad``,
        ``sign``, ``ef-sign``, ``topk``, ``powersgd``, ``bingrad``, ``orq``); each method
        sets its own.
    codec_params : str
        Codec parameters, ``"levels=4,bucket=512"``, over :data:`CODEC_DEFAULTS`.
    levels, bucket, rank : int or None
        Shortcuts overriding the same names in ``codec_params`` (``None``: not set; the
        run config spells it 0, and 0 is read as ``None`` here too).
    ratio : float or None
        Same for top-k's kept fraction (``None``: not set; 0 in the run config).
    local_steps : int
        tau: local SGD steps per round. With 1 a client sends its minibatch gradient;
        with more it sends the mean gradient along its local trajectory,
        ``(w_0 - w_tau) / (client_lr * tau)``.
    local_epochs : int or None
        E: with E >= 1 each client runs E full epochs over its data (minibatches of
        ``batch_size``, shuffled as FedAvg's client does) with ``client_lr`` and sends the
        pseudo-gradient ``(w_0 - w) / (client_lr * steps)``; the server multiplies each
        decoded update by ``client_lr * steps`` (the client's model delta) before the
        weighted mean, so its ``lr`` scales the mean delta: ``lr = 1`` with momentum 0 is
        FedAvg exactly. ``None`` (the default; 0 in the run config, and 0 is read as
        ``None`` here too) means not set: ``local_steps`` applies.
    batch_size : int
        Client minibatch size (per local step).
    client_lr : float
        Client step size of the local steps (only used when ``local_steps > 1``).
    optimizer, lr, momentum, weight_decay
        The server optimizer (:class:`dq_flower.knobs.OptimizerConfig`; ``adam`` with mean
        aggregation only). With majority vote ``lr`` is the size of the sign step and
        ``momentum`` the clients' own (Signum), since the server's step must be a pure sign.
    downlink : str
        ``auto``, ``float32`` (the model as raw float32), ``fp16``, or ``sign`` (majority
        vote only: the vote, 1 bit per coordinate; clients keep a model copy and apply it).
    aggregation : str
        ``auto``, ``mean`` (weighted by ``num-examples``) or ``majority`` (sign of the sum
        of signs, one vote per client).
    error_feedback : str
        ``auto`` (where the codec is biased and the aggregation is the mean), ``on``,
        ``off``.
    per_tensor : str
        ``auto``, ``on`` (code each parameter tensor separately: one payload, residual and
        codec state per tensor; conv kernels are ``out x (in * k * k)`` matrices) or ``off``
        (code the flat vector).
    entropy_coder : str
        Lossless coding of every payload of the run (the uploads and the downlink model):
        ``zlib`` (default, as DQ's), ``none`` (the codec's exact fixed-length payloads),
        ``lzma`` or ``zstd``, applied per message only where it shrinks it (``entropy=`` in
        ``codec_params`` takes precedence for the uploads). Every comparison preset sets
        ``zlib`` for every method. ``context`` (DQ's default for its samples) models the
        codes of ``qsgd`` and ``terngrad`` uploads (per message the smaller of it and
        zlib; the downlink model gets zlib) and is taken as ``zlib`` for every other
        codec, so a run config shared by DQ and the baselines is valid for both.
    max_failed_rounds : int
        Stop the run when every sampled client fails this many rounds in a row (0: never).
    trim_fraction, clip_norm, clip_factor, min_cosine, weight_cap, norm_bound_factor
        The robust-aggregation knobs (:class:`dq_flower.knobs.RobustConfig`) of the
        clients' decoded updates (``trimmed-mean``: ``aggregation="trimmed-mean"``).
    """

    codec: str = client_knob("identity")
    codec_params: str = client_knob("", unset="")
    levels: int | None = client_knob(None, unset=0)
    bucket: int | None = client_knob(None, unset=0)
    ratio: float | None = client_knob(None, unset=0.0)
    rank: int | None = client_knob(None, unset=0)
    local_steps: int = client_knob(1)
    local_epochs: int | None = client_knob(None, unset=0)
    batch_size: int = client_knob(32)
    client_lr: float = client_knob(0.1)
    # the groups' fields the clients read: they apply the vote (lr, weight decay) and
    # Signum's momentum themselves
    lr: float = client_knob(0.1)
    momentum: float = client_knob(0.9)
    weight_decay: float = client_knob(0.0)
    downlink: str = client_knob("auto", unset="auto")
    aggregation: str = client_knob("auto", unset="auto")
    error_feedback: str = client_knob("auto", unset="auto")
    per_tensor: str = client_knob("auto", unset="auto")
    entropy_coder: str = client_knob("zlib")
    max_failed_rounds: int = 3
    trim_fraction: float = client_knob(0.2)  # RobustConfig's, sent to the clients
    clip_norm: float = client_knob(0.0)
    norm_bound_factor: float = client_knob(5.0)

    def __post_init__(self) -> None:
        clear_unset(self)  # the old spelling of "not set", 0, is None
        _check(self.max_failed_rounds >= 0, "max-failed-rounds", "must be >= 0")
        self.check_robust()
        _check(self.local_steps >= 1, "local-steps", f"must be >= 1, got {self.local_steps}")
        _check(self.local_epochs is None or self.local_epochs >= 1, "local-epochs",
               f"must be >= 1 (None or 0 = not set), got {self.local_epochs}")
        _check(not (self.local_epochs and self.local_steps > 1), "local-epochs",
               f"runs whole epochs; it cannot be combined with local-steps={self.local_steps}")
        check_choice(self.entropy_coder, ENTROPY_CODERS, "entropy-coder")
        if self.entropy_coder == "context" and self.codec in ZLIB_UNDER_CONTEXT:
            object.__setattr__(self, "entropy_coder", "zlib")  # no codes it models better
        _check(self.entropy_coder in (*available(), "context"), "entropy-coder",
               f"{self.entropy_coder!r} needs the optional 'zstandard' package")
        _check(self.batch_size >= 1, "batch-size", f"must be >= 1, got {self.batch_size}")
        _check(self.client_lr > 0, "client-lr", f"must be > 0, got {self.client_lr}")
        self.check_optimizer()
        for name in ("levels", "bucket", "rank"):
            value = getattr(self, name)
            _check(value is None or value >= 1, name, f"must be >= 1 (None or 0 = not set), "
                   f"got {value}")
        _check(self.ratio is None or 0 < self.ratio <= 1, "ratio",
               f"must be in (0, 1] (None or 0 = not set), got {self.ratio}")
        check_choice(self.downlink, DOWNLINKS, "downlink")
        check_choice(self.aggregation, AGGREGATIONS, "aggregation")
        check_choice(self.error_feedback, ERROR_FEEDBACK, "error-feedback")
        check_choice(self.per_tensor, PER_TENSOR, "per-tensor")
        if self.majority:
            _check(self.optimizer == "sgd", "optimizer",
                   "majority vote steps by the sign of the vote; use sgd")
        else:
            _check(self.downlink != "sign", "downlink",
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
        params.update(parse_params(self.codec_params, "codec-params"))
        for name in CODEC_PARAM_KNOBS:
            value = getattr(self, name)
            if value is not None:
                params[name] = value
        return params


@dataclass(frozen=True)
class FedAvgConfig:
    """Client knobs of Flower's FedAvg (the server side is ``flwr.serverapp.strategy.FedAvg``).

    Attributes
    ----------
    local_epochs : int
        E: epochs of local SGD over the client's partition per round (default 1). Not set
        (``None``, or 0, its run-config spelling, so that one run config can list the key
        for every method) is 1.
    client_lr : float
        Client learning rate.
    batch_size : int
        Client minibatch size.
    client_momentum : float
        Momentum of the client's SGD (restarted every round).
    """

    local_epochs: int = knob(1, unset=0)
    client_lr: float = 0.1
    batch_size: int = 32
    client_momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.local_epochs is None or self.local_epochs == 0:  # not set
            object.__setattr__(self, "local_epochs", 1)
        _check(self.local_epochs >= 1, "local-epochs",
               f"must be >= 1 (None or 0 = not set), got {self.local_epochs}")
        _check(self.client_lr > 0, "client-lr", f"must be > 0, got {self.client_lr}")
        _check(self.batch_size >= 1, "batch-size", f"must be >= 1, got {self.batch_size}")
        _check(0 <= self.client_momentum < 1, "client-momentum",
               f"must be in [0, 1), got {self.client_momentum}")
