"""The table of training methods: builders register here, lookups go through ``methods``.

:mod:`dq_flower.harness.methods` registers the built-in methods as it is imported, so a
lookup through it never misses one.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dq_flower.config import field_keys, unset_spellings

__all__ = ["Family", "FAMILIES", "Method", "METHODS", "family_of", "not_set_values",
           "register_method"]


@dataclass(frozen=True)
class Family:
    """What the methods of one family share; the harness's ClientApp has one handler each.

    Attributes
    ----------
    name : str
        ``dq``, ``gradient`` (:class:`dq_flower.GradientStrategy`), ``fedavg`` (Flower's
        ``FedAvg``) or ``compressed`` (``FedAvg`` in :class:`dq_flower.CompressedUpdates`).
    payload_unit : str
        How the summary counts the uplink: ``sample`` (DQ's coded samples), ``coord`` (bits
        per model coordinate and coded reply) or ``wire`` (the float32 message bytes).
    coded, epoch_rounds : bool
        Whether the uploads pass the lossless ``entropy-coder`` stage; whether every round is
        a local epoch (tuning's ``--tune-epoch-rounds`` horizon).
    """

    name: str
    payload_unit: str
    coded: bool = True
    epoch_rounds: bool = False


#: The families, by name.
FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("dq", "sample"),
    Family("gradient", "coord"),
    Family("fedavg", "wire", coded=False, epoch_rounds=True),
    Family("compressed", "coord", epoch_rounds=True),
)}


def family_of(name: str) -> Family:
    """The family called ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"unknown method family {name!r}; known: {', '.join(FAMILIES)}") \
            from None


@dataclass(frozen=True)
class Method:
    """A named training method.

    Attributes
    ----------
    name, family : str
        Public name (``dq``, ``fedavg``, ``qsgd``, ...) and its :class:`Family`'s name.
    config_cls : type
        Typed config dataclass of the method's knobs.
    client_config_cls : type or None
        Typed config of knobs only its clients read, where ``config_cls`` lacks them.
    build : callable
        ``build(task, run_config, model, info) -> (strategy, train_config)``.
    defaults : mapping
        Knob values this method sets (e.g. ``{"codec": "qsgd"}``), overridable.
    """

    name: str
    family: str
    config_cls: type
    build: Callable[..., Any]
    defaults: Mapping[str, Any]
    client_config_cls: type | None = None

    def knob_keys(self) -> set[str]:
        """The hyphenated keys of every knob this method reads (server and clients)."""
        return set().union(*(field_keys(c) for c in self.config_classes()))

    def config_classes(self) -> tuple[type, ...]:
        """``config_cls`` and, where there is one, ``client_config_cls``."""
        return tuple(c for c in (self.config_cls, self.client_config_cls) if c is not None)

    def merged(self, run_config: Mapping[str, Any]) -> dict[str, Any]:
        """``run_config`` over this method's defaults.

        A value meaning "not set" (:func:`not_set_values`) keeps the method's own default, so
        ``pyproject.toml`` can list every knob while ``fedavg-qsgd2`` keeps ``levels = 1``.
        """
        unset = not_set_values()
        return {**self.defaults, **{k: v for k, v in run_config.items() if k not in self.defaults
                                    or not any(_same(v, u) for u in unset.get(k, ()))}}


def not_set_values() -> dict[str, list[Any]]:
    """Run-config key -> the values that mean "not set" for it, for any registered method.

    The spellings the config fields declare (:func:`dq_flower.config.knob`'s ``unset``),
    e.g. the robust mean's defaults leave the ``fedavg-*`` methods their plain mean.
    """
    out: dict[str, list[Any]] = {}
    for method in METHODS.values():
        for cls in method.config_classes():
            for key, value in unset_spellings(cls).items():
                values = out.setdefault(key, [])
                if not any(_same(value, v) for v in values):
                    values.append(value)
    return out


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, bool) or type(value) not in (type(neutral), int, float, str):
        return False
    return value == neutral


#: The registered methods, by name, in registration order.
METHODS: dict[str, Method] = {}


def register_method(name: str, family: str, config_cls: type,
                    defaults: Mapping[str, Any] | None = None,
                    client_config_cls: type | None = None):
    """Decorator registering a strategy builder as method ``name`` of a known family."""
    family_of(family)

    def deco(build: Callable[..., Any]) -> Callable[..., Any]:
        METHODS[name] = Method(name, family, config_cls, build, dict(defaults or {}),
                               client_config_cls)
        return build

    return deco
