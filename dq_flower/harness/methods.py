"""Registry of training methods: name -> family, config class and strategy builder.

A method family has one client handler (``dq_flower.harness.client_app``) and one strategy; the
methods of a family differ by configuration (the gradient codec, for instance). The table
itself is :mod:`dq_flower.harness.method_registry`; importing this module registers the
built-in methods (:mod:`dq_flower.harness.methods_builtin`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dq_flower.config import field_keys, from_mapping, unknown_knob
from dq_flower.harness import methods_builtin  # noqa: F401  (registers the built-in methods)
from dq_flower.harness.method_registry import METHODS, Method, register_method
from dq_flower.harness.task_config import TaskConfig

__all__ = ["Method", "register_method", "get_method", "method_names",
           "validate_run_config", "client_config"]


def get_method(name: str) -> Method:
    """The method registered as ``name``; ``ValueError`` listing the known ones otherwise."""
    try:
        return METHODS[name]
    except KeyError:
        raise ValueError(f"unknown method {name!r}; known: {', '.join(method_names())}") from None


def method_names() -> list[str]:
    """Names of all registered methods, in registration order."""
    return list(METHODS)


#: Run-config keys of the package's own apps beside the knobs: the method, where the
#: ServerApp writes its results.
HARNESS_KEYS = frozenset({"method", "results-path"})


def run_config_keys() -> set[str]:
    """Every key a run config of the package's apps may carry (any method's knob)."""
    known = field_keys(TaskConfig) | HARNESS_KEYS
    return known.union(*(get_method(name).knob_keys() for name in method_names()))


def validate_run_config(run_config: Mapping[str, Any]) -> tuple[TaskConfig, Any]:
    """Parse and check the whole run config before any work starts.

    Returns the task config and the method's config; raises ``ValueError`` naming the key.
    """
    method = get_method(str(run_config.get("method", "dq")))
    known = run_config_keys()
    for key in run_config:
        if key.replace("_", "-") not in known:
            raise unknown_knob(key, known, "the package's apps")
    merged = method.merged(run_config)
    task = from_mapping(TaskConfig, merged)
    knobs: Any = from_mapping(method.config_cls, merged)
    client_config(run_config)
    return task, knobs


def client_config(run_config: Mapping[str, Any]) -> Any | None:
    """The method's client-only config (:attr:`Method.client_config_cls`), or ``None``.

    Raises ``ValueError`` naming the key of a bad value.
    """
    method = get_method(str(run_config.get("method", "dq")))
    if method.client_config_cls is None:
        return None
    return from_mapping(method.client_config_cls, method.merged(run_config))
