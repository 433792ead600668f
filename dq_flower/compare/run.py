"""Planning and running a comparison: every planned method, one after another.

:func:`plan_runs` layers the knobs (preset, its method tables, ``--set``) and validates every
method's complete run config, and :func:`check_data` loads the data set once, so that a bad
knob or a missing file is reported before the first method runs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import platform
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

from dq_flower.compare.devices import MEASURED, ComputeProfile
from dq_flower.compare.links import LinkProfile, parse_links
from dq_flower.compare.presets import MethodSpec, Preset, toml_module
from dq_flower.compare.reports import RESULTS_FORMAT, load_results, write_reports
from dq_flower.compare.summary import error_line, fmt_bytes, is_failed, run_summaries
from dq_flower.compare.work import attach_devices
from dq_flower.config import field_keys, write
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import (
    client_config,
    get_method,
    method_names,
    validate_run_config,
)
from dq_flower.harness.ray_backend import check_ray_address
from dq_flower.harness.simulate import build_run_config, simulate
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_dataset_cached
from dq_flower.json_out import jsonable

__all__ = ["ENGINES", "ConsoleProgress", "check_engine", "quiet_flower", "run_comparison",
           "SCENARIO_KEYS", "PlannedRun", "parse_set", "plan_runs", "check_data"]

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
                    for k, v in write(cfg).items()}
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


#: Execution engines: Flower's simulation engine (Ray) or the in-process grid.
ENGINES = ("simulation", "inprocess")


class ConsoleProgress:
    """One line per method start and end, and per round (rewritten in place on a terminal)."""

    def __init__(self, stream: TextIO | None = None, rounds: bool = True) -> None:
        self.stream = stream if stream is not None else sys.stdout
        self.rounds = rounds
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self._open = False
        self._prefix = ""
        self._total_rounds = 0

    def _print(self, text: str, end: str = "\n") -> None:
        self.stream.write(text + end)
        self.stream.flush()

    def start(self, index: int, count: int, plan: PlannedRun) -> None:
        """A method starts."""
        self._prefix = f"[{index}/{count}] {plan.spec.label}"
        self._total_rounds = int(plan.run_config["num-server-rounds"])
        self._print(f"{self._prefix}: starting ({plan.spec.method}, "
                    f"{self._total_rounds} rounds)")

    def round(self, row: Mapping[str, Any]) -> None:
        """A round finished (round 0 is the initial model's evaluation)."""
        if not self.rounds or int(row["round"]) == 0:
            return
        line = (f"{self._prefix} round {int(row['round']):>3}/{self._total_rounds}  "
                f"acc {100 * float(row['accuracy']):5.1f}%  "
                f"up {fmt_bytes(row['cum_up_bytes']):>9}  "
                f"down {fmt_bytes(row['cum_down_bytes']):>9}  {float(row['wall_s']):6.1f} s")
        if self.tty:
            self._print("\r\x1b[2K" + line, end="")
            self._open = True
        else:
            self._print(line)

    def end(self, record: Mapping[str, Any], target: float) -> None:
        """A method ended (or failed)."""
        if self._open:
            self._print("")
            self._open = False
        if is_failed(record):
            self._print(f"{self._prefix}: FAILED after {record['wall_s']:.1f} s: "
                        f"{error_line(record)}")
            return
        stats = record["stats"]
        reach = (f"reached {100 * target:.1f}% at round {stats['rounds_to_target']} with "
                 f"{fmt_bytes(stats['up_bytes_to_target'])} uplink"
                 if stats["rounds_to_target"] is not None
                 else f"did not reach {100 * target:.1f}%")
        how = ("reused from the earlier results.json" if record.get("reused")
               else f"done in {record['wall_s']:.1f} s")
        self._print(f"{self._prefix}: {how}, final accuracy "
                    f"{100 * stats['final_accuracy']:.1f}%, {reach}")


class _FlowerNoise(logging.Filter):
    """Drops Flower messages that say nothing about this comparison."""

    NOISE = ("fraction_evaluate is set to 0.0", "The `run_simulation` function is deprecated")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.NOISE)


@contextlib.contextmanager
def quiet_flower(verbose: bool) -> Iterator[None]:
    """Silence Flower's per-round INFO log (the progress lines replace it)."""
    logger = logging.getLogger("flwr")
    level = logger.level
    noise = _FlowerNoise()
    if not verbose:
        logger.setLevel(logging.WARNING)
        logger.addFilter(noise)
    try:
        yield
    finally:
        logger.setLevel(level)
        logger.removeFilter(noise)


def run_one(plan: PlannedRun, engine: str, on_round: Callable[[dict[str, Any]], None],
             num_cpus_per_client: float, verbose: bool, num_gpus_per_client: float = 0.0,
             ray_address: str | None = None):
    cfg = plan.run_config
    if engine == "inprocess":
        from dq_flower.harness.server_app import run_server  # PyTorch, when a run starts

        grid = InProcessGrid(client_app, int(cfg["num-partitions"]))
        # clients run one after another here, so each may use every core (the client app
        # sets torch's thread count, which the server's evaluation shares, from this key)
        for context in grid.contexts.values():
            context.node_config["num-threads"] = max(1, os.cpu_count() or 1)
        return run_server(grid, cfg, on_round=on_round)
    return simulate(plan.spec.method, cfg["dataset"], cfg["model"],
                    int(cfg["num-partitions"]), int(cfg["num-server-rounds"]),
                    int(cfg["seed"]), num_cpus_per_client=num_cpus_per_client,
                    num_gpus_per_client=num_gpus_per_client, verbose=verbose,
                    on_round=on_round, ray_address=ray_address, **plan.knobs)


def check_engine(engine: str, ray_address: str | None = None) -> None:
    """``ValueError`` for an unknown engine, or a Ray address it cannot use."""
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    if ray_address is not None:
        if engine != "simulation":
            raise ValueError(f"ray-address: joins a Ray cluster with the simulation engine, "
                             f"not with engine {engine!r}")
        check_ray_address(ray_address)


def run_comparison(preset: Preset, out_dir: str | os.PathLike[str], *,
                   sets: Sequence[tuple[str | None, str, Any]] = (), engine: str = "simulation",
                   progress: ConsoleProgress | None = None, num_cpus_per_client: float = 1.0,
                   num_gpus_per_client: float = 0.0, verbose: bool = False, command: str = "",
                   plans: list[PlannedRun] | None = None, resume: bool = False,
                   links: Sequence[LinkProfile] | None = None,
                   ray_address: str | None = None,
                   devices: Sequence[ComputeProfile] = (),
                   server_device: ComputeProfile = MEASURED) -> dict[str, Any]:
    """Run every method of ``preset`` and write the reports to ``out_dir``; the results.

    ``sets`` are parsed ``--set`` items; ``engine`` is ``simulation`` (Ray; ``ray_address``
    joins a cluster) or ``inprocess``; ``plans`` skips :func:`plan_runs`. ``resume`` keeps
    an earlier ``results.json``'s finished runs with the same engine and run config.
    ``links`` (default ``lte``, ``wifi``, ``datacenter``) and ``devices`` (with
    ``server_device``) are what the summary times the runs on. A method that raises is
    recorded as failed (error, traceback, empty history) and the others still run; the
    files are rewritten after every method.
    """
    check_engine(engine, ray_address)
    plans = plan_runs(preset, sets) if plans is None else plans
    check_data(preset)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "format": RESULTS_FORMAT, "preset": _preset_json(preset), "engine": engine,
        "target_accuracy": preset.target_accuracy,
        "high_target_accuracy": preset.high_target_accuracy,
        "links": [link.to_json() for link in (parse_links(()) if links is None else links)],
        "command": command, "environment": _environment(), "runs": [], "total_wall_s": 0.0}
    if devices:
        train_rows = plans[0].resolved.get("train-rows", 0) if plans else 0
        attach_devices(results, devices, server_device, int(train_rows or 0))
    earlier = _reusable(out, engine) if resume else {}
    t0 = time.perf_counter()
    with quiet_flower(verbose):
        for i, plan in enumerate(plans, start=1):
            # the earlier finished runs still ahead in the list stay in the file (under
            # "pending", which the reports ignore) until they are reached: an interrupted
            # --resume must not lose them
            results["pending"] = [earlier[p.spec.label] for p in plans[i:]
                                  if p.spec.label in earlier]
            if progress is not None:
                progress.start(i, len(plans), plan)
            old = earlier.get(plan.spec.label)
            if old is not None and old["run_config"] == jsonable(plan.run_config):
                record: dict[str, Any] = {**old, "failed": False, "reused": True}
            else:
                on_round = progress.round if progress is not None else (lambda row: None)
                record = _execute(plan, engine, on_round, num_cpus_per_client, verbose,
                                  num_gpus_per_client, ray_address)
                results["total_wall_s"] = time.perf_counter() - t0
            results["runs"].append(record)
            record["stats"] = run_summaries(results)[-1]
            if progress is not None:
                progress.end(record, preset.target_accuracy)
            write_reports(results, out)  # after every run: an interruption must not lose it
    return results


def _execute(plan: PlannedRun, engine: str, on_round: Callable[[dict[str, Any]], None],
             *options: Any) -> dict[str, Any]:
    """Run one method (:func:`run_one`) and return its record, a failed one if it raised."""
    record: dict[str, Any] = {"label": plan.spec.label, "method": plan.spec.method,
                              "family": plan.family, "config": plan.resolved,
                              "run_config": plan.run_config}
    t_run = time.perf_counter()
    try:
        result = run_one(plan, engine, on_round, *options)
    except KeyboardInterrupt:
        raise
    # one failing method must not stop the rest; SystemExit too: Flower's engine
    # exits the process on some errors of its own (e.g. a missing extra)
    except (Exception, SystemExit) as exc:  # noqa: BLE001
        record.update(failed=True, status="failed",
                      error=f"{type(exc).__name__}: {exc}",
                      traceback=traceback.format_exc(), history=[], num_params=0,
                      data_dim=0)
    else:
        record.update(failed=False, status="ok", error="",
                      num_params=int(result.num_params),
                      data_dim=int(result.data_dim), history=result.history)
    record["wall_s"] = time.perf_counter() - t_run
    return record


def _reusable(out: Path, engine: str) -> dict[str, dict[str, Any]]:
    try:
        data = load_results(out)
    except (OSError, ValueError):
        return {}
    if data.get("engine") != engine:
        return {}
    return {rec["label"]: rec for rec in [*data.get("pending", []), *data.get("runs", [])]
            if not is_failed(rec) and "run_config" in rec}


def _preset_json(preset: Preset) -> dict[str, Any]:
    return {**asdict(preset), "methods": list(preset.methods)}


def _environment() -> dict[str, Any]:
    versions = {}
    for pkg in ("dq_flower", "flwr", "torch", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "?"
    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cpus": os.cpu_count(), "versions": versions}
    if hasattr(os, "getloadavg"):
        env["load_average"] = os.getloadavg()[0]
    env.update(_git_state())
    return env


def _git_state() -> dict[str, Any]:
    """Commit and uncommitted files of the source tree, when it is a git checkout."""
    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {}
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True,
                              timeout=10, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
        dirty = git("status", "--porcelain", "--untracked-files=no").split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit,
            "git_modified": sorted(line[3:] for line in dirty if line.strip())}

