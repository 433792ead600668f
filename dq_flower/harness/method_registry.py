"""The table of training methods: :class:`Method` and :func:`register_method`.

Builders register themselves here (:mod:`dq_flower.harness.methods_builtin`); callers look
methods up through :mod:`dq_flower.harness.methods`, which imports the built-in ones first,
so a lookup never misses a method.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Method", "NEUTRAL_VALUES", "METHODS", "register_method"]

#: Run-config values that mean "not set" (``pyproject.toml`` lists every knob at such a
#: value): they do not override a method's own default for the key, so the table can
#: list ``levels = 0`` while ``fedavg-qsgd2`` keeps its ``levels = 1``.
NEUTRAL_VALUES: dict[str, Any] = {
    "codec-params": "", "levels": 0, "bucket": 0, "ratio": 0.0, "rank": 0,
    "local-epochs": 0, "downlink": "auto", "aggregation": "auto", "error-feedback": "auto",
    "per-tensor": "auto",
    # the robust mean's defaults: the fedavg-* methods keep their plain mean under them
    "clip-factor": 1.0, "weight-cap": 2.0, "min-cosine": 0.0,
}


@dataclass(frozen=True)
class Method:
    """A named training method.

    Attributes
    ----------
    name : str
        Public name (``dq``, ``fedavg``, ``qsgd``, ...).
    family : str
        Client handler family (``dq``, ``gradient``, ``fedavg``).
    config_cls : type
        Typed config dataclass of the method's knobs.
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

    def merged(self, run_config: Mapping[str, Any]) -> dict[str, Any]:
        """``run_config`` over this method's defaults.

        A run-config value equal to the key's :data:`NEUTRAL_VALUES` entry ("not set") does
        not replace the method's own default.
        """
        out = dict(self.defaults)
        for key, value in run_config.items():
            if key in out and key in NEUTRAL_VALUES and _same(value, NEUTRAL_VALUES[key]):
                continue
            out[key] = value
        return out


def _same(value: Any, neutral: Any) -> bool:
    if isinstance(value, bool) or type(value) not in (type(neutral), int, float, str):
        return False
    return value == neutral


#: The registered methods, by name, in registration order.
METHODS: dict[str, Method] = {}


def register_method(name: str, family: str, config_cls: type,
                    defaults: Mapping[str, Any] | None = None):
    """Decorator registering a strategy builder as method ``name``."""

    def deco(build: Callable[..., Any]) -> Callable[..., Any]:
        METHODS[name] = Method(name, family, config_cls, build, dict(defaults or {}))
        return build

    return deco
