"""Typed configs <-> run configs: hyphenated keys, coercion, unknown keys, codec params.

Every knob is a :class:`~dq_flower.knob.Knob` field of a frozen dataclass; the same
fields are hyphenated run-config keys (``server-steps``) and keyword arguments
(``server_steps``) of the strategies and of :func:`dq_flower.simulate`.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypeVar

from flwr.app import ConfigRecord

from dq_flower.knob import coerce_type, kind_of, knob_of, knobs_of

if typing.TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["build_config", "unknown_knob", "check", "client_keys", "given_knobs", "CodecParams",
           "from_mapping", "to_config_record", "field_keys", "parse_params", "run_config_values",
           "strategy_kwargs", "unset_spellings", "known_key", "closest"]

T = TypeVar("T", bound="DataclassInstance")


def _key(name: str) -> str:
    return name.replace("_", "-")


def field_keys(cls: type) -> set[str]:
    """Hyphenated run-config keys of a config dataclass."""
    return {_key(f.name) for f in dataclasses.fields(cls)}


def client_keys(cls: type) -> tuple[str, ...]:
    """Hyphenated keys of the knobs of ``cls`` that travel to the clients."""
    return tuple(k.key for k in knobs_of(cls).values() if k.client)


def unset_spellings(cls: type) -> dict[str, Any]:
    """Hyphenated key -> run-config spelling of "not set", for the knobs declaring one."""
    return {k.key: k.unset for k in knobs_of(cls).values() if k.has_unset}


def _coerce(value: Any, annotation: Any, key: str) -> Any:
    """``value`` for a plain (not :class:`~dq_flower.knob.Knob`) field; a knob checks its own."""
    if value is None:
        return None
    try:
        return coerce_type(kind_of(annotation), value)
    except ValueError as exc:
        raise ValueError(f"{key}: {exc}") from None


def from_mapping(cls: type[T], mapping: Mapping[str, Any], strict: bool = False) -> T:
    """Build config ``cls`` from a mapping with hyphenated (or underscored) keys.

    Unknown keys are ignored unless ``strict`` (one run config carries every method's
    knobs); values are coerced to the field's type as keyword arguments are
    (:func:`~dq_flower.knob.coerce_type`), else ``ValueError`` naming the key.
    A table of codec parameters may come as dotted keys (``codec-params.levels = 4``, as
    Flower flattens ``[tool.flwr.app.config.codec-params]``).
    """
    hints = typing.get_type_hints(cls)
    known = {_key(f.name): f.name for f in dataclasses.fields(cls)}
    plain = {name for name in known.values() if knob_of(cls, name) is None}
    kwargs: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    for raw_key, value in mapping.items():
        key = _key(raw_key)
        table, dot, param = key.partition(".")
        if key not in known and table not in known:
            if strict:
                raise ValueError(f"unknown config key {key!r}")
            continue
        if dot:
            if hints[known[table]] is not CodecParams:
                raise ValueError(f"config key {key!r}: {table!r} is not a table of parameters")
            tables.setdefault(known[table], {})[param] = value
        else:
            name = known[key]  # a knob coerces and checks its value as it is set
            kwargs[name] = _coerce(value, hints[name], key) if name in plain else value
    for name, params in tables.items():
        if kwargs.get(name):
            raise ValueError(f"config key {_key(name)!r}: given both as text and as "
                             f"{_key(name)}.<name> keys")
        kwargs[name] = params
    return cls(**kwargs)  # a "not set" spelling is the default (the Knob's)


def to_config_record(cfg: Any, changed_only: bool = True) -> ConfigRecord:
    """Hyphenated ``ConfigRecord`` of a config dataclass (``changed_only``: non-defaults).

    A ``None`` field is its "not set" spelling where it declares one, else left out.
    """
    values = run_config_values(cfg)
    if changed_only:
        defaults = run_config_values(type(cfg)())
        values = {k: v for k, v in values.items() if defaults[k] != v}
    return ConfigRecord({k: v for k, v in values.items() if v is not None})


def run_config_values(cfg: Any) -> dict[str, Any]:
    """Hyphenated key -> value of every field of ``cfg`` (``None``: its "not set" spelling)."""
    unset = unset_spellings(type(cfg))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cfg):
        key, value = _key(f.name), getattr(cfg, f.name)
        if value is None:
            value = unset.get(key)
        elif isinstance(value, CodecParams):  # its text spelling: a ConfigRecord holds scalars
            value = str(value)
        values[key] = value
    return values


def parse_params(text: str) -> dict[str, Any]:
    """Parse ``"levels=4,bucket=512"`` into ``{"levels": 4, "bucket": 512}``."""
    out: dict[str, Any] = {}
    if not text.strip():
        return out
    for part in text.split(","):
        name, sep, raw = part.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or not name:
            raise ValueError(f"expected 'name=value,...', got {text!r}")
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


class CodecParams(Mapping[str, Any]):
    """A codec's parameters: an immutable mapping of names to numbers, booleans or text.

    Built from a mapping (``{"levels": 4, "bucket": 512}``), from a run config's table of
    them (``codec-params.levels = 4``, gathered by :func:`from_mapping`), from its text
    spelling ``"levels=4,bucket=512"``, or from nothing (``None``, ``""``). ``str()`` is the
    text spelling, which a ``ConfigRecord`` carries to the clients.
    """

    __slots__ = ("_params",)

    def __init__(self, params: Mapping[str, Any] | str | None = None) -> None:
        if params is None or isinstance(params, str):
            self._params = parse_params(params or "")
            return
        if not isinstance(params, Mapping):
            raise ValueError(f"expected a mapping or 'name=value,...' text, got {params!r}")
        for name, value in params.items():
            if not isinstance(name, str) or not isinstance(value, (bool, int, float, str)):
                raise ValueError(f"parameter {name!r}: expected a number, a boolean or text, "
                                 f"got {value!r}")
        self._params = {name.replace("-", "_"): value for name, value in params.items()}

    def __getitem__(self, name: str) -> Any:
        return self._params[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._params)

    def __len__(self) -> int:
        return len(self._params)

    def __hash__(self) -> int:
        return hash(frozenset(self._params.items()))

    def __str__(self) -> str:
        return ",".join(f"{name}={value}" for name, value in self._params.items())

    def __repr__(self) -> str:
        return repr(self._params)


def check(cond: bool, field_name: str, message: str) -> None:
    """Raise ``ValueError`` naming the hyphenated key of ``field_name`` unless ``cond``."""
    if not cond:
        raise ValueError(f"{_key(field_name)}: {message}")


def changed_knobs(cfg: Any) -> str:
    """The knobs of a config dataclass that differ from their defaults, or ``"defaults"``."""
    default = type(cfg)()
    changed = [f"{_key(f.name)}={getattr(cfg, f.name)!r}" for f in dataclasses.fields(cfg)
               if getattr(cfg, f.name) != getattr(default, f.name)]
    return ", ".join(changed) if changed else "defaults"


def given_knobs(knobs: Mapping[str, Any], **named: Any) -> dict[str, Any]:
    """``knobs`` and, after them in this order, the ``named`` ones that are not ``None``."""
    out = dict(knobs)
    out.update((name, value) for name, value in named.items() if value is not None)
    return out


def build_config(config: Any, knobs: dict[str, Any], cls: type[Any]) -> Any:
    """``config`` (a ``cls`` or ``None``) with ``knobs`` applied; ``ValueError`` names a bad one."""
    base = config if config is not None else cls()
    if not isinstance(base, cls):
        raise TypeError(f"config must be a {cls.__name__}, got {type(base).__name__}")
    known = {f.name for f in dataclasses.fields(cls)}
    for name in knobs:
        if name.replace("-", "_") not in known:
            raise unknown_knob(name.replace("-", "_"), known)
    return from_mapping(cls, {**dataclasses.asdict(base), **knobs})


#: Run-config keys every strategy accepts without reading them (``strategy.start`` takes
#: the number of rounds; nearly every Flower app's run config has it).
FLOWER_KEYS = frozenset({"num-server-rounds"})
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


def _check_keys(run_config: Mapping[str, Any], known: set[str], app_keys: Iterable[str],
                owner: str) -> None:
    """Refuse every run-config key that is not a knob, Flower's or the app's own.

    The error names the key, the closest knobs and how to declare the app's own keys.
    """
    allowed = known | FLOWER_KEYS | {_key(k) for k in app_keys}
    for key in run_config:
        if not known_key(_key(key), allowed):
            raise ValueError(f"{key!r} is not a knob of {owner} ({closest(key, known)}); "
                             + ELSEWHERE.get(_key(key), "if it is your app's own key, pass "
                                                        f"app_keys=[{key!r}, ...]"))


def known_key(key: str, known: set[str] | frozenset[str]) -> bool:
    """Whether run-config ``key`` is in ``known``, or an entry of a table in it (``a.b``)."""
    return _key(key) in known or _key(key).partition(".")[0] in known


def closest(key: str, known: Iterable[str], what: str = "knob") -> str:
    """``did you mean 'a' or 'b'?``: difflib's closest of ``known`` (``what`` they are)."""
    names = sorted(known)
    close = difflib.get_close_matches(_key(key), names, n=3)
    if not close:
        return f"no {what} is spelled like it"
    quoted = [repr(k) for k in close]
    said = quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"
    return f"did you mean {said}?"


def unknown_knob(name: str, known: Iterable[str], owner: str = "") -> ValueError:
    """The error for a knob ``name`` not in ``known``, naming the closest and all known."""
    names = sorted(known)
    where = f" for {owner}" if owner else ""
    hint = f"; {ELSEWHERE[_key(name)]}" if _key(name) in ELSEWHERE else ""
    return ValueError(f"unknown knob {name!r}{where} ({closest(name, names)}){hint}; known: "
                      f"{', '.join(names)}")


def strategy_kwargs(owner: str, config_cls: type, run_config: Mapping[str, Any],
                    overrides: Mapping[str, Any], *, args_cls: type | None = None,
                    defaults: Mapping[str, Any] | None = None,
                    app_keys: Iterable[str] = ()) -> dict[str, Any]:
    """Keyword arguments of strategy ``owner`` read from a run config (``from_run_config``).

    The fields of ``config_cls`` go into ``config=``, those of ``args_cls`` (its other
    knobs, a :class:`~dq_flower.knobs.StrategyConfig`) as keyword arguments where given;
    ``defaults`` apply where a key is missing, ``overrides`` win. A bad value or an unknown
    key (any but ``num-server-rounds`` and ``app_keys``) raises ``ValueError`` naming it.
    """
    fields = {f.name for f in dataclasses.fields(config_cls)}
    args = {_key(f.name): f.name for f in dataclasses.fields(args_cls)} if args_cls else {}
    _check_keys(run_config, {_key(n) for n in fields} | set(args), app_keys, owner)
    given = {_key(k): v for k, v in run_config.items()}
    mapping = {k: v for k, v in (defaults or {}).items()
               if k in fields and _key(k) not in given}
    mapping.update(given)
    kwargs: dict[str, Any] = {"config": from_mapping(config_cls, mapping)}
    if args_cls is not None:  # checked as the strategy will check them, passed where given
        read: Any = from_mapping(args_cls, {k: v for k, v in given.items() if k in args})
        kwargs.update((name, getattr(read, name)) for key, name in args.items() if key in given)
    kwargs.update(overrides)
    return kwargs
