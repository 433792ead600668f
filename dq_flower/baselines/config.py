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
from dq_flower.config import check_choice, check_robust_knobs, client_knob, parse_params

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
#: Codec parameters that are also run-config keys of their own (0 = not set).
CODEC_PARAM_KNOBS = ("levels", "bucket", "ratio", "rank")


@dataclass(frozen=True)
class GradientConfig:
    """Knobs of distributed SGD with compressed uploads (the gradient baselines).

    Every knob has a neutral value (``""``, ``0``, ``"auto"``) so that one run config
    (``pyproject.toml``) can list them all without overriding a method's own choices.

    Attributes
    ----------
    codec : str
        Registry name of the upload codec (``identity``, ``fp16``, ``qsgd``, ``terngrad``,
        ``sign``, ``ef-sign``, ``topk``, ``powersgd``, ``bingrad``, ``orq``); each method
        sets its own.
    codec_params : str
        Codec parameters, ``"levels=4,bucket=512"``, over :data:`CODEC_DEFAULTS`.
    levels, bucket, rank : int
        Shortcuts overriding the same names in ``codec_params`` (0 = not set).
    ratio : float
        Same for top-k's kept fraction (0 = not set).
    local_steps : int
        tau: local SGD steps per round. With 1 a client sends its minibatch gradient;
        with more it sends the mean gradient along its local trajectory,
        ``(w_0 - w_tau) / (client_lr * tau)``.
    local_epochs : int
        E: with E >= 1 each client runs E full epochs over its data (minibatches of
        ``batch_size``, shuffled as FedAvg's client does) with ``client_lr`` and sends the
        pseudo-gradient ``(w_0 - w) / (client_lr * steps)``; the server multiplies each
        decoded update by ``client_lr * steps`` (the client's model delta) before the
        weighted mean, so its ``lr`` scales the mean delta: ``lr = 1`` with momentum 0 is
        FedAvg exactly. 0 (default) means not set: ``local_steps`` applies.
    batch_size : int
        Client minibatch size (per local step).
    client_lr : float
        Client step size of the local steps (only used when ``local_steps > 1``).
    lr : float
        Server learning rate (with majority vote: the size of the sign step).
    momentum : float
        Server momentum (mean aggregation); with majority vote it is the clients' own
        momentum (Signum), since the server's step must be a pure sign.
    weight_decay : float
        Weight decay of the server step.
    optimizer : str
        ``sgd`` or ``adam`` (mean aggregation only).
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
    trim_fraction : float
        Fraction cut at each end by ``aggregation="trimmed-mean"``.
    clip_norm : float
        Clip every client's update to this L2 norm before aggregating (0: off).
    clip_factor : float
        Clip every client's update to this multiple of the round's median norm before
        aggregating, so that one client moves the aggregate by at most a median norm times
        its weight share (0: off; default 1).
    min_cosine : float
        Leave a node's update out of the round's mean while its cosine with the mean of
        the round's other updates is below this on average over its last 10 rounds
        (default -0.1: it keeps pointing against the others; -1: off; see
        :class:`dq_flower.server.robust.DirectionScreen`).
    weight_cap : float
        A client's example weight counts at most this multiple of the round's median
        weight (0: off; default 2).
    norm_bound_factor : float
        Reject a vector whose norm exceeds this multiple of the recent rounds' median
        norms (0: off; default 5; see :mod:`dq_flower.server.robust`).
    """

    codec: str = client_knob("identity")
    codec_params: str = client_knob("")
    levels: int = client_knob(0)
    bucket: int = client_knob(0)
    ratio: float = client_knob(0.0)
    rank: int = client_knob(0)
    local_steps: int = client_knob(1)
    local_epochs: int = client_knob(0)
    batch_size: int = client_knob(32)
    client_lr: float = client_knob(0.1)
    lr: float = client_knob(0.1)
    momentum: float = client_knob(0.9)
    weight_decay: float = client_knob(0.0)
    optimizer: str = "sgd"
    downlink: str = client_knob("auto")
    aggregation: str = client_knob("auto")
    error_feedback: str = client_knob("auto")
    per_tensor: str = client_knob("auto")
    entropy_coder: str = client_knob("zlib")
    max_failed_rounds: int = 3
    trim_fraction: float = client_knob(0.2)
    clip_norm: float = client_knob(0.0)
    clip_factor: float = 1.0
    min_cosine: float = -0.1
    weight_cap: float = 2.0
    norm_bound_factor: float = client_knob(5.0)

    def __post_init__(self) -> None:
        _check(self.max_failed_rounds >= 0, "max-failed-rounds", "must be >= 0")
        check_robust_knobs(self)
        _check(self.local_steps >= 1, "local-steps", f"must be >= 1, got {self.local_steps}")
        _check(self.local_epochs >= 0, "local-epochs",
               f"must be >= 0 (0 = not set), got {self.local_epochs}")
        _check(not (self.local_epochs and self.local_steps > 1), "local-epochs",
               f"runs whole epochs; it cannot be combined with local-steps={self.local_steps}")
        check_choice(self.entropy_coder, ENTROPY_CODERS, "entropy-coder")
        if self.entropy_coder == "context" and self.codec in ZLIB_UNDER_CONTEXT:
            object.__setattr__(self, "entropy_coder", "zlib")  # no codes it models better
        _check(self.entropy_coder in (*available(), "context"), "entropy-coder",
               f"{self.entropy_coder!r} needs the optional 'zstandard' package")
        _check(self.batch_size >= 1, "batch-size", f"must be >= 1, got {self.batch_size}")
        _check(self.client_lr > 0, "client-lr", f"must be > 0, got {self.client_lr}")
        _check(self.lr > 0, "lr", f"must be > 0, got {self.lr}")
        _check(0 <= self.momentum < 1, "momentum", f"must be in [0, 1), got {self.momentum}")
        _check(self.weight_decay >= 0, "weight-decay", f"must be >= 0, got {self.weight_decay}")
        _check(self.optimizer in {"sgd", "adam"}, "optimizer",
               f"must be sgd or adam, got {self.optimizer!r}")
        for name in ("levels", "bucket", "rank"):
            _check(getattr(self, name) >= 0, name, "must be >= 0 (0 = not set)")
        _check(0 <= self.ratio <= 1, "ratio", "must be in [0, 1] (0 = not set)")
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
        """Whether clients run whole local epochs (``local_epochs`` >= 1)."""
        return self.local_epochs > 0

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
            if value:
                params[name] = value
        return params


@dataclass(frozen=True)
class FedAvgConfig:
    """Client knobs of Flower's FedAvg (the server side is ``flwr.serverapp.strategy.FedAvg``).

    Attributes
    ----------
    local_epochs : int
        E: epochs of local SGD over the client's partition per round (0 = not set: 1, so
        one run config can list the key for every method).
    client_lr : float
        Client learning rate.
    batch_size : int
        Client minibatch size.
    client_momentum : float
        Momentum of the client's SGD (restarted every round).
    """

    local_epochs: int = 1
    client_lr: float = 0.1
    batch_size: int = 32
    client_momentum: float = 0.0

    def __post_init__(self) -> None:
        _check(self.local_epochs >= 0, "local-epochs",
               f"must be >= 1 (or 0 = not set), got {self.local_epochs}")
        if self.local_epochs == 0:
            object.__setattr__(self, "local_epochs", 1)
        _check(self.client_lr > 0, "client-lr", f"must be > 0, got {self.client_lr}")
        _check(self.batch_size >= 1, "batch-size", f"must be >= 1, got {self.batch_size}")
        _check(0 <= self.client_momentum < 1, "client-momentum",
               f"must be in [0, 1), got {self.client_momentum}")
