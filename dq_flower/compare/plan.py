"""Planning a comparison: the runs of a preset, validated before any work starts.

:func:`plan_runs` layers the knobs (preset, its method tables, ``--set``) and validates every
method's complete run config; :func:`check_data` loads the data set once so that a missing
file is reported before the first method runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dq_flower.compare.presets import MethodSpec, Preset, toml_module
from dq_flower.config import field_keys, run_config_values
from dq_flower.harness.methods import (
    client_config,
    get_method,
    method_names,
    validate_run_config,
)
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_dataset_cached

__all__ = ["SCENARIO_KEYS", "PlannedRun", "parse_set", "plan_runs", "check_data"]

#: Run-config keys that define the scenario: the same for every method. (The number of
#: rounds may differ per method: ``--set fedavg.num-server-rounds=10``.)
SCENARIO_KEYS = ("dataset", "model", "num-partitions", "partition", "dirichlet-alpha",
                 "fraction-train", "seed", "data-dir", "validation-fraction")


@dataclass(frozen=True)
class PlannedRun:
    """One method of a comparison, validated and ready to run."""

    spec: MethodSpec
    run_config: dict[str, Any]  # complete and validated
    knobs: dict[str, Any]  # beyond the scenario: what simulate(**knobs) receives
    family: str  # dq, gradient, fedavg, compressed
    resolved: dict[str, Any]  # every task and method knob's effective value


def parse_set(items: Sequence[str]) -> list[tuple[str | None, str, Any]]:
    """``(label or None, key, value)`` of ``--set`` items ``[label.]key=value`` (TOML or text)."""
    out: list[tuple[str | None, str, Any]] = []
    for item in items:
        key, sep, raw = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected key=value or method.key=value")
        label: str | None = None
        if "." in key:
            label, key = key.rsplit(".", 1)
        out.append((label, key.replace("_", "-"), _scalar(raw.strip())))
    return out


def _scalar(raw: str) -> Any:
    tomllib = toml_module()
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def plan_runs(preset: Preset, sets: Sequence[tuple[str | None, str, Any]] = ()) -> list[PlannedRun]:
    """Resolve and validate every run of ``preset`` before any work starts.

    Knobs are layered: ``[knobs]``, ``[methods.<label>]``, ``--set key=value``, then
    ``--set label.key=value``. ``ValueError`` names an unknown, misplaced or bad knob.
    """
    specs = preset.method_specs(method_names())
    labels = [s.label for s in specs]
    allowed = {s.label: field_keys(TaskConfig) | get_method(s.method).knob_keys()
               for s in specs}
    for key in [*preset.knobs, *(k for lbl, k, _ in sets if lbl is None)]:
        _scenario_key_check(key)
        if not any(key in allowed[lbl] for lbl in labels):
            raise ValueError(f"knob {key!r} is not known by any selected method "
                             f"({', '.join(labels)})")
    for lbl, key, _ in sets:
        if lbl is not None and lbl not in allowed:
            raise ValueError(f"--set {lbl}.{key}: {lbl!r} is not among the selected methods "
                             f"({', '.join(labels)})")
    plans = []
    for spec in specs:
        knobs = {k: v for k, v in preset.knobs.items() if k in allowed[spec.label]}
        for key in spec.knobs:
            _scenario_key_check(key)
        knobs.update(spec.knobs)
        for lbl, key, value in sets:
            if lbl is None and key in allowed[spec.label]:
                knobs[key] = value
            elif lbl == spec.label:
                _scenario_key_check(key)
                knobs[key] = value
        scenario = {"partition": preset.partition, "dirichlet-alpha": preset.dirichlet_alpha,
                    "fraction-train": preset.fraction_train, "data-dir": preset.data_dir}
        try:
            run_config = build_run_config(spec.method, preset.dataset, preset.model,
                                          preset.num_clients, preset.rounds, preset.seed,
                                          **scenario, **knobs)
            task, method_cfg = validate_run_config(run_config)
        except ValueError as exc:
            raise ValueError(f"method {spec.label}: {exc}") from None
        configs = (client_config(run_config), task, method_cfg)
        resolved = {k: v for cfg in configs if cfg is not None
                    for k, v in run_config_values(cfg).items()}
        plans.append(PlannedRun(spec, run_config, {**scenario, **knobs},
                                get_method(spec.method).family, resolved))
    return plans


def _scenario_key_check(key: str) -> None:
    if key in SCENARIO_KEYS:
        raise ValueError(f"knob {key!r} is part of the scenario, the same for every method; "
                         "set it with its own flag or preset field")


def check_data(preset: Preset) -> tuple[int, int]:
    """Load the data set once (``FileNotFoundError`` early); return ``(d, n_train)``."""
    ds = load_dataset_cached(preset.dataset, preset.data_dir or None, preset.seed)
    return ds.dim, ds.num_train

