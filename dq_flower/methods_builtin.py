"""Builders of the built-in methods."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .config import DQConfig, TaskConfig, from_mapping
from .methods import register_method
from .runtime import TaskInfo


@register_method("dq", family="dq", config_cls=DQConfig)
def build_dq(task: TaskConfig, run_config: Mapping[str, Any], model, info: TaskInfo):
    """Data quantization (DESIGN.md section 2)."""
    from .strategies.dq import DQStrategy

    return DQStrategy(task, from_mapping(DQConfig, run_config), model, info)
