"""One descriptor for every knob and codec parameter: default, check, side, "not set", meaning.

A frozen dataclass field ``bits: int = knob(2, between(1, 8))`` is checked each time the
dataclass is built, by keyword or from a run config alike: first its type (the field's
annotation, :func:`coerce_type`), then its check; :mod:`dq_flower.config` reads run configs
and :func:`knob_table` the docs' tables from the same descriptors.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any

__all__ = ["Knob", "NO_SPELLING", "knob", "inherit", "knob_of", "knobs_of", "knob_table",
           "at_least", "between", "one_of", "above", "coerce_type", "kind_of", "INT_RANGE",
           "MAX_NODES", "MAX_ROWS", "MAX_CLASSES", "MAX_STEPS", "MAX_EPOCHS", "MAX_PROCESSES"]

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
#: Integers a float holds exactly (``1e300`` is integral, but not the integer meant).
_EXACT_FLOAT_INT = 2**53


def kind_of(annotation: Any) -> Any:
    """``int`` of ``int | None``; the annotation itself otherwise."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        hints = [h for h in typing.get_args(annotation) if h is not type(None)]
        return hints[0] if len(hints) == 1 else None
    return annotation


def coerce_type(kind: Any, value: Any) -> Any:
    """``value`` as a ``kind`` (``bool``, ``int``, ``float`` or ``str``; others as given).

    One rule for keyword arguments and run configs: no text for numbers or booleans
    (``"2"`` is not 2), booleans are ``True``/``False`` or 0/1, integers exact and within
    :data:`INT_RANGE` (a float only where it is a whole number below 2**53), floats finite,
    text a ``str`` (or a path). Raises ``ValueError`` with the message.
    """
    if kind is bool:
        numpy_bool = (getattr(getattr(value, "dtype", None), "kind", "") == "b"
                      and getattr(value, "shape", None) == ())  # numpy's bool scalar
        if (isinstance(value, (bool, numbers.Integral)) or numpy_bool) and value in (0, 1):
            return bool(value)
        raise ValueError(f"expected true or false (or 0/1), got {value!r}")
    if kind is int:
        exact = isinstance(value, numbers.Integral) or (
            isinstance(value, numbers.Real) and math.isfinite(value)
            and float(value).is_integer() and abs(float(value)) <= _EXACT_FLOAT_INT)
        if exact and not isinstance(value, bool):
            number = int(value)
        else:
            raise ValueError(f"expected an integer, got {value!r}"
                             + (" (not exactly an integer)" if isinstance(value, float)
                                and math.isfinite(value) and value.is_integer() else ""))
        if not INT_RANGE[0] <= number <= INT_RANGE[1]:
            raise ValueError(f"must be in [-2**63, 2**63 - 1] (a run config's 64-bit "
                             f"integers), got {number}")
        return number
    if kind is float:
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                real = float(value)
            except OverflowError:
                real = math.inf
            if math.isfinite(real):
                return real
        raise ValueError(f"expected a finite float, got {value!r}")
    if kind is str:
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if isinstance(value, str):
            return value
        raise ValueError(f"expected text, got {value!r}")
    return value


class Knob:
    """A checked dataclass field.

    Parameters
    ----------
    default : Any
        The field's default (``None`` for a knob that may stay unset).
    check : callable, optional
        ``value -> message or None``; a message raises ``ValueError("key: message")``.
    coerce : callable, optional
        Applied to every value first, in place of :func:`coerce_type` of the field's
        annotation; an error it raises is prefixed with the key unless its message starts
        with the field's name.
    client : bool
        Whether the knob travels to the clients in each train message.
    unset : Any, optional
        The run config's spelling of "not set" (TOML has no null): a value equal to it, or
        ``None``, is the default.
    doc : str
        One line of meaning, for the docs' knob tables.
    """

    def __init__(self, default: Any, check: Check | None = None, *,
                 coerce: Callable[[Any], Any] | None = None, client: bool = False,
                 unset: Any = NO_SPELLING, doc: str = "") -> None:
        self.default, self.check, self.coerce = default, check, coerce
        self.client, self.unset, self.doc = client, unset, doc
        self.name = ""
        self._owner: type | None = None
        self._kind: Any = None  # the annotation's type, resolved at the first value

    def but(self, **changes: Any) -> Any:
        """A copy with ``changes`` (another default, or sent to the clients)."""
        options = {"default": self.default, "check": self.check, "coerce": self.coerce,
                   "client": self.client, "unset": self.unset, "doc": self.doc}
        return Knob(**{**options, **changes})

    @property
    def key(self) -> str:
        """The hyphenated run-config key."""
        return self.name.replace("_", "-")

    @property
    def has_unset(self) -> bool:
        """Whether the knob declares a run-config spelling of "not set"."""
        return self.unset is not NO_SPELLING

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self._owner = name, owner

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self.default  # what dataclasses read as the field's default
        return obj.__dict__[self.name]

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
        if self.has_unset and (value is None or _same(value, self.unset)):
            value = self.default
        if value is None and self.default is not None:
            raise ValueError(f"{self.key}: must be given a value, got None")
        if value is not None:
            try:
                value = self._coerced(value)
            except (TypeError, ValueError) as exc:  # named as the check's messages are
                text = str(exc)
                raise ValueError(text if text.startswith(self.name)
                                 else f"{self.key}: {text}") from None
        if self.check is not None and value is not None:
            message = self.check(value)
            if message:
                raise ValueError(f"{self.key}: {message}")
        obj.__dict__[self.name] = value


def knob(default: Any, check: Check | None = None, **options: Any) -> Any:
    """A :class:`Knob` field (typed ``Any``, so ``bits: int = knob(2)`` type-checks)."""
    return Knob(default, check, **options)


def inherit(cls: type, name: str, **changes: Any) -> Any:
    """Knob ``name`` of ``cls`` with ``changes``, for a subclass (``default=0.05``)."""
    found = knob_of(cls, name)
    if found is None:
        raise TypeError(f"{cls.__name__}.{name} is not a Knob")
    return found.but(**changes)


def _same(value: Any, spelling: Any) -> bool:
    return type(value) is not bool and value == spelling


def knob_of(cls: type, name: str) -> Knob | None:
    """The :class:`Knob` declaring field ``name`` of ``cls`` (``None`` for a plain field)."""
    for klass in cls.__mro__:
        found = vars(klass).get(name)
        if found is not None:
            return found if isinstance(found, Knob) else None
    return None


def knobs_of(cls: type) -> dict[str, Knob]:
    """Field name -> :class:`Knob` of every knob field of dataclass ``cls``, in order."""
    out = {}
    for f in dataclasses.fields(cls):
        found = knob_of(cls, f.name)
        if found is not None:
            out[f.name] = found
    return out


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
            f"{')' if high_open else ']'}")
    extra = f" ({note})" if note else ""

    def check(v: Any) -> str | None:
        inside = (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
        return None if inside else f"{text}{extra}, got {v}"

    return check


def one_of(choices: Sequence[Any]) -> Check:
    """A check that a value is one of ``choices``; the message lists them."""
    return lambda v: None if v in choices else f"must be one of {tuple(choices)}, got {v!r}"


def knob_table(cls: type, defaults: dict[str, str] | None = None) -> list[str]:
    """Markdown rows ``| key | default | meaning |`` of the knobs of ``cls`` with a meaning.

    Its own knobs first, then its groups'; ``defaults`` replaces some keys' default column.
    """
    rows = ["| key | default | meaning |", "|---|---|---|"]
    found_all = knobs_of(cls)
    own = [name for name in found_all if name in vars(cls)
           and not any(name in vars(base) for base in cls.__mro__[1:])]
    for found in (found_all[name] for name in [*own, *(n for n in found_all if n not in own)]):
        if not found.doc:
            continue
        shown = (defaults or {}).get(found.key)
        if shown is None:
            shown = _shown(found.unset if found.default is None and found.has_unset
                           else found.default)
            if found.default is None:
                shown += " (not set)"
        rows.append(f"| `{found.key}` | {shown} | {found.doc} |")
    return rows


def _shown(value: Any) -> str:
    if isinstance(value, Mapping):  # a table of parameters (CodecParams): its text spelling
        value = str(value)
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, str):
        return f"`{value}`" if value else '`""`'
    return f"`{value:g}`" if isinstance(value, float) else f"`{value}`"
