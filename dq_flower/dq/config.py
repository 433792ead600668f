"""Typed knobs of the data-quantization method (``DQConfig``).

Each knob is a field of a frozen dataclass that validates itself and raises
``ValueError`` naming the hyphenated key. The same fields are keyword arguments of
:class:`dq_flower.DQStrategy` (``server_steps=10``) and run-config keys of the package's
apps (``server-steps``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dq_flower.codecs import make
from dq_flower.codecs.uniform import SAMPLE_CODERS
from dq_flower.config import check as _check
from dq_flower.config import check_choice, client_keys, client_knob, parse_params
from dq_flower.knobs import OptimizerConfig, RobustConfig

__all__ = ["DQConfig", "SCORERS", "SELECTION_RULES", "ENTROPY_CODERS", "UPLOAD_MODES",
           "RANGE_MODES", "CLIENT_KEYS", "robust_rule", "UPLOAD_SCHEDULES",
           "COMPENSATION_MODES", "AUGMENTATIONS"]


SCORERS = ("auto", "uniform", "loss", "gradnorm", "entropy", "margin")
SELECTION_RULES = ("auto", "topk", "sample", "threshold")
#: Lossless coders of the samples (``context``: the codes' own context model).
ENTROPY_CODERS = SAMPLE_CODERS
UPLOAD_MODES = ("data", "gradient", "auto")
#: ``adaptive``: train to a plateau on the store, ask for more only while it pays
#: (:mod:`dq_flower.dq.server.schedule`); ``fixed``: ``budget`` per client and ``server-steps``
#: steps every round.
UPLOAD_SCHEDULES = ("adaptive", "fixed")
COMPENSATION_MODES = ("first-step", "store", "refresh")
#: Quantizer ranges: ``sample`` (one per sample), ``channel`` (one per image channel),
#: ``feature`` (one per coordinate, the client's own, sent once), ``auto`` (``feature``
#: for flat samples, ``channel`` for images with ``per-channel``, else ``sample``).
RANGE_MODES = ("auto", "sample", "channel", "feature")
#: Server-side augmentation of the store's minibatches (see ``DQConfig.augmentation``).
AUGMENTATIONS = ("auto", "none", "shift", "shift-flip")
#: How long a client identity stays with its node id (see ``DQConfig.identity_binding``).
IDENTITY_BINDINGS = ("connected", "node")
#: How the server weights the store's rows in its training loss.
STORE_WEIGHTS = ("importance", "node")
#: Precisions of the model the server sends (see :func:`model_codec`).
MODEL_PRECISIONS = ("auto", "fp32", "fp16", "int8", "int4")
_MODEL_CODEC_OF = {"fp32": "identity", "fp16": "fp16", "int8": "int8", "int4": "int4"}


def model_codec(precision: str, mode: str, compensation: str) -> str:
    """The codec of the model a round sends: ``precision``, ``auto`` resolved.

    ``auto``: ``int8`` where the clients only score with the model, float32 where they
    compute gradients with it (a gradient round, a compensation).
    """
    if precision == "auto":
        precision = "fp32" if mode == "gradient" or compensation != "none" else "int8"
    return _MODEL_CODEC_OF[precision]


@dataclass(frozen=True)
class DQConfig(RobustConfig, OptimizerConfig):
    """Knobs of the data-quantization method.

    Attributes
    ----------
    budget : int
        Samples each client uploads per round (at most) under the ``fixed`` schedule; the
        first round's ask per client under the ``adaptive`` one.
    bits : int
        Bits per data coordinate, 1 to 8.
    stochastic : bool
        Stochastic (unbiased) rounding; nearest rounding (the default) when false. At equal
        uplink bytes nearest rounding bought more accuracy (its codes compress better:
        ``simulations/rounding.py``).
    per_channel : bool
        One affine range per channel instead of per sample (same as ``ranges="channel"``).
    ranges : str
        ``auto``, ``sample``, ``channel`` or ``feature`` (see :data:`RANGE_MODES`).
    dither : bool
        Subtractive dither drawn from the round seed.
    entropy_coder : str
        Lossless coding of every upload: the packed sample codes, the compensation and
        the gradient-round gradients (unless their params set ``entropy=``), per message
        only where it shrinks it: ``none``, ``zlib``, ``lzma``, ``zstd`` or ``context``
        (the default: a context-model ANS coder of the sample codes, each message sent
        zlib-coded instead where that is smaller; the compensation and gradients then use
        ``zlib``, see :attr:`payload_coder`).
    scorer : str
        Importance score: ``auto`` (the default: ``entropy`` on each node that holds the
        model, ``uniform`` on the others; see :mod:`dq_flower.dq.scorer_choice`),
        ``uniform``, ``loss``, ``gradnorm``, ``entropy`` (the predictive entropy) or
        ``margin`` (one minus the gap between the two most probable classes). The
        model-based ones need the model on the clients; under the adaptive schedule the
        first upload round, before the server has trained, uses ``uniform`` and sends no
        model.
    selection_rule : str
        ``auto`` (the default: ``sample`` where the scores come from a model, ``topk``
        where they are uniform), ``topk``, ``sample`` (probability proportional to score,
        weights 1/(n p)) or ``threshold``.
    score_threshold : float
        Score above which ``threshold`` selects (still capped by the budget).
    resend : bool
        Allow samples already uploaded to be chosen again.
    model_precision : str
        Precision of the model the server sends where the clients need it (a model-based
        scorer, compensation, gradient rounds): ``auto`` (the default: ``int8`` where the
        clients only score with it, ``fp32`` where they compute gradients with it),
        ``fp32``, ``fp16`` (half the downlink), ``int8`` or ``int4`` (8 or 4 bits a
        weight, nearest rounding on ranges of 256 weights: about a quarter or an eighth of
        the downlink); the clients then score and compute at the rounded weights.
    compensation : str
        Gradient codec for the compensation, or ``none``.
    compensation_params : str
        Its parameters, ``"levels=4,bucket=512"``.
    compensation_mode : str
        Where the compensation corrects the server's steps: ``first-step`` (only the
        round's first step, on the fresh batch), ``store`` (also every store step, through
        a control variate: the weighted mean of the decoded deltas of the stored samples)
        or ``refresh`` (``store``, and every ``refresh_every`` rounds each client replaces
        its share by a fresh residual over all it uploaded, at the current model).
    refresh_every : int
        Rounds between refreshed residuals under ``compensation_mode="refresh"``.
    compensation_decay : float
        Each round the control variate's old contributions are multiplied by this factor
        (1: no decay); a share refreshed or uploaded in the round is fresh.
    upload_schedule : str
        ``adaptive`` (the default): after each round's uploads the server trains on its
        store to a plateau of a held-out part of it and asks for more samples only while
        the last upload raised the held-out score by ``min_gain`` (the asks sized from the
        observed learning curve); ``fixed``: ``budget`` samples per client and
        ``server_steps`` steps every round. Applies to ``upload_mode="data"``; the other
        upload modes keep the fixed schedule.
    holdout_fraction : float
        Share of each node's stored rows (per class) held out for validation under the
        adaptive schedule; the server never trains on them.
    max_server_steps : int
        Cap on the steps of one round's training phase (adaptive schedule), raised to
        ``max_server_epochs`` passes over the store's training rows where that is more.
    max_server_epochs : float
        Passes over the store's training rows one training phase may take at most (so
        the step cap follows the store's size).
    plateau_eval_every : int
        Steps between two evaluations of the held-out rows.
    plateau_patience : int
        Evaluations without improvement before the learning rate drops (or the phase ends).
    lr_drops : int
        Learning-rate drops (by ``lr_factor``) before a phase ends at a plateau.
    lr_factor : float
        Factor of each learning-rate drop.
    min_gain : float
        Held-out gain per doubling of the store (accuracy for classes, relative loss for
        float targets) below which, with 95% confidence over the pooled paired
        comparisons, the schedule finds the learning curve flat and stops asking.
    min_holdout_rows : int
        Held-out rows per class (in all, for float targets) the schedule needs before it
        may find the curve flat; the first round asks for enough rows to hold them out
        (``min_holdout_rows * classes / holdout_fraction`` in all, at least ``budget`` per
        client).
    probe_after : int
        Rounds without asking, once the curve is flat, before a small probe ask that may
        resume asking (the wait doubles after each probe that finds it still flat; 0:
        never probe, and a run may then end early).
    augmentation : str
        Server-side augmentation of the store's minibatches (never of held-out rows):
        ``auto`` (random shifts of up to 1/14 of the side for image-shaped samples at
        least 14 pixels wide, none for flat ones), ``none``, ``shift`` or ``shift-flip``
        (shifts and horizontal flips: only where flips preserve the label). An
        ``augment=`` callable given to the strategy replaces it.
    store_weights : str
        Weights of the store's rows in the server's training loss: ``node`` (the default:
        every row of a node weighted by the mean of that node's rows, so each node keeps
        its share while rows a model score drew count as they are, as in uncertainty
        sampling) or ``importance`` (each row by the inverse of its inclusion probability:
        an unbiased estimate of the nodes' loss, with the variance of rare large weights).
        The two agree where rows are drawn uniformly; held-out scores always use
        ``importance``.
    max_growth : float
        Largest growth factor of the store from one upload round to the next.
    node_rows_cap : float
        Rows the adaptive schedule asks of one client in all, at most this many times the
        median client's ``num-examples`` (0: no cap), so that one client holding far more
        rows than the others cannot take most of the store (see
        :mod:`dq_flower.dq.server.node_screen`).
    screen_margin : float
        Held-out error (accuracy points; relative loss for float targets) above the median
        client's beyond which a client's rows are excluded from training and asks after a
        training phase (adaptive schedule; 0: off); see
        :class:`~dq_flower.dq.server.node_screen.AgreementScreen`.
    copy_margin : float
        Share of copied rows (packed rows equal to one the client sent before, under new
        row ids) above the median client's beyond which a client's copies are not stored
        (0: counted, never dropped); see
        :class:`~dq_flower.dq.server.node_screen.CopyScreen`.
    server_steps : int
        Optimizer steps the server takes per round (fixed schedule).
    server_batch_size : int
        Minibatch size of the later steps, drawn from the store.
    server_processes : int
        Processes the server trains in (1, the default: the server's own process). With
        more, each round's training runs in that many worker processes joined by
        ``torch.distributed``, each computing the gradient of its share of every minibatch
        of ``server_batch_size`` rows (see :mod:`dq_flower.dq.server.distributed`).
    optimizer, lr, momentum, weight_decay
        The server optimizer (:class:`dq_flower.knobs.OptimizerConfig`; here ``lr`` 0.05,
        ``weight_decay`` 5e-4).
    max_store_samples : int
        Bound on the store (0 = unbounded).
    store_eviction : str
        What goes when the store is full: ``fifo`` (oldest first) or ``random``.
    store_dir : str
        Directory of the store's packed codes, memory-mapped from a file that grows as
        rows arrive (:mod:`dq_flower.dq.server.disk_store`), for a store larger than
        memory; ``""`` (the default) keeps them in memory. The directory is created if
        missing; an old codes file there is emptied when a fresh run stores its first
        row, and reopened when a run resumes from a checkpoint (which refers to the file
        rather than copying it). Evicted rows keep their place in the file.
    identity_binding : str
        How long a client identity stays with the node id that first held it
        (:mod:`dq_flower.dq.server.identity`): ``connected`` (the default: while that node
        is connected; a restarted node under a new id takes its identity back) or ``node``
        (for good). Use ``node`` with SuperNode authentication, where a node id is the one
        its registered key was given and stays the same when the SuperNode restarts: the
        identity is then bound to the key. Without authentication (a simulation draws new
        node ids on a restart) ``node`` leaves a restarted client unable to reclaim it.
    upload_mode : str
        ``data`` (every round uploads quantized samples), ``gradient`` (every round uploads
        a minibatch gradient coded by ``gradient_codec``) or ``auto`` (per round, whichever
        the server estimates to cost fewer uplink bits).
    gradient_codec, gradient_codec_params : str
        Codec (and its parameters) of gradient rounds; error feedback for biased codecs.
    gradient_batch_size : int
        Minibatch size of a client's gradient in gradient rounds.
    max_failed_rounds : int
        Stop the run when every sampled client fails this many rounds in a row (0: never).
    robust_aggregation : str
        How the round's compensations and gradient-round gradients combine: ``mean``
        (``auto``: weighted by examples), ``median`` (coordinate-wise) or ``trimmed-mean``.
    trim_fraction, clip_norm, clip_factor, min_cosine, weight_cap, norm_bound_factor
        The robust-aggregation knobs (:class:`dq_flower.knobs.RobustConfig`), applied to
        every client's compensation, refreshed residual and gradient-round gradient.
    max_abs_value : float
        Largest absolute data value accepted (feature ranges included); 0 (auto) sets it to
        10 times the median, over the first data round's accepted uploads, of each one's
        largest value (see :mod:`dq_flower.dq.server.validation`).
    """

    budget: int = client_knob(64)
    upload_schedule: str = "adaptive"
    holdout_fraction: float = 0.1
    max_server_steps: int = 2000
    max_server_epochs: float = 30.0
    plateau_eval_every: int = 50
    plateau_patience: int = 8
    lr_drops: int = 2
    lr_factor: float = 0.1
    min_gain: float = 0.005
    min_holdout_rows: int = 10
    probe_after: int = 2
    max_growth: float = 2.0
    node_rows_cap: float = 4.0
    screen_margin: float = 0.4
    copy_margin: float = 0.1
    augmentation: str = "auto"
    store_weights: str = "node"
    bits: int = client_knob(2)
    stochastic: bool = client_knob(False)
    per_channel: bool = client_knob(False)
    ranges: str = client_knob("auto")
    dither: bool = client_knob(False)
    entropy_coder: str = client_knob("context")
    scorer: str = client_knob("auto")
    selection_rule: str = client_knob("auto")
    score_threshold: float = client_knob(0.0)
    resend: bool = client_knob(False)
    model_precision: str = "auto"
    compensation: str = client_knob("none")
    compensation_params: str = client_knob("")
    compensation_mode: str = client_knob("first-step")
    refresh_every: int = 5
    compensation_decay: float = 1.0
    server_steps: int = 20
    server_batch_size: int = 64
    server_processes: int = 1
    lr: float = 0.05
    weight_decay: float = 5e-4
    max_store_samples: int = 0
    store_eviction: str = "fifo"
    store_dir: str = ""
    identity_binding: str = "connected"
    upload_mode: str = "data"
    gradient_codec: str = client_knob("qsgd")
    gradient_codec_params: str = client_knob("levels=4,bucket=512")
    gradient_batch_size: int = client_knob(32)
    max_failed_rounds: int = 3
    robust_aggregation: str = "auto"
    max_abs_value: float = 0.0

    def __post_init__(self) -> None:
        self._check_uploads()
        self._check_robustness()
        self._check_compensation()
        self._check_client_choices()
        self._check_server_training()
        self._check_codecs()

    def _check_uploads(self) -> None:
        """The upload mode and schedule, the adaptive schedule's knobs, the quantizer."""
        _check(self.budget >= 1, "budget", f"must be >= 1, got {self.budget}")
        check_choice(self.upload_mode, UPLOAD_MODES, "upload_mode")
        check_choice(self.upload_schedule, UPLOAD_SCHEDULES, "upload_schedule")
        _check(0 <= self.holdout_fraction < 1, "holdout_fraction", "must be in [0, 1)")
        _check(self.model_precision in MODEL_PRECISIONS, "model_precision",
               f"must be one of {', '.join(MODEL_PRECISIONS)}, got {self.model_precision!r}")
        _check(self.upload_schedule == "fixed" or self.upload_mode != "data"
               or self.holdout_fraction > 0, "holdout_fraction",
               "must be > 0 under the adaptive upload schedule")
        for name in ("max_server_steps", "plateau_eval_every", "plateau_patience"):
            _check(getattr(self, name) >= 1, name, "must be >= 1")
        _check(self.lr_drops >= 0, "lr_drops", "must be >= 0")
        _check(0 < self.lr_factor < 1, "lr_factor", "must be in (0, 1)")
        _check(self.min_gain > 0, "min_gain", "must be > 0")
        _check(self.max_server_epochs > 0, "max_server_epochs", "must be > 0")
        _check(self.min_holdout_rows >= 0, "min_holdout_rows", "must be >= 0")
        _check(self.probe_after >= 0, "probe_after", "must be >= 0")
        check_choice(self.augmentation, AUGMENTATIONS, "augmentation")
        _check(self.max_growth > 1.1, "max_growth", "must be > 1.1")
        _check(self.node_rows_cap == 0 or self.node_rows_cap >= 1, "node_rows_cap",
               f"must be 0 (off) or >= 1, got {self.node_rows_cap}")
        _check(0 <= self.screen_margin <= 1, "screen_margin",
               f"must be in [0, 1] (0: off), got {self.screen_margin}")
        _check(0 <= self.copy_margin <= 1, "copy_margin",
               f"must be in [0, 1] (0: never drop), got {self.copy_margin}")
        _check(self.gradient_batch_size >= 1, "gradient_batch_size", "must be >= 1")
        _check(1 <= self.bits <= 8, "bits", f"must be in 1..8, got {self.bits}")
        check_choice(self.ranges, RANGE_MODES, "ranges")

    def _check_robustness(self) -> None:
        """The failure limit, the aggregation rule, the screens and the value bound."""
        _check(self.max_failed_rounds >= 0, "max_failed_rounds", "must be >= 0")
        _check(self.robust_aggregation in ("auto", "mean", "median", "trimmed-mean"),
               "robust_aggregation", "must be auto, mean, median or trimmed-mean, got "
               f"{self.robust_aggregation!r}")
        self.check_robust()
        _check(self.max_abs_value >= 0, "max_abs_value", "must be >= 0 (0 = auto)")

    def _check_compensation(self) -> None:
        """The compensation mode and its refresh and decay knobs."""
        check_choice(self.compensation_mode, COMPENSATION_MODES, "compensation_mode")
        _check(self.refresh_every >= 1, "refresh_every", "must be >= 1")
        _check(0 < self.compensation_decay <= 1, "compensation_decay", "must be in (0, 1]")
        _check(self.compensation_mode == "first-step" or self.compensation != "none",
               "compensation_mode", "needs a compensation codec (compensation != 'none')")

    def _check_client_choices(self) -> None:
        """The lossless coder, the scorer and the selection rule."""
        check_choice(self.entropy_coder, ENTROPY_CODERS, "entropy_coder")
        check_choice(self.scorer, SCORERS, "scorer")
        check_choice(self.selection_rule, SELECTION_RULES, "selection_rule")
        check_choice(self.store_weights, STORE_WEIGHTS, "store_weights")

    def _check_server_training(self) -> None:
        """The server's steps, optimizer and store."""
        _check(self.server_steps >= 1, "server_steps", "must be >= 1")
        _check(self.server_batch_size >= 1, "server_batch_size", "must be >= 1")
        _check(isinstance(self.server_processes, int)
               and not isinstance(self.server_processes, bool) and self.server_processes >= 1,
               "server_processes", f"must be an integer >= 1, got {self.server_processes!r}")
        self.check_optimizer()
        _check(self.max_store_samples >= 0, "max_store_samples", "must be >= 0")
        _check(self.store_eviction in {"fifo", "random"}, "store_eviction",
               f"must be fifo or random, got {self.store_eviction!r}")
        _check(not self.store_dir or not os.path.exists(self.store_dir)
               or os.path.isdir(self.store_dir), "store_dir",
               f"must be a directory, {self.store_dir!r} is a file")
        check_choice(self.identity_binding, IDENTITY_BINDINGS, "identity_binding")

    def _check_codecs(self) -> None:
        """The compensation and gradient-round codecs with their parameters, where used."""
        if self.compensation != "none":
            try:
                make(self.compensation, **self.compensation_kwargs)
            except ValueError as exc:
                raise ValueError(f"compensation: {exc}") from None
        if self.upload_mode != "data":
            try:
                make(self.gradient_codec, **self.gradient_codec_kwargs)
            except ValueError as exc:
                raise ValueError(f"gradient_codec: {exc}") from None

    @property
    def adaptive(self) -> bool:
        """Whether data rounds follow the adaptive upload schedule."""
        return self.upload_schedule == "adaptive" and self.upload_mode == "data"

    def sample_quantizer(self, mode: str, channels: int = 0,
                         dither_seed: int | None = None,
                         sample_shape: tuple[int, ...] | None = None):
        """The ``uniform`` data quantizer of range layout ``mode`` for these knobs.

        ``sample_shape`` (one sample's shape) gives the ``context`` coder its 2-D
        neighbourhoods; it changes nothing for the other coders.
        """
        params: dict[str, Any] = {"bits": self.bits, "stochastic": self.stochastic,
                                  "entropy": self.entropy_coder}
        if self.entropy_coder == "context" and sample_shape is not None:
            params["sample_shape"] = tuple(int(s) for s in sample_shape)
        if mode == "channel" and channels > 1:
            params["per_channel"] = channels
        if mode == "feature":
            params["fixed_range"] = True
        if self.dither and dither_seed is not None:
            params["dither_seed"] = int(dither_seed)
        return make("uniform", **params)

    @property
    def payload_coder(self) -> str:
        """The coder of compensations and gradients.

        ``entropy_coder``, but ``zlib`` for ``context`` (which models sample codes, not
        gradient payloads).
        """
        return "zlib" if self.entropy_coder == "context" else self.entropy_coder

    @property
    def compensation_kwargs(self) -> dict[str, Any]:
        """Parsed ``compensation_params``; ``entropy`` defaults to :attr:`payload_coder`."""
        return {"entropy": self.payload_coder,
                **parse_params(self.compensation_params, "compensation-params")}

    @property
    def gradient_codec_kwargs(self) -> dict[str, Any]:
        """Parsed ``gradient_codec_params``; ``entropy`` defaults to :attr:`payload_coder`."""
        return {"entropy": self.payload_coder,
                **parse_params(self.gradient_codec_params, "gradient-codec-params")}


#: Knobs the clients read from the round config (no other knob travels to them).
CLIENT_KEYS = client_keys(DQConfig)  # the fields marked client_knob


def robust_rule(aggregation: str) -> str:
    """The aggregation rule of ``aggregation`` (``auto`` is the weighted mean)."""
    return "mean" if aggregation == "auto" else aggregation
