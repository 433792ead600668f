"""Typed run configuration.

Every knob is a field of a frozen dataclass that validates itself and raises ``ValueError``
naming the field. The same fields are reachable as hyphenated run-config keys
(``server-steps``) in ``pyproject.toml`` / ``flwr run --run-config`` and as keyword
arguments (``server_steps``) of :func:`dq_flower.simulate`.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from flwr.app import ConfigRecord

__all__ = [
    "TaskConfig",
    "DQConfig",
    "from_mapping",
    "to_config_record",
    "field_keys",
    "parse_params",
]

T = TypeVar("T")


def _key(name: str) -> str:
    return name.replace("_", "-")


def field_keys(cls: type) -> set[str]:
    """Hyphenated run-config keys of a config dataclass."""
    return {_key(f.name) for f in dataclasses.fields(cls)}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    hints = typing.get_args(annotation) if isinstance(annotation, types.UnionType) else ()
    target = next((h for h in hints if h is not type(None)), annotation)
    if value is None and type(None) in hints:
        return None
    try:
        if target is bool:
            if isinstance(value, str):
                low = value.strip().lower()
                if low not in {"true", "false", "1", "0", "yes", "no"}:
                    raise ValueError
                return low in {"true", "1", "yes"}
            if isinstance(value, (bool, int)) and value in (0, 1, True, False):
                return bool(value)
            raise ValueError
        if target is int:
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError
            return int(value)
        if target is float:
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if target is str:
            if not isinstance(value, str):
                raise ValueError
            return value
    except (TypeError, ValueError):
        pass
    else:
        return value
    raise ValueError(f"config key {key!r}: expected {getattr(target, '__name__', target)}, "
                     f"got {value!r}")


def from_mapping(cls: type[T], mapping: Mapping[str, Any], strict: bool = False) -> T:
    """Build config ``cls`` from a mapping with hyphenated (or underscored) keys.

    Keys that ``cls`` does not know are ignored unless ``strict``, since one run config
    carries the knobs of every method. Values are coerced to the field's type; a value that
    cannot be coerced raises ``ValueError`` naming its key.
    """
    hints = typing.get_type_hints(cls)
    known = {_key(f.name): f.name for f in dataclasses.fields(cls)}
    kwargs = {}
    for raw_key, value in mapping.items():
        key = _key(raw_key)
        if key not in known:
            if strict:
                raise ValueError(f"unknown config key {key!r}")
            continue
        name = known[key]
        kwargs[name] = _coerce(value, hints[name], key)
    return cls(**kwargs)


def to_config_record(cfg: Any, changed_only: bool = True) -> ConfigRecord:
    """Hyphenated ``ConfigRecord`` of a config dataclass.

    With ``changed_only`` (the default), fields at their default value are left out: the
    receiver rebuilds them from the same defaults, and each message stays small. ``None``
    fields are always left out.
    """
    defaults = type(cfg)()
    return ConfigRecord({
        _key(k): v for k, v in dataclasses.asdict(cfg).items()
        if v is not None and not (changed_only and getattr(defaults, k) == v)
    })


def parse_params(text: str, key: str = "params") -> dict[str, Any]:
    """Parse ``"levels=4,bucket=512"`` into ``{"levels": 4, "bucket": 512}``.

    Values are read as int, then float, then bool (``true``/``false``), else kept as str.
    """
    out: dict[str, Any] = {}
    if not text.strip():
        return out
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name:
            raise ValueError(f"config key {key!r}: expected 'name=value,...', got {text!r}")
        value: Any
        for conv in (int, float):
            try:
                value = conv(raw)
                break
            except ValueError:
                continue
        else:
            value = {"true": True, "false": False}.get(raw.lower(), raw)
        out[name.replace("-", "_")] = value
    return out


def _check(cond: bool, field_name: str, message: str) -> None:
    if not cond:
        raise ValueError(f"{_key(field_name)}: {message}")


@dataclass(frozen=True)
class TaskConfig:
    """What is trained on what: data set, model, partition, clients, rounds, seed.

    Attributes
    ----------
    dataset : str
        ``digits`` (default, ships with scikit-learn), ``fmnist``, ``cifar10`` or
        ``npz:<path>``.
    model : str
        ``logreg``, ``mlp``, ``cnn``, ``wide-cnn``, ``resnet20`` or ``resnet18``.
    num_partitions : int
        Number of client partitions (the number of SuperNodes in simulation).
    partition : str
        ``iid``, ``dirichlet`` or ``pathological``.
    dirichlet_alpha : float
        Concentration of the Dirichlet partition (smaller is more skewed).
    num_server_rounds : int
        Server rounds.
    fraction_train : float
        Fraction of available clients sampled each round.
    min_available : int
        Fewest valid replies a round needs to update the model.
    seed : int
        Root of every random choice.
    data_dir : str
        Where the data files live ("" means the data set's default).
    round_timeout : float
        Seconds to wait for replies each round.
    checkpoint_dir : str
        Folder for the server's checkpoint ("" = none); a run finding one there resumes.
    checkpoint_every : int
        Save the server's state every this many rounds.
    device : str
        Where models train: ``auto`` (a CUDA GPU when one is visible, else the CPU),
        ``cpu`` or ``cuda``.
    """

    dataset: str = "digits"
    model: str = "mlp"
    num_partitions: int = 4
    partition: str = "iid"
    dirichlet_alpha: float = 0.5
    num_server_rounds: int = 5
    fraction_train: float = 1.0
    min_available: int = 1
    seed: int = 0
    data_dir: str = ""
    round_timeout: float = 600.0
    checkpoint_dir: str = ""
    checkpoint_every: int = 1
    device: str = "auto"

    def __post_init__(self) -> None:
        _check(self.num_partitions >= 1, "num_partitions", "must be >= 1")
        _check(self.partition in {"iid", "dirichlet", "pathological"}, "partition",
               f"must be iid, dirichlet or pathological, got {self.partition!r}")
        _check(self.dirichlet_alpha > 0, "dirichlet_alpha", "must be > 0")
        _check(self.num_server_rounds >= 1, "num_server_rounds", "must be >= 1")
        _check(0 < self.fraction_train <= 1, "fraction_train", "must be in (0, 1]")
        _check(self.min_available >= 1, "min_available", "must be >= 1")
        _check(self.round_timeout > 0, "round_timeout", "must be > 0")
        _check(self.checkpoint_every >= 1, "checkpoint_every", "must be >= 1")
        _check(self.device in {"auto", "cpu", "cuda"}, "device",
               f"must be auto, cpu or cuda, got {self.device!r}")


SCORERS = ("uniform", "loss", "gradnorm")
SELECTION_RULES = ("topk", "sample", "threshold")
ENTROPY_CODERS = ("none", "zlib", "lzma", "zstd")
UPLOAD_MODES = ("data", "gradient", "auto")


@dataclass(frozen=True)
class DQConfig:
    """Knobs of the data-quantization method.

    Attributes
    ----------
    budget : int
        Samples each client uploads per round (at most).
    bits : int
        Bits per data coordinate, 1 to 8.
    stochastic : bool
        Stochastic (unbiased) rounding; nearest rounding when false.
    per_channel : bool
        One affine range per channel instead of per sample.
    dither : bool
        Subtractive dither drawn from the round seed.
    entropy_coder : str
        Lossless coding of the packed codes: ``none``, ``zlib``, ``lzma`` or ``zstd``.
    scorer : str
        Importance score: ``uniform``, ``loss`` or ``gradnorm``.
    selection_rule : str
        ``topk``, ``sample`` (probability proportional to score, weights 1/(n p)) or
        ``threshold``.
    score_threshold : float
        Score above which ``threshold`` selects (still capped by the budget).
    resend : bool
        Allow samples already uploaded to be chosen again.
    compensation : str
        Gradient codec for the compensation, or ``none``.
    compensation_params : str
        Its parameters, ``"levels=4,bucket=512"``.
    server_steps : int
        Optimizer steps the server takes per round.
    server_batch_size : int
        Minibatch size of the later steps, drawn from the store.
    optimizer : str
        ``sgd`` (momentum, weight decay) or ``adam``.
    lr, momentum, weight_decay : float
        Server optimizer settings.
    max_store_samples : int
        Bound on the store (0 = unbounded).
    store_eviction : str
        What goes when the store is full: ``fifo`` (oldest first) or ``random``.
    upload_mode : str
        ``data`` (every round uploads quantized samples), ``gradient`` (every round uploads
        a minibatch gradient coded by ``gradient_codec``) or ``auto`` (per round, whichever
        the server estimates to cost fewer uplink bits).
    gradient_codec, gradient_codec_params : str
        Codec (and its parameters) of gradient rounds; error feedback for biased codecs.
    gradient_batch_size : int
        Minibatch size of a client's gradient in gradient rounds.
    """

    budget: int = 64
    bits: int = 2
    stochastic: bool = True
    per_channel: bool = False
    dither: bool = False
    entropy_coder: str = "zlib"
    scorer: str = "uniform"
    selection_rule: str = "topk"
    score_threshold: float = 0.0
    resend: bool = False
    compensation: str = "none"
    compensation_params: str = ""
    server_steps: int = 20
    server_batch_size: int = 64
    optimizer: str = "sgd"
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    max_store_samples: int = 0
    store_eviction: str = "fifo"
    upload_mode: str = "data"
    gradient_codec: str = "qsgd"
    gradient_codec_params: str = "levels=4,bucket=512"
    gradient_batch_size: int = 32

    def __post_init__(self) -> None:
        _check(self.budget >= 1, "budget", f"must be >= 1, got {self.budget}")
        _check(self.upload_mode in UPLOAD_MODES, "upload_mode",
               f"must be one of {UPLOAD_MODES}, got {self.upload_mode!r}")
        _check(self.gradient_batch_size >= 1, "gradient_batch_size", "must be >= 1")
        _check(1 <= self.bits <= 8, "bits", f"must be in 1..8, got {self.bits}")
        _check(self.entropy_coder in ENTROPY_CODERS, "entropy_coder",
               f"must be one of {ENTROPY_CODERS}, got {self.entropy_coder!r}")
        _check(self.scorer in SCORERS, "scorer",
               f"must be one of {SCORERS}, got {self.scorer!r}")
        _check(self.selection_rule in SELECTION_RULES, "selection_rule",
               f"must be one of {SELECTION_RULES}, got {self.selection_rule!r}")
        _check(self.server_steps >= 1, "server_steps", "must be >= 1")
        _check(self.server_batch_size >= 1, "server_batch_size", "must be >= 1")
        _check(self.optimizer in {"sgd", "adam"}, "optimizer",
               f"must be sgd or adam, got {self.optimizer!r}")
        _check(self.lr > 0, "lr", "must be > 0")
        _check(0 <= self.momentum < 1, "momentum", "must be in [0, 1)")
        _check(self.weight_decay >= 0, "weight_decay", "must be >= 0")
        _check(self.max_store_samples >= 0, "max_store_samples", "must be >= 0")
        _check(self.store_eviction in {"fifo", "random"}, "store_eviction",
               f"must be fifo or random, got {self.store_eviction!r}")
        from .codecs import make

        if self.compensation != "none":
            try:
                make(self.compensation, **parse_params(self.compensation_params))
            except ValueError as exc:
                raise ValueError(f"compensation: {exc}") from None
        if self.upload_mode != "data":
            try:
                make(self.gradient_codec, **self.gradient_codec_kwargs)
            except ValueError as exc:
                raise ValueError(f"gradient_codec: {exc}") from None

    @property
    def compensation_kwargs(self) -> dict[str, Any]:
        """Parsed ``compensation_params``."""
        return parse_params(self.compensation_params, "compensation-params")

    @property
    def gradient_codec_kwargs(self) -> dict[str, Any]:
        """Parsed ``gradient_codec_params``."""
        return parse_params(self.gradient_codec_params, "gradient-codec-params")
