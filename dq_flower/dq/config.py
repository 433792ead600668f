"""Typed knobs of the data-quantization method (``DQConfig``).

Each knob is a :class:`~dq_flower.config.Knob` field of a frozen dataclass, checked as it is
set (``ValueError`` naming the hyphenated key). The same fields are keyword arguments of
:class:`dq_flower.DQStrategy` (``server_steps=10``) and run-config keys of the package's
apps (``server-steps``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from dq_flower.codecs import CONTEXT, make, payload_coder
from dq_flower.codecs.params import CodecParams
from dq_flower.codecs.uniform import SAMPLE_CODERS
from dq_flower.config import (
    MAX_CLASSES,
    MAX_EPOCHS,
    MAX_PROCESSES,
    MAX_ROWS,
    MAX_STEPS,
    OPTIMIZERS,
    OptimizerConfig,
    RobustConfig,
    StrategyConfig,
    above,
    at_least,
    between,
    check,
    client_keys,
    inherit,
    knob,
    one_of,
)
from dq_flower.wire.dq_batch import channels_last

__all__ = ["DQConfig", "DQStrategyConfig", "SCORERS", "SELECTION_RULES", "ENTROPY_CODERS",
           "UPLOAD_MODES", "RANGE_MODES", "CLIENT_KEYS", "robust_rule", "UPLOAD_SCHEDULES",
           "COMPENSATION_MODES", "AUGMENTATIONS", "auto_bits"]


SCORERS = ("auto", "uniform", "loss", "gradnorm", "entropy", "margin")
SELECTION_RULES = ("auto", "topk", "sample", "threshold")
#: Lossless coders of the samples (``context``: the codes' own context model).
ENTROPY_CODERS = SAMPLE_CODERS
UPLOAD_MODES = ("data", "gradient", "auto")
#: ``adaptive``: train to a plateau on the store, ask for more only while it pays
#: (:mod:`dq_flower.dq.server.schedule`); ``fixed``: ``budget`` per client and ``server-steps``
#: steps every round; ``all``: every node uploads all its rows once, the server trains to a
#: plateau (the ``upload-all`` baseline).
UPLOAD_SCHEDULES = ("adaptive", "fixed", "all")
COMPENSATION_MODES = ("first-step", "store", "refresh")
#: Quantizer ranges: ``sample`` (one per sample), ``channel`` (one per image channel),
#: ``feature`` (one per coordinate, the client's own, sent once), ``auto`` (``feature``
#: for flat samples, else ``sample``).
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


#: ``bits = 0`` (auto): flat samples of fewer than this many coordinates get
#: :data:`TABLE_BITS` bits per coordinate, every other sample :data:`DEFAULT_BITS`.
TABLE_MAX_DIM = 64
TABLE_BITS = 4
DEFAULT_BITS = 2


def auto_bits(dim: int | None, categories: int = 0) -> int:
    """The bits of ``bits = 0`` for samples of ``dim`` flat coordinates (``None``: not flat).

    ``categories``: where the model reads its samples with embeddings, the rows of the
    largest: a table's label-encoded columns get one code per category, so as many bits
    as that takes, from :data:`TABLE_BITS` up to 8 (ids are sent exactly at any).
    """
    return (max(TABLE_BITS, min(8, (int(categories) - 1).bit_length())) if categories
            else TABLE_BITS if dim is not None and dim < TABLE_MAX_DIM else DEFAULT_BITS)


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

    Every field is a :class:`~dq_flower.config.Knob`: checked as the config is built
    (``ValueError`` naming the hyphenated key), read from a run config by its hyphenated key,
    sent to the clients where marked ``client``; its meaning is the ``doc`` that the knob
    table of ``docs/method.md`` (``simulations/inline_docs.py``) is generated from.
    The groups :class:`~dq_flower.config.RobustConfig` (robust aggregation of compensations
    and gradient-round gradients) and :class:`~dq_flower.config.OptimizerConfig` (the
    server's optimizer; here ``lr`` 0.05, ``weight_decay`` 5e-4) are inherited.
    """

    budget: int = knob(64, between(1, MAX_ROWS), client=True, doc=(
        "samples each client uploads per round (at most); with the adaptive schedule, the "
        "least first-round ask per client (see [the first ask]"
        "(#uploads-paced-by-need-the-adaptive-schedule))"))
    upload_schedule: str = knob("adaptive", one_of(UPLOAD_SCHEDULES), doc=(
        "`adaptive` (train to a plateau, ask while it pays), `fixed`, or `all` (every node "
        "uploads all its rows once, the server trains to a plateau: the `upload-all` "
        "baseline; see [the adaptive schedule](#uploads-paced-by-need-the-adaptive-schedule))"))
    holdout_fraction: float = knob(0.1, between(0, 1, high_open=True), doc=(
        "share of each node's stored rows, per class, held out for validation (adaptive)"))
    max_server_steps: int = knob(2000, between(1, MAX_STEPS), doc=(
        "cap on the steps of one round's training phase (adaptive), raised to "
        "`max-server-epochs` passes where that is more"))
    max_server_epochs: float = knob(30.0, between(0, MAX_EPOCHS, low_open=True), doc=(
        "passes over the store's training rows one phase may take (the cap follows it)"))
    server_autocast: str = knob("auto", one_of(("auto", "none", "bfloat16")), doc=(
        "`bfloat16`: the store steps' forward under `torch.autocast` in bfloat16 (weights, "
        "gradients, optimizer in float32); `none`; `auto`: bfloat16 on a CPU with native "
        "bfloat16 (AVX-512 BF16, AMX) for models of 1 MFLOP a sample forward or more"))
    plateau_eval_every: int = knob(50, between(1, MAX_STEPS), doc=(
        "steps between held-out scores, at least (a large store: a pass / plateau-patience)"))
    plateau_patience: int = knob(4, at_least(1), doc=(
        "held-out scores without progress (row by row against the last progress: more "
        "rows right, or a loss 1% lower, beyond one standard error) before the learning "
        "rate drops; half as many, rounded up, after a drop"))
    lr_drops: int = knob(1, at_least(0), doc="learning-rate drops before a phase ends")
    lr_factor: float = knob(0.1, between(0, 1, low_open=True, high_open=True),
                            doc="factor of each learning-rate drop")
    min_gain: float = knob(0.005, above(0), doc=(
        "held-out gain per doubling of the store (accuracy; relative loss for float "
        "targets) below which, at 95% over the pooled comparisons, the curve is flat"))
    min_holdout_rows: int = knob(10, between(0, MAX_ROWS), doc=(
        "held-out rows per class the first ask provides for, and a flat verdict needs"))
    probe_after: int = knob(2, at_least(0), doc=(
        "rounds without uploads before a probe, once flat (a tenth of the store) or every "
        "node has sent all its rows (one node asked for more; 0: never, the run ends)"))
    max_growth: float = knob(2.0, above(1.1), doc=(
        "largest growth of the store from one upload round to the next"))
    node_rows_cap: float = knob(4.0, lambda v: None if v == 0 or v >= 1 else
                                f"must be 0 (off) or >= 1, got {v}", doc=(
        "the adaptive schedule asks one client for at most this many times the larger of "
        "the median client's `num-examples` and the rows the client has sent, in all (0: "
        "off): a large site's asks grow with what it sends; the log says when it binds"))
    screen_margin: float = knob(0.4, between(0, 1, note="0: off"), doc=(
        "a client whose held-out error exceeds the median client's by more than this (and "
        "4 robust deviations) is left out of training and asks, reversibly (0: off; see "
        "[Reliability](reliability.md))"))
    copy_margin: float = knob(0.1, between(0, 1, note="0: never drop"), doc=(
        "a client whose share of copied rows exceeds the median client's by more than this "
        "(and 4 robust deviations) has its copies dropped (0: counted only)"))
    augmentation: str = knob("auto", one_of(AUGMENTATIONS), doc=(
        "store minibatches: `auto` (shifts images at least 14 px wide, sides within 2x, "
        "targets not floats), `none`, `shift`, `shift-flip`"))
    store_weights: str = knob("node", one_of(STORE_WEIGHTS), doc=(
        "weights of the store's rows in the training loss: `node` (each node's rows alike, "
        "at the node's mean) or `importance` (each row by 1/its inclusion probability); a "
        "compensation's control variate uses `importance`"))
    bits: int = knob(0, lambda v: None if 0 <= v <= 8 else f"must be in 0..8, got {v}",
                     client=True, unset="auto", doc=(
        "bits per data coordinate, 1 to 8; 0 (auto): 4 for flat samples of under 64 features "
        "(a table), where the model reads samples with embeddings 4 or as many as its "
        "largest's rows take (up to 8), else 2; doubled where raw rows read clearly worse "
        "than their codes ([the bits of a table](#the-bits-of-a-table))"))
    stochastic: bool = knob(False, client=True, doc=(
        "stochastic (unbiased) rounding when true; nearest by default"))
    ranges: str = knob("auto", one_of(RANGE_MODES), client=True, doc=(
        "quantizer ranges: `sample`, `channel`, `feature` (sent once per client), `auto`"))
    dither: bool = knob(False, client=True, doc="subtractive dither from the round seed")
    entropy_coder: str = knob("context", one_of(ENTROPY_CODERS), client=True, doc=(
        "lossless stage of every upload: the packed sample codes (`context`: a "
        "context-model coder of the codes, each message zlib-coded where that is smaller), "
        "the compensation and the gradient rounds' gradients, per message only where it "
        "shrinks it: `none`, `zlib`, `lzma`, `zstd` (`pip install zstandard`), "
        "`context`; an `entropy=` in `compensation-params` / `gradient-codec-params` "
        "overrides it for that payload"))
    scorer: str = knob("auto", one_of(SCORERS), client=True, doc=(
        "`auto` (`entropy` on the nodes that hold the model, `uniform` on the others), "
        "`uniform`, `loss`, `gradnorm`, `entropy` (predictive entropy), `margin` (1 minus "
        "the top-two gap)"))
    selection_rule: str = knob("auto", one_of(SELECTION_RULES), client=True, doc=(
        "`auto` (`sample` with model scores, `topk` with uniform ones), `topk`, `sample`, "
        "`threshold`"))
    score_threshold: float = knob(0.0, client=True, doc=(
        "score at or above which `threshold` selects"))
    resend: bool = knob(False, client=True, doc=(
        "allow already uploaded samples to be chosen again"))
    model_precision: str = knob("auto", one_of(MODEL_PRECISIONS), doc=(
        "the model sent to the nodes that use it: `auto` (`int8` to score with, `fp32` to "
        "compute gradients with), `fp32`, `fp16`, `int8`, `int4` (per 256 weights: a "
        "float32 range and nearest rounding)"))
    compensation: str = knob("none", client=True, doc=(
        "gradient codec of the compensation (`identity`, `fp16`, `qsgd`, ...)"))
    compensation_params: CodecParams = knob(CodecParams(), client=True, coerce=CodecParams, doc=(
        "its parameters: `compensation-params.levels = 4` (or the text "
        "`\"levels=4,bucket=512\"`; in Python a dict)"))
    compensation_mode: str = knob("first-step", one_of(COMPENSATION_MODES), client=True,
                                  doc=("`first-step`, `store` (control variate on every "
                                       "store step) or `refresh`"))
    refresh_every: int = knob(5, at_least(1), doc=(
        "rounds between refreshed residuals (`compensation-mode = \"refresh\"`)"))
    compensation_decay: float = knob(1.0, between(0, 1, low_open=True), doc=(
        "per-round decay of the control variate's old contributions"))
    server_steps: int = knob(20, between(1, MAX_STEPS), doc=(
        "optimizer steps per round on the server (fixed schedule)"))
    server_batch_size: int = knob(64, between(1, MAX_ROWS), doc="minibatch size of the store steps")
    server_processes: int = knob(1, between(1, MAX_PROCESSES), doc=(
        "processes the server trains in: 1 (its own) or N worker processes joined by "
        "`torch.distributed`, each computing the gradient of 1/N of every minibatch (see "
        "[Server training on several processes](scaling-ddp.md))"))
    server_threads: int = knob(0, between(0, 1024), unset="auto", doc=(
        "PyTorch threads of the server's training (restored after each round's): 0 (auto) "
        "one where a step is under 100 MFLOP (threads gain it little and, where another "
        "process takes a core, cost it many times over), PyTorch's own count otherwise; N: "
        "N threads (see [server threads](measuring.md#server-threads))"))
    optimizer: str = inherit(OptimizerConfig, "optimizer", default="auto",
                             check=one_of(("auto", *OPTIMIZERS)), doc=(
        "`auto` (the first training phase probes `sgd` at `lr` and `adam` at 1e-3, or at "
        "`lr` where given, and keeps `sgd` unless `adam` is better on the held-out rows; "
        "see [the server's optimizer](#the-servers-optimizer-and-step-size)), `sgd` "
        "(momentum, weight decay) or `adam`; a `train_config` `optimizer` is honoured"))
    lr: float = inherit(OptimizerConfig, "lr", default=0.05, doc=(
        "server learning rate (a `train_config` `lr` given to `strategy.start` is honoured "
        "where this knob is at its default)"))
    weight_decay: float = inherit(OptimizerConfig, "weight_decay", default=5e-4)
    max_store_samples: int = knob(0, between(0, MAX_ROWS), doc=(
        "bound on the store (0 = unbounded), oldest evicted first"))
    store_eviction: str = knob("fifo", one_of(("fifo", "random")), doc=(
        "what goes when the store is full: `fifo` or `random`"))
    store_dir: str = knob("", lambda v: None if not v or not os.path.exists(v)
                          or os.path.isdir(v) else f"must be a directory, {v!r} is a file",
                          doc=("directory of the store's packed codes, kept in a "
                               "memory-mapped file there for a store larger than memory; "
                               "checkpoints refer to the file (see [A store larger than "
                               "memory](scaling-store.md)); `\"\"`: in memory"))
    identity_binding: str = knob("connected", one_of(IDENTITY_BINDINGS), doc=(
        "how long a client identity stays with its node id: `connected` (while that node "
        "is connected) or `node` (for good: with SuperNode authentication, bound to the "
        "node's registered key; see [Spoofing, squatting and hopping](reliability.md"
        "#what-the-server-holds-and-how-a-restarted-client-continues))"))
    upload_mode: str = knob("data", one_of(UPLOAD_MODES), doc=(
        "`data`, `gradient` or `auto` (see [Upload modes](#upload-modes-data-gradient-auto))"))
    gradient_codec: str = knob("qsgd", client=True, doc=(
        "codec of gradient rounds (any registry codec; biased ones get error feedback)"))
    gradient_codec_params: CodecParams = knob(
        CodecParams({"levels": 4, "bucket": 512}), client=True, coerce=CodecParams,
        doc="its parameters, as `compensation-params`")
    gradient_batch_size: int = knob(32, between(1, MAX_ROWS), client=True, doc=(
        "minibatch of a client's gradient in gradient rounds"))
    max_failed_rounds: int = knob(3, at_least(0), doc=(
        "stop when every sampled client failed this many rounds in a row (0: never)"))
    robust_aggregation: str = knob("auto", one_of(("auto", "mean", "median", "trimmed-mean")),
                                   doc=("compensations and gradient rounds: `mean`, "
                                        "`median`, `trimmed-mean` (`auto`: `mean`)"))
    max_abs_value: float = knob(0.0, at_least(0, "0 = auto"), unset="auto", doc=(
        "bound on decoded data values (0, auto: 10x the median first-round upload's largest)"))

    def __post_init__(self) -> None:
        """The checks that involve two knobs (each knob checked itself as it is set)."""
        check(self.upload_schedule == "fixed" or self.upload_mode != "data"
              or self.holdout_fraction > 0, "holdout_fraction",
              "must be > 0 under the adaptive upload schedule")
        check(self.compensation_mode == "first-step" or self.compensation != "none",
              "compensation_mode", "needs a compensation codec (compensation != 'none')")
        for key, used in (("compensation", self.compensation != "none"),
                          ("gradient_codec", self.upload_mode != "data")):
            try:
                if used:
                    make(getattr(self, key), **getattr(self, f"{key}_kwargs"))
            except ValueError as exc:
                raise ValueError(f"{key}: {exc}") from None

    @property
    def adaptive(self) -> bool:
        """Whether data rounds train to a plateau (the ``adaptive`` and ``all`` schedules)."""
        return self.upload_schedule != "fixed" and self.upload_mode == "data"

    @property
    def uploads_all(self) -> bool:
        """Whether every node is asked for all its rows (the ``all`` schedule)."""
        return self.adaptive and self.upload_schedule == "all"

    def sample_quantizer(self, mode: str, channels: int = 0,
                         dither_seed: int | None = None,
                         sample_shape: tuple[int, ...] | None = None):
        """The ``uniform`` data quantizer of range layout ``mode`` for these knobs.

        ``sample_shape`` (one sample's shape) gives the ``context`` coder its 2-D
        neighbourhoods and tells windows ``(L, C)``, coded by channel as ``(C, L)``.
        """
        bits = self.bits or auto_bits(
            int(sample_shape[0]) if sample_shape is not None and len(sample_shape) == 1
            else None)  # the strategy resolves 0 before sending; this is the fallback
        params: dict[str, Any] = {"bits": bits, "stochastic": self.stochastic,
                                  "entropy": self.entropy_coder, "fixed_range": mode == "feature"}
        if self.entropy_coder == CONTEXT and sample_shape is not None:
            params["sample_shape"] = tuple(int(s) for s in sample_shape)
        if mode == "channel" and channels > 1:
            params.update(per_channel=channels, channels_last=channels_last(sample_shape or ()))
        if self.dither and dither_seed is not None:
            params["dither_seed"] = int(dither_seed)
        return make("uniform", **params)

    @property
    def payload_coder(self) -> str:
        """The coder of compensations and gradients (``zlib`` under ``context``).

        See :func:`dq_flower.codecs.payload_coder`: DQ's ``context`` models sample codes only.
        """
        return payload_coder(self.entropy_coder)

    @property
    def compensation_kwargs(self) -> dict[str, Any]:
        """``compensation_params``, ``entropy`` defaulting to :attr:`payload_coder`."""
        return {"entropy": self.payload_coder, **self.compensation_params}

    @property
    def gradient_codec_kwargs(self) -> dict[str, Any]:
        """``gradient_codec_params``, ``entropy`` defaulting to :attr:`payload_coder`."""
        return {"entropy": self.payload_coder, **self.gradient_codec_params}


@dataclass(frozen=True)
class DQStrategyConfig(StrategyConfig):
    """Keyword arguments of ``DQStrategy`` beside its config: a strategy's, and the classes."""

    num_classes: int | None = knob(None, between(1, MAX_CLASSES), doc=(
        "classes of integer targets (not set: the width of the model's output)"))


#: Knobs the clients read from the round config (no other knob travels to them).
CLIENT_KEYS = client_keys(DQConfig)  # the knobs marked client


def robust_rule(aggregation: str) -> str:
    """The aggregation rule of ``aggregation`` (``auto`` is the weighted mean)."""
    return "mean" if aggregation == "auto" else aggregation
