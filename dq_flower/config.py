"""Knobs: one checked field descriptor, one reader and one writer, the shared groups.

A frozen dataclass field ``bits: int = knob(2, between(1, 8))`` is a :class:`Knob`: built
from any source (:func:`read`: run configs, keyword arguments, message configs; written
back by :func:`write`), the value is coerced to the field's type, a "not set" spelling
becomes the default and the check runs (``ValueError("bits: ...")``). A method preset is a
config subclass with other defaults (:func:`preset`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Knob", "knob", "inherit", "knob_of", "knobs_of", "at_least", "above",
           "between", "one_of", "coerce_type", "kind_of",
           "read", "write", "build_config", "refuse_unknown", "field_keys",
           "client_keys", "check", "preset", "RobustConfig", "OptimizerConfig",
           "StrategyConfig", "OPTIMIZERS", "INT_RANGE", "MAX_NODES", "MAX_ROWS",
           "MAX_CLASSES", "MAX_STEPS", "MAX_EPOCHS", "MAX_PROCESSES"]

#: ``unset=NO_SPELLING``: the knob has no run-config spelling of "not set".
NO_SPELLING = object()
#: A check returns the error message for a bad value, or ``None``.
Check = Callable[[Any], "str | None"]
#: Every integer knob: a ``ConfigRecord`` carries integers as protobuf ``sint64``.
INT_RANGE = (-(2**63), 2**63 - 1)
#: Upper bounds of the knobs that have one (what one run can use), named in their errors.
MAX_NODES = 1_000_000  # nodes a round waits for: more than one SuperLink serves
MAX_ROWS = 2**31 - 1  # rows of a batch, an ask, a store: int32 row indices
MAX_CLASSES = 1_000_000  # classes: per-class counts are allocated
MAX_STEPS = 1_000_000  # optimizer steps of one round, on a client or on the server
MAX_EPOCHS = 10_000  # passes over the data in one round
MAX_PROCESSES = 256  # server training processes
#: The server optimizers (:func:`dq_flower.server.common.make_optimizer`).
OPTIMIZERS = ("sgd", "adam")


def _key(name: str) -> str:
    return name.replace("_", "-")


def kind_of(annotation: Any) -> Any:
    """``int`` of ``int | None``; the annotation itself otherwise."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        hints = [h for h in typing.get_args(annotation) if h is not type(None)]
        return hints[0] if len(hints) == 1 else None
    return annotation


def coerce_type(kind: Any, value: Any) -> Any:
    """``value`` as a ``kind`` (``bool``, ``int``, ``float``, ``str``; others as given).

    No text for numbers or booleans, booleans ``True``/``False`` or 0/1, integers exact and
    within :data:`INT_RANGE` (a float only where it is a whole number below 2**53), floats
    finite, text a ``str`` (or a path). Else ``ValueError``.
    """
    if kind is bool:
        numpy_bool = getattr(getattr(value, "dtype", None), "kind", "") == "b" and \
            getattr(value, "shape", None) == ()
        if (isinstance(value, (bool, numbers.Integral)) or numpy_bool) and value in (0, 1):
            return bool(value)
        raise ValueError(f"expected true or false (or 0/1), got {value!r}")
    if kind is int:
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        if isinstance(value, bool) or not (isinstance(value, numbers.Integral) or (
                isinstance(value, numbers.Real) and math.isfinite(value)
                and float(value).is_integer() and abs(float(value)) <= 2**53)):
            raise ValueError(f"expected an integer, got {value!r}"
                             + (" (not exactly an integer)" if whole else ""))
        if not INT_RANGE[0] <= (number := int(value)) <= INT_RANGE[1]:  # type: ignore[call-overload]
            raise ValueError(f"must be in [-2**63, 2**63 - 1] (a run config's 64-bit "
                             f"integers), got {number}")
        return number
    if kind is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                if math.isfinite(real := float(value)):
                    return real
            except OverflowError:
                pass
        raise ValueError(f"expected a finite float, got {value!r}")
    if kind is str:
        value = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(value, str):
            raise ValueError(f"expected text, got {value!r}")
    return value


class Knob:
    """A checked dataclass field: its default, check, side, "not set" spelling and meaning.

    ``check(value)`` returns an error message or ``None`` (raised as ``"key: message"``);
    ``coerce`` replaces :func:`coerce_type` of the field's annotation (an error starting
    with the field's name is raised as it is); ``client``: the knob travels to the clients
    in each train message; ``unset``: the run config's spelling of "not set" (TOML has no
    null), which, like ``None``, is the default; ``doc``: one line for the knob tables.
    """

    def __init__(self, default: Any, check: Check | None = None, *,
                 coerce: Callable[[Any], Any] | None = None, client: bool = False,
                 unset: Any = NO_SPELLING, doc: str = "", kind: Any = None) -> None:
        self.default, self.check, self.coerce = default, check, coerce
        self.client, self.unset, self.doc = client, unset, doc
        self.name, self.key = "", ""
        self._owner: type | None = None
        self._kind = kind  # the annotation's type, resolved at the first value

    def but(self, **changes: Any) -> Any:
        """A copy with ``changes`` (another default, or sent to the clients)."""
        options = {"default": self.default, "check": self.check, "coerce": self.coerce,
                   "client": self.client, "unset": self.unset, "doc": self.doc,
                   "kind": self._kind}
        return Knob(**{**options, **changes})

    @property
    def has_unset(self) -> bool:
        """Whether the knob declares a run-config spelling of "not set"."""
        return self.unset is not NO_SPELLING

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.key, self._owner = name, _key(name), owner

    # no __get__: an instance's value is read from its __dict__ with no Python call; the
    # class attribute, the Knob, is what dataclasses take as the default (see __set__)
    def __repr__(self) -> str:
        return repr(self.default)  # how a signature shows the default

    def _coerced(self, value: Any) -> Any:
        if self.coerce is not None:
            return self.coerce(value)
        if self._kind is None:
            try:
                hint = typing.get_type_hints(self._owner)[self.name] if self._owner else Any
            except (NameError, KeyError, TypeError):
                hint = Any
            self._kind = kind_of(hint) or Any
        return coerce_type(self._kind, value)

    def __set__(self, obj: Any, value: Any) -> None:
        if isinstance(value, Knob) or (self.unset is not NO_SPELLING and (
                value is None or (type(value) is not bool and value == self.unset))):
            value = self.default  # a Knob: the dataclass __init__'s default, the field
        if value is None:
            if self.default is not None:
                raise ValueError(f"{self.key}: must be given a value, got None")
        else:
            try:
                value = self._coerced(value)
                message = self.check(value) if self.check is not None else None
            except (TypeError, ValueError) as exc:  # named as the check's messages are
                message = str(exc)
                if message.startswith(self.name):
                    raise ValueError(message) from None
            if message:
                raise ValueError(f"{self.key}: {message}")
        obj.__dict__[self.name] = value


def knob(default: Any, check: Check | None = None, **options: Any) -> Any:
    """A :class:`Knob` field (typed ``Any``, so ``bits: int = knob(2)`` type-checks)."""
    return Knob(default, check, **options)


def knob_of(cls: type, name: str) -> Knob | None:
    """The :class:`Knob` declaring field ``name`` of ``cls`` (``None`` for a plain field)."""
    for klass in cls.__mro__:
        if (found := vars(klass).get(name)) is not None:
            return found if isinstance(found, Knob) else None
    return None


def inherit(cls: type, name: str, **changes: Any) -> Any:
    """Knob ``name`` of ``cls`` with ``changes``, for a subclass (``default=0.05``)."""
    if (found := knob_of(cls, name)) is None:
        raise TypeError(f"{cls.__name__}.{name} is not a Knob")
    return found.but(**changes)


_KNOBS: dict[type, dict[str, Knob]] = {}  # a class's knobs, found once


def knobs_of(cls: type) -> dict[str, Knob]:
    """Field name -> :class:`Knob` of every knob field of dataclass ``cls``, in order."""
    if cls not in _KNOBS:
        _KNOBS[cls] = {f.name: k for f in dataclasses.fields(cls)
                       if (k := knob_of(cls, f.name)) is not None}
    return _KNOBS[cls]


def field_keys(cls: type) -> set[str]:
    """Hyphenated run-config keys of a config dataclass."""
    return {_key(f.name) for f in dataclasses.fields(cls)}


def client_keys(cls: type) -> tuple[str, ...]:
    """Hyphenated keys of the knobs of ``cls`` that travel to the clients."""
    return tuple(k.key for k in knobs_of(cls).values() if k.client)


def _num(x: float) -> str:
    """``x`` as the docs write it: whole numbers in full, others as ``%g``."""
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e15 else f"{x:g}"


def at_least(low: float, note: str = "") -> Check:
    """A check that a value is ``>= low`` (``note``: what the low end means)."""
    extra = f" ({note})" if note else ""
    return lambda v: None if v >= low else f"must be >= {_num(low)}{extra}, got {v}"


def above(low: float) -> Check:
    """A check that a value is ``> low``."""
    return lambda v: None if v > low else f"must be > {_num(low)}, got {v}"


def between(low: float, high: float, *, low_open: bool = False, high_open: bool = False,
            note: str = "") -> Check:
    """A check that ``low <= value <= high`` (``low_open``/``high_open``: strict)."""
    text = (f"must be in {'(' if low_open else '['}{_num(low)}, {_num(high)}"
            f"{')' if high_open else ']'}{f' ({note})' if note else ''}")
    return lambda v: None if ((v > low if low_open else v >= low)
                              and (v < high if high_open else v <= high)) else f"{text}, got {v}"


def one_of(choices: Sequence[Any]) -> Check:
    """A check that a value is one of ``choices``; the message lists them."""
    return lambda v: None if v in choices else f"must be one of {tuple(choices)}, got {v!r}"


def check(cond: bool, field_name: str, message: str) -> None:
    """Raise ``ValueError`` naming the hyphenated key of ``field_name`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{_key(field_name)}: {message}")


# ------------------------------------------------------------ one reader, one writer
#: Keys that other parts of the package read, with what to do instead in a user's own app.
ELSEWHERE = {
    "checkpoint-dir": "it is a knob of dq_flower.simulate and the package's own apps; in "
                      "your own app save strategy.state_dict() and resume with "
                      "load_state_dict() (docs/plugin.md, 'Resume a run')",
    "checkpoint-every": "it is a knob of dq_flower.simulate and the package's own apps; in "
                        "your own app save strategy.state_dict() where you choose",
    "per-channel": "it was removed: ranges = 'channel' is the same",
    "holdout-secret": "the clients read the run config: give it to the strategy in the "
                      "ServerApp (holdout_secret=...) or set DQ_FLOWER_HOLDOUT_SECRET in the "
                      "server's environment",
}


def closest(key: str, known: Iterable[str], what: str = "knob") -> str:
    """``did you mean 'a' or 'b'?``: difflib's closest of ``known`` (``what`` they are)."""
    names = {_key(k): k for k in known}
    close = [repr(names[k]) for k in difflib.get_close_matches(_key(key), sorted(names), n=3)]
    if not close:
        return f"no {what} is spelled like it"
    return f"did you mean {close[0] if len(close) == 1 else ', '.join(close[:-1])}" + (
        f" or {close[-1]}?" if len(close) > 1 else "?")


def refuse_unknown(keys: Iterable[str], known: Iterable[str], where: str = "", *,
                   owner: str = "", also: Iterable[str] = ()) -> None:
    """``ValueError`` for the first of ``keys`` not ``known``: the check of every source.

    ``a.b`` is known where ``a`` is; ``also``: accepted, never suggested. The error names the
    closest knobs and ``where`` the keys came from, or how ``owner``'s app declares its own.
    """
    known = list(known)
    allowed = {_key(k) for k in (*known, *also)}
    unknown = [key for key in keys if not {_key(key), _key(key).partition(".")[0]} & allowed]
    said = [f"{key!r} is not a knob of {owner} ({closest(key, known)}); " + ELSEWHERE.get(
        _key(key), f"if it is your app's own key, pass app_keys=[{key!r}, ...]")
        for key in unknown]
    if owner and said:  # every one at once: one failed run, not one a typo
        raise ValueError(said[0] if len(said) == 1 else " and ".join(said))
    for key in unknown[:1]:  # without an owner: the first, with every knob known
        near, hint = closest(key, known), ELSEWHERE.get(_key(key))
        raise ValueError(f"unknown knob {key!r}{f' {where}' if where else ''} ({near})"
                         f"{f'; {hint}' if hint else ''}; known: {', '.join(sorted(known))}")


_FIELDS: dict[type, dict[str, str]] = {}


def read(cls: type[Any], source: Mapping[str, Any], base: Any = None, *,
         strict: bool = False) -> Any:
    """Config ``cls`` from ``source`` over ``base``: run configs, keywords, message configs.

    Keys hyphenated or underscored, a table of codec parameters also dotted (``codec-params.
    levels = 4``, as Flower flattens a table); other keys ignored unless ``strict``.
    """
    names = _FIELDS.get(cls) or _FIELDS.setdefault(
        cls, {_key(f.name): f.name for f in dataclasses.fields(cls)})
    values = {} if base is None else {name: getattr(base, name) for name in names.values()}
    given: set[str] = set()
    tables: dict[str, dict[str, Any]] = {}
    for raw, value in source.items():
        key = _key(raw)
        table, dot, param = key.partition(".")
        name = names.get(table if dot else key)
        if name is None:
            if strict:
                refuse_unknown([raw], names.values())
            continue
        if not dot:
            values[name] = value
            given.add(name)
        elif isinstance(knobs_of(cls)[name].default, Mapping):
            tables.setdefault(name, {})[param] = value
        else:
            raise ValueError(f"config key {key!r}: {table!r} is not a table of parameters")
    for name, params in tables.items():
        if name in given and values[name]:
            raise ValueError(f"config key {_key(name)!r}: given both as text and as "
                             f"{_key(name)}.<name> keys")
        values[name] = params
    return cls(**values)


def write(cfg: Any, changed_only: bool = False,
          keys: Iterable[str] | None = None) -> dict[str, Any]:
    """Hyphenated key -> value of the knobs of ``cfg`` (``keys``: only these).

    :func:`read`'s inverse: ``None`` as its "not set" spelling, codec parameters as text;
    ``changed_only``: the values unlike the defaults of a preset's base.
    """
    root = knobs_of(getattr(type(cfg), "preset_of", type(cfg)))
    wanted = None if keys is None else set(keys)
    out: dict[str, Any] = {}
    for name, found in knobs_of(type(cfg)).items():
        value = cfg.__dict__[name]
        if (wanted is not None and found.key not in wanted) or (
                changed_only and value == root[name].default):
            continue
        if value is None:
            value = found.unset if found.has_unset else None
        if value is not None:
            out[found.key] = str(value) if isinstance(value, Mapping) else value
    return out


def changed_knobs(cfg: Any) -> str:
    """The knobs of a config that differ from their defaults, or ``"defaults"`` (for logs)."""
    return ", ".join(f"{k}={v!r}" for k, v in write(cfg, True).items()) or "defaults"


def build_config(config: Any, cls: type[Any], knobs: Mapping[str, Any], **named: Any) -> Any:
    """``config`` (a ``cls``, else the defaults) with the keyword arguments applied.

    ``knobs``, then the ``named`` ones that are not ``None``: :func:`read`, strict.
    """
    if config is not None and not isinstance(config, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(config).__name__}")
    knobs = {**knobs, **{name: value for name, value in named.items() if value is not None}}
    return config if config is not None and not knobs else read(cls, knobs, config, strict=True)


def preset(base: type, name: str, doc: str, **defaults: Any) -> type:
    """Method preset ``name``: config ``base`` with other defaults for the knobs ``defaults``.

    Each keeps its check and its "not set" spelling, which means the preset's default.
    """
    hints = typing.get_type_hints(base)
    namespace: dict[str, Any] = {
        field: inherit(base, field, default=value, kind=kind_of(hints[field]) or Any)
        for field, value in defaults.items()}
    namespace.update(__annotations__={field: hints[field] for field in defaults},
                     __module__=base.__module__, __doc__=doc,
                     preset_of=getattr(base, "preset_of", base))
    return dataclass(frozen=True)(type(name, (base,), namespace))


# ------------------------------------------------------------------ shared groups
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
    lr: float = knob(0.1, above(0), doc="server learning rate")
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
