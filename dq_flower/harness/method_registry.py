"""The table of training methods: builders register here, lookups go through ``methods``.

:mod:`dq_flower.harness.methods` registers the built-in methods as it is imported, so a
lookup through it never misses one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from dq_flower.config import field_keys, knobs_of

__all__ = ["Family", "FAMILIES", "Method", "METHODS", "family_of", "register_method"]


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
        Typed config of the method's knobs: a strategy's config, or a preset of one with
        the method's own defaults (:func:`dq_flower.config.preset`).
    client_config_cls : type or None
        Typed config of knobs only its clients read, where ``config_cls`` lacks them.
    build : callable
        ``build(task, run_config, model, info) -> (strategy, train_config)``.
    """

    name: str
    family: str
    config_cls: type
    build: Callable[..., Any]
    client_config_cls: type | None = None

    @property
    def defaults(self) -> dict[str, Any]:
        """The knobs this method's preset sets (``{"codec": "qsgd"}``), hyphenated."""
        root = getattr(self.config_cls, "preset_of", self.config_cls)
        presets = self.config_cls.__mro__[:self.config_cls.__mro__.index(root)]
        return {k.key: k.default for name, k in knobs_of(self.config_cls).items()
                if any(name in vars(cls) for cls in presets)}

    def knob_keys(self) -> set[str]:
        """The hyphenated keys of every knob this method reads (server and clients)."""
        return set().union(*(field_keys(c) for c in self.config_classes()))

    def config_classes(self) -> tuple[type, ...]:
        """``config_cls`` and, where there is one, ``client_config_cls``."""
        return tuple(c for c in (self.config_cls, self.client_config_cls) if c is not None)


#: The registered methods, by name, in registration order.
METHODS: dict[str, Method] = {}


def register_method(name: str, family: str, config_cls: type,
                    client_config_cls: type | None = None):
    """Decorator registering a strategy builder as method ``name`` of a known family."""
    family_of(family)

    def deco(build: Callable[..., Any]) -> Callable[..., Any]:
        METHODS[name] = Method(name, family, config_cls, build, client_config_cls)
        return build

    return deco
