"""The comparison harness: run a list of methods on one scenario and report bytes vs accuracy.

Every method runs with the same data set, model, partition, clients, rounds and seed, in
Flower's simulation engine (:func:`dq_flower.harness.simulate`, one Ray simulation per
method) or in-process (:class:`dq_flower.harness.inprocess.InProcessGrid`, fast, for tests
and quick looks). The output folder receives

* ``results.json``: the scenario, every run's config and per-round history, its summary;
* ``results.csv``: one row per method and round (accuracy, loss, up and down bytes of the
  round and cumulated, wall time, and the method's own metrics);
* ``summary.md``: per method D, d, uplink bits per sample or per coordinate, final accuracy,
  rounds and uplink bytes to the target accuracy, and the ratio of those bytes to DQ's;
* ``accuracy_vs_uplink.png`` (cumulative uplink bytes, log axis) and
  ``accuracy_vs_rounds.png``.

``summary.md`` and the plots are functions of ``results.json`` alone
(:func:`write_reports`), so ``dq-flower report DIR`` redraws them without rerunning.
"""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import math
import os
import platform
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from dq_flower.compare.presets import MethodSpec, Preset

__all__ = [
    "ENGINES",
    "PlannedRun",
    "ConsoleProgress",
    "plan_runs",
    "check_data",
    "run_comparison",
    "run_summaries",
    "write_reports",
    "summary_markdown",
    "CSV_COLUMNS",
    "load_results",
    "parse_set",
    "fmt_bytes",
]

#: Execution engines: Flower's simulation engine (Ray) or the in-process grid.
ENGINES = ("simulation", "inprocess")
#: Leading columns of ``results.csv`` (the methods' own metrics follow, sorted).
CSV_COLUMNS = ("label", "method", "round", "accuracy", "loss", "up_bytes", "down_bytes",
               "cum_up_bytes", "cum_down_bytes", "wall_s")
#: Run-config keys that define the scenario: the same for every method. (The number of
#: rounds may differ per method: ``--set fedavg.num-server-rounds=10``.)
SCENARIO_KEYS = ("dataset", "model", "num-partitions", "partition", "dirichlet-alpha",
                 "fraction-train", "seed", "data-dir")
RESULTS_FORMAT = "dq-flower-compare/1"
REFERENCE = "dq"


# ---------------------------------------------------------------------------- planning


@dataclass(frozen=True)
class PlannedRun:
    """One method of a comparison, validated and ready to run.

    Attributes
    ----------
    spec : MethodSpec
        Label, registered method and the entry's own knobs.
    run_config : dict
        The complete hyphenated run config (validated by ``build_run_config``).
    knobs : dict
        The knobs beyond the scenario (what ``simulate(**knobs)`` receives).
    family : str
        Method family (``dq``, ``gradient``, ``fedavg``).
    resolved : dict
        Every task and method knob with its effective value (defaults included).
    """

    spec: MethodSpec
    run_config: dict[str, Any]
    knobs: dict[str, Any]
    family: str
    resolved: dict[str, Any]


def parse_set(items: Sequence[str]) -> list[tuple[str | None, str, Any]]:
    """Parse ``--set`` items ``key=value`` or ``label.key=value``.

    Values are read as TOML scalars (``3``, ``0.1``, ``true``, ``"x"``), else kept as text.

    Returns
    -------
    list of (label or None, key, value)
    """
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
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def plan_runs(preset: Preset, sets: Sequence[tuple[str | None, str, Any]] = ()) -> list[PlannedRun]:
    """Resolve and validate every run of ``preset`` before any work starts.

    Knobs are layered: the preset's ``[knobs]`` (to every method that knows the key), its
    ``[methods.<label>]`` table, then ``--set key=value`` (every method that knows it) and
    ``--set label.key=value`` (that entry only).

    Raises
    ------
    ValueError
        Unknown method or knob, a knob no selected method knows, a scenario key given as a
        knob, or a bad value (the message names the key and the method).
    """
    from dq_flower.config import field_keys
    from dq_flower.harness.methods import get_method, method_names
    from dq_flower.harness.server_app import validate_run_config
    from dq_flower.harness.simulate import build_run_config
    from dq_flower.harness.task_config import TaskConfig

    specs = preset.method_specs(method_names())
    labels = [s.label for s in specs]
    allowed = {s.label: field_keys(TaskConfig) | field_keys(get_method(s.method).config_cls)
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
        resolved = {k.replace("_", "-"): v
                    for cfg in (task, method_cfg) for k, v in asdict(cfg).items()}
        plans.append(PlannedRun(spec, run_config, {**scenario, **knobs},
                                get_method(spec.method).family, resolved))
    return plans


def _scenario_key_check(key: str) -> None:
    if key in SCENARIO_KEYS:
        raise ValueError(f"knob {key!r} is part of the scenario, the same for every method; "
                         "set it with its own flag or preset field")


def check_data(preset: Preset) -> tuple[int, int]:
    """Load the data set once (errors early, e.g. a missing folder); return ``(d, n_train)``.

    Raises
    ------
    FileNotFoundError
        Data files missing; the message says where they were looked for.
    """
    from dq_flower.harness.tasks.data import load_dataset_cached

    ds = load_dataset_cached(preset.dataset, preset.data_dir or None, preset.seed)
    return ds.dim, ds.num_train


# ---------------------------------------------------------------------------- progress


class ConsoleProgress:
    """Prints one line per method start and end and one per round.

    On a terminal the round line is rewritten in place; elsewhere (logs, pipes) every
    round gets its own line. ``rounds=False`` prints only the per-method lines.
    """

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
        if record["status"] != "ok":
            self._print(f"{self._prefix}: FAILED after {record['wall_s']:.1f} s: "
                        f"{record['error']}")
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


# ---------------------------------------------------------------------------- running


class _FlowerNoise(logging.Filter):
    """Drops Flower messages that say nothing about this comparison."""

    NOISE = ("fraction_evaluate is set to 0.0", "The `run_simulation` function is deprecated")

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(text in message for text in self.NOISE)


@contextlib.contextmanager
def _quiet_flower(verbose: bool) -> Iterator[None]:
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


def _run_one(plan: PlannedRun, engine: str, on_round: Callable[[dict[str, Any]], None],
             num_cpus_per_client: float, verbose: bool, num_gpus_per_client: float = 0.0):
    cfg = plan.run_config
    if engine == "inprocess":
        from dq_flower.harness.client_app import app as client_app
        from dq_flower.harness.inprocess import InProcessGrid
        from dq_flower.harness.server_app import run_server

        grid = InProcessGrid(client_app, int(cfg["num-partitions"]))
        # clients run one after another here, so each may use every core (the client app
        # sets torch's thread count, which the server's evaluation shares, from this key)
        for context in grid.contexts.values():
            context.node_config["num-threads"] = max(1, os.cpu_count() or 1)
        return run_server(grid, cfg, on_round=on_round)
    from dq_flower.harness.simulate import simulate

    return simulate(plan.spec.method, cfg["dataset"], cfg["model"],
                    int(cfg["num-partitions"]), int(cfg["num-server-rounds"]),
                    int(cfg["seed"]), num_cpus_per_client=num_cpus_per_client,
                    num_gpus_per_client=num_gpus_per_client, verbose=verbose,
                    on_round=on_round, **plan.knobs)


def run_comparison(
    preset: Preset,
    out_dir: str | os.PathLike[str],
    *,
    sets: Sequence[tuple[str | None, str, Any]] = (),
    engine: str = "simulation",
    progress: ConsoleProgress | None = None,
    num_cpus_per_client: float = 1.0,
    num_gpus_per_client: float = 0.0,
    verbose: bool = False,
    command: str = "",
    plans: list[PlannedRun] | None = None,
    resume: bool = False,
) -> dict[str, Any]:
    """Run every method of ``preset`` on its scenario and write the reports to ``out_dir``.

    Parameters
    ----------
    preset : Preset
        The scenario (with the command line's overrides already applied).
    out_dir : path
        Output folder (created; files in it are overwritten).
    sets : sequence
        Parsed ``--set`` overrides (:func:`parse_set`).
    engine : str
        ``simulation`` (Flower's simulation engine) or ``inprocess``.
    progress : ConsoleProgress, optional
        Receives start, round and end events; ``None`` prints nothing.
    num_cpus_per_client, num_gpus_per_client : float
        Ray resources per simulated client (simulation engine).
    verbose : bool
        Keep Flower's own logs.
    command : str
        The command line, recorded in ``results.json``.
    plans : list of PlannedRun, optional
        Already validated runs (else :func:`plan_runs` is called).
    resume : bool
        Keep the finished runs of an earlier ``results.json`` in ``out_dir`` whose engine
        and complete run config are identical (marked ``reused``); run only the others.

    Returns
    -------
    dict
        The content of ``results.json``. A method that fails is recorded with status
        ``failed`` and its error; the others still run. The files are rewritten after every
        method, so an interrupted comparison leaves the finished methods' results.
    """
    if engine not in ENGINES:
        raise ValueError(f"engine must be one of {ENGINES}, got {engine!r}")
    plans = plan_runs(preset, sets) if plans is None else plans
    check_data(preset)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {
        "format": RESULTS_FORMAT,
        "preset": _preset_json(preset),
        "engine": engine,
        "target_accuracy": preset.target_accuracy,
        "command": command,
        "environment": _environment(),
        "runs": [],
        "total_wall_s": 0.0,
    }
    earlier = _reusable(out, engine) if resume else {}
    t0 = time.perf_counter()
    with _quiet_flower(verbose):
        for i, plan in enumerate(plans, start=1):
            if progress is not None:
                progress.start(i, len(plans), plan)
            old = earlier.get(plan.spec.label)
            if old is not None and old["run_config"] == _jsonable(plan.run_config):
                record = {**old, "reused": True}
                results["runs"].append(record)
                record["stats"] = run_summaries(results)[-1]
                if progress is not None:
                    progress.end(record, preset.target_accuracy)
                write_reports(results, out)  # an interruption must not lose a reused run
                continue
            record: dict[str, Any] = {"label": plan.spec.label, "method": plan.spec.method,
                                      "family": plan.family, "config": plan.resolved,
                                      "run_config": plan.run_config}
            on_round = progress.round if progress is not None else (lambda row: None)
            t_run = time.perf_counter()
            try:
                result = _run_one(plan, engine, on_round, num_cpus_per_client, verbose,
                                  num_gpus_per_client)
            except KeyboardInterrupt:
                raise
            except Exception as exc:  # noqa: BLE001  (one failing method must not stop the rest)
                record.update(status="failed", error=f"{type(exc).__name__}: {exc}",
                              traceback=traceback.format_exc(), history=[], num_params=0,
                              data_dim=0)
            else:
                record.update(status="ok", error="", num_params=int(result.num_params),
                              data_dim=int(result.data_dim), history=result.history)
            record["wall_s"] = time.perf_counter() - t_run
            results["runs"].append(record)
            results["total_wall_s"] = time.perf_counter() - t0
            record["stats"] = run_summaries(results)[-1]
            if progress is not None:
                progress.end(record, preset.target_accuracy)
            write_reports(results, out)
    return results


def _reusable(out: Path, engine: str) -> dict[str, dict[str, Any]]:
    """Finished runs of an earlier ``results.json`` in ``out`` made with ``engine``."""
    try:
        data = load_results(out)
    except (OSError, ValueError):
        return {}
    if data.get("engine") != engine:
        return {}
    return {rec["label"]: rec for rec in data.get("runs", [])
            if rec.get("status") == "ok" and "run_config" in rec}


def _preset_json(preset: Preset) -> dict[str, Any]:
    data = asdict(preset)
    data["methods"] = list(preset.methods)
    return data


def _environment() -> dict[str, Any]:
    from importlib import metadata

    versions = {}
    for pkg in ("dq_flower", "flwr", "torch", "numpy"):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = "?"
    env = {"python": platform.python_version(), "platform": platform.platform(),
           "cpus": os.cpu_count(), "versions": versions}
    if hasattr(os, "getloadavg"):
        env["load_average"] = os.getloadavg()[0]
    env.update(_git_state())
    return env


def _git_state() -> dict[str, Any]:
    """Commit and uncommitted files of the source tree, when it is a git checkout."""
    import subprocess

    root = Path(__file__).resolve().parents[2]
    if not (root / ".git").exists():
        return {}
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True,
                                text=True, timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=root, capture_output=True, text=True, timeout=10,
                               check=True).stdout.split("\n")
    except (OSError, subprocess.SubprocessError):
        return {}
    return {"git_commit": commit,
            "git_modified": sorted(line[3:] for line in dirty if line.strip())}


# ---------------------------------------------------------------------------- statistics


def _first_reaching(history: list[Mapping[str, Any]], target: float) -> Mapping[str, Any] | None:
    for row in history:
        if float(row["accuracy"]) >= target:
            return row
    return None


def _uplink_unit(record: Mapping[str, Any]) -> dict[str, Any]:
    """Uplink payload size per unit: per sample for DQ, per coordinate for weights/gradients."""
    rows = [r for r in record["history"] if int(r["round"]) >= 1]
    D, d = int(record["num_params"]), int(record["data_dim"])
    bits = sum(float(r.get("up_payload_bits", 0) or 0) for r in rows)
    if record["family"] == "dq":
        grad_rows = [r for r in rows if r.get("gradient_round") == 1]
        data_rows = [r for r in rows if r.get("gradient_round") != 1]
        data_bits = sum(float(r.get("up_payload_bits", 0) or 0) for r in data_rows)
        samples = sum(float(r.get("selected", 0) or 0) for r in data_rows)
        per = data_bits / samples if samples else float("nan")
        unit = {"unit": "sample", "bits": per,
                "bits_per_coord": per / d if d else float("nan"),
                "configured_bits": record["config"].get("bits")}
        if grad_rows:  # upload-mode gradient or auto
            replies = sum(float(r.get("replies", 0) or 0) for r in grad_rows)
            grad_bits = sum(float(r.get("up_payload_bits", 0) or 0) for r in grad_rows)
            unit["gradient_rounds"] = len(grad_rows)
            unit["gradient_bits_per_coord"] = (grad_bits / (replies * D) if replies and D
                                               else float("nan"))
        return unit
    if record["family"] == "gradient" and bits:
        replies = sum(float(r.get("replies", 0) or 0) for r in rows)
        per = bits / (replies * D) if replies and D else float("nan")
        return {"unit": "coord", "bits": per, "bits_per_coord": per, "configured_bits": None}
    # FedAvg: float32 weights; the payload bits are not reported, the wire bytes are
    cfg = record["config"]
    n = int(cfg.get("num-partitions", 1))
    replies = len(rows) * max(1, math.ceil(float(cfg.get("fraction-train", 1.0)) * n))
    wire = 8 * sum(float(r["up_bytes"]) for r in rows)
    per = wire / (replies * D) if replies and D else float("nan")
    return {"unit": "coord (wire)", "bits": per, "bits_per_coord": per,
            "configured_bits": None}


def run_summaries(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-run statistics: final and best accuracy, cost to reach the target, totals."""
    target = float(results["target_accuracy"])
    out = []
    for rec in results["runs"]:
        hist = rec["history"]
        if rec["status"] != "ok" or not hist:
            out.append({"label": rec["label"], "status": rec["status"],
                        "final_accuracy": float("nan"), "best_accuracy": float("nan"),
                        "rounds_to_target": None, "up_bytes_to_target": None,
                        "down_bytes_to_target": None, "total_up_bytes": 0,
                        "total_down_bytes": 0, "rounds": 0, "wall_s": rec.get("wall_s", 0.0)})
            continue
        hit = _first_reaching(hist, target)
        last = hist[-1]
        out.append({
            "label": rec["label"], "status": "ok",
            "final_accuracy": float(last["accuracy"]),
            "best_accuracy": max(float(r["accuracy"]) for r in hist),
            "rounds_to_target": int(hit["round"]) if hit is not None else None,
            "up_bytes_to_target": int(hit["cum_up_bytes"]) if hit is not None else None,
            "down_bytes_to_target": int(hit["cum_down_bytes"]) if hit is not None else None,
            "total_up_bytes": int(last["cum_up_bytes"]),
            "total_down_bytes": int(last["cum_down_bytes"]),
            "rounds": int(last["round"]),
            "wall_s": float(rec.get("wall_s", last.get("wall_s", 0.0))),
            "uplink": _uplink_unit(rec),
        })
    return out


def _is_quantized_gradient(rec: Mapping[str, Any]) -> bool:
    return rec["family"] == "gradient" and rec["config"].get("codec") not in ("identity", None)


# ---------------------------------------------------------------------------- formatting


def fmt_bytes(n: float | None) -> str:
    """``1234567`` -> ``"1.23 MB"`` (decimal units)."""
    if n is None:
        return "-"
    n = float(n)
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n / scale < 100 else f"{n / scale:.0f} {unit}"
    return f"{n:.0f} B"


def _fmt_ratio(x: float) -> str:
    return f"{x:.3g}x" if x < 100 else f"{x:,.0f}x"


def _pct(x: float) -> str:
    return "-" if x != x else f"{100 * x:.1f}%"


def _fmt_unit(u: Mapping[str, Any]) -> str:
    if u["unit"] == "sample":
        conf = f", {u['configured_bits']} b quantizer" if u.get("configured_bits") else ""
        data = f"{u['bits']:,.0f} b/sample ({u['bits_per_coord']:.2f} b/coord{conf})"
        if not u.get("gradient_rounds"):
            return data
        grad = (f"{u['gradient_bits_per_coord']:.3g} b/coord in {u['gradient_rounds']} "
                f"gradient round{'s' if u['gradient_rounds'] > 1 else ''}")
        return grad if u["bits"] != u["bits"] else f"{data}; {grad}"
    if u["unit"] == "coord (wire)":
        return f"{u['bits']:.2f} b/coord (float32, wire)"
    return f"{u['bits']:.3g} b/coord"


def _ratio_cell(stats: Mapping[str, Any], ref: Mapping[str, Any] | None) -> str:
    """Uplink bytes to target of a method divided by the reference's (DQ's)."""
    if ref is None or ref.get("up_bytes_to_target") is None or stats["status"] != "ok":
        return "n/a"
    base = max(1, int(ref["up_bytes_to_target"]))
    if stats["up_bytes_to_target"] is not None:
        return _fmt_ratio(stats["up_bytes_to_target"] / base)
    return f"> {_fmt_ratio(stats['total_up_bytes'] / base)} (not reached)"


def summary_markdown(results: Mapping[str, Any]) -> str:
    """The ``summary.md`` text: scenario, per-method table, plain verdict."""
    p = results["preset"]
    target = float(results["target_accuracy"])
    runs = results["runs"]
    stats = run_summaries(results)
    by_label = {s["label"]: s for s in stats}
    ok = [r for r in runs if r["status"] == "ok"]
    ref_label = REFERENCE if REFERENCE in by_label else (runs[0]["label"] if runs else "")
    ref = by_label.get(ref_label)
    lines = [f"# Comparison: {p['name']}", ""]
    if p.get("description"):
        lines += [p["description"], ""]
    dims = sorted({(r["num_params"], r["data_dim"]) for r in ok})
    dim_text = "; ".join(f"D = {D:,} model parameters, d = {d:,} data coordinates, "
                         f"D/d = {D / d:,.0f}" for D, d in dims if d)
    lines += [
        f"Scenario: data set `{p['dataset']}`, model `{p['model']}`, {p['num_clients']} "
        f"clients, `{p['partition']}` partition"
        + (f" (alpha {p['dirichlet_alpha']})" if p["partition"] == "dirichlet" else "")
        + f", fraction-train {p['fraction_train']}, {p['rounds']} rounds, seed {p['seed']}, "
        f"engine `{results['engine']}`. Target test accuracy: {_pct(target)}.",
        "",
        (dim_text + "." if dim_text else ""),
        "",
        f"| method | D | d | uplink payload | rounds | final acc | best acc "
        f"| rounds to {_pct(target)} "
        f"| uplink to {_pct(target)} | uplink vs {ref_label} | total uplink | total downlink "
        "| wall s |",
        "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for rec, s in zip(runs, stats, strict=True):
        if s["status"] != "ok":
            lines.append(f"| {rec['label']} | - | - | - | - | failed | - | - | - | n/a | - | - "
                         f"| {s['wall_s']:.1f} |")
            continue
        reached = s["rounds_to_target"] is not None
        lines.append(
            f"| {rec['label']} | {rec['num_params']:,} | {rec['data_dim']:,} | "
            f"{_fmt_unit(s['uplink'])} | {s['rounds']} | {_pct(s['final_accuracy'])} | "
            f"{_pct(s['best_accuracy'])} | "
            f"{s['rounds_to_target'] if reached else 'not reached'} | "
            f"{fmt_bytes(s['up_bytes_to_target']) if reached else 'not reached'} | "
            f"{_ratio_cell(s, ref)} | {fmt_bytes(s['total_up_bytes'])} | "
            f"{fmt_bytes(s['total_down_bytes'])} | {s['wall_s']:.1f} |")
    lines += ["", f"\"uplink vs {ref_label}\" is the method's uplink bytes to reach the target "
              f"divided by {ref_label}'s: above 1x, {ref_label} needed fewer bytes; "
              "\"> Nx (not reached)\" divides all the bytes the method sent without reaching "
              "it. Bytes are measured from the serialized Flower messages; \"uplink payload\" "
              "counts the codec's exact bits (side information included) per uploaded sample "
              "or per model coordinate and upload. \"wall s\" is the method's whole run, "
              "starting the engine (Ray, in simulation) included.", "", "## Verdict", ""]
    lines += _verdict(runs, stats, ref_label, target)
    failed = [r for r in runs if r["status"] != "ok"]
    if failed:
        lines += ["", "## Failed runs", ""]
        lines += [f"- {r['label']}: {r['error']}" for r in failed]
    lines += ["", "DQ uploads quantized raw training samples to the server: use it on trusted "
              "networks only; it is not a privacy mechanism.", ""]
    env = results.get("environment") or {}
    if results.get("command") or env:
        commit = env.get("git_commit", "")
        reused = [r["label"] for r in runs if r.get("reused")]
        modified = env.get("git_modified") or []
        lines += [
            "Run: " + (f"`{results['command']}`" if results.get("command") else "")
            + (f"; total wall time {results['total_wall_s']:.0f} s"
               if results.get("total_wall_s") else "")
            + (f"; {env['cpus']} CPU cores" if env.get("cpus") else "")
            + (f", load average {env['load_average']:.1f} at the start"
               if env.get("load_average") is not None else "")
            + (f"; commit {commit[:10]}" if commit else "")
            + (f" with {len(modified)} modified file(s)" if modified else "")
            + (f"; reused from an earlier invocation (`--resume`): {', '.join(reused)}"
               if reused else "") + ".", ""]
    return "\n".join(lines)


def _verdict(runs: list[Mapping[str, Any]], stats: list[Mapping[str, Any]], ref_label: str,
             target: float) -> list[str]:
    by_label = {s["label"]: s for s in stats}
    ref = by_label.get(ref_label)
    tpct = _pct(target)
    out: list[str] = []
    if ref is None or ref["status"] != "ok":
        return [f"- {ref_label} did not run successfully; no ratios to it can be given."]
    if ref["rounds_to_target"] is None:
        out.append(f"- **{ref_label} did not reach {tpct}** in {ref['rounds']} rounds (best "
                   f"{_pct(ref['best_accuracy'])}, {fmt_bytes(ref['total_up_bytes'])} uplink); "
                   "no byte ratio to it can be given.")
        winners = [s for s in stats if s["status"] == "ok" and s["rounds_to_target"] is not None]
        if winners:
            out.append("- Reached the target: " + ", ".join(
                f"{s['label']} ({fmt_bytes(s['up_bytes_to_target'])})" for s in winners) + ".")
        return out
    base = max(1, int(ref["up_bytes_to_target"]))
    out.append(f"- {ref_label} reached {tpct} at round {ref['rounds_to_target']} with "
               f"{fmt_bytes(ref['up_bytes_to_target'])} of uplink.")
    quant = [(r, by_label[r["label"]]) for r in runs
             if r["label"] != ref_label and r["status"] == "ok" and _is_quantized_gradient(r)]
    reached_q = [(r, s) for r, s in quant if s["up_bytes_to_target"] is not None]
    if reached_q:
        r, s = min(reached_q, key=lambda rs: rs[1]["up_bytes_to_target"])
        ratio = s["up_bytes_to_target"] / base
        out.append(f"- Best quantized-gradient baseline to reach {tpct}: {r['label']} with "
                   f"{fmt_bytes(s['up_bytes_to_target'])}: {ref_label} used "
                   + (f"{_fmt_ratio(ratio)} fewer uplink bytes." if ratio >= 1 else
                      f"more uplink bytes ({r['label']} needed only {_fmt_ratio(ratio)} of "
                      f"{ref_label}'s)."))
    elif quant:
        least = min(quant, key=lambda rs: rs[1]["total_up_bytes"])
        out.append(f"- No quantized-gradient baseline reached {tpct} in these rounds, so the "
                   f"ratio to the best of them is a lower bound: at least "
                   f"{_fmt_ratio(least[1]['total_up_bytes'] / base)} ({least[0]['label']} "
                   f"sent {fmt_bytes(least[1]['total_up_bytes'])} without reaching {tpct}; "
                   "the others sent more). More rounds would tell the real ratio.")
    losers = [(r["label"], by_label[r["label"]]) for r in runs
              if r["label"] != ref_label and r["status"] == "ok"
              and by_label[r["label"]]["up_bytes_to_target"] is not None
              and by_label[r["label"]]["up_bytes_to_target"] <= base]
    if losers:
        out.append(f"- **{ref_label} does not win against "
                   + ", ".join(f"{lbl} ({fmt_bytes(s['up_bytes_to_target'])}, "
                               f"{_fmt_ratio(s['up_bytes_to_target'] / base)})"
                               for lbl, s in losers)
                   + f"**: they reached {tpct} with no more uplink bytes than {ref_label}.")
    elif any(s["rounds_to_target"] is not None for lbl, s in by_label.items()
             if lbl != ref_label and s["status"] == "ok"):
        out.append(f"- Every other method that reached {tpct} needed more uplink bytes than "
                   f"{ref_label}.")
    else:
        out.append(f"- No other method reached {tpct} within the rounds.")
    missed = [(r["label"], by_label[r["label"]]) for r in runs
              if r["label"] != ref_label and r["status"] == "ok"
              and by_label[r["label"]]["rounds_to_target"] is None]
    if missed:
        out.append(f"- Did not reach {tpct} within the rounds: "
                   + ", ".join(f"{lbl} (best {_pct(s['best_accuracy'])})" for lbl, s in missed)
                   + ".")
    faster = [lbl for lbl, s in by_label.items() if lbl != ref_label and s["status"] == "ok"
              and s["rounds_to_target"] is not None
              and s["rounds_to_target"] < ref["rounds_to_target"]]
    if faster:
        out.append(f"- Fewer rounds than {ref_label} to reach {tpct}: {', '.join(faster)}.")
    return out


# ---------------------------------------------------------------------------- writing


def write_reports(results: Mapping[str, Any], out_dir: str | os.PathLike[str]) -> dict[str, Path]:
    """Write ``results.json``, ``results.csv``, ``summary.md`` and the PNG plots.

    Returns
    -------
    dict
        ``name -> path`` of every written file.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / "results.json", "csv": out / "results.csv",
             "summary": out / "summary.md"}
    data = dict(results)
    data["summaries"] = run_summaries(results)
    tmp = paths["json"].with_suffix(".json.tmp")  # atomic: a kill never leaves half a file
    tmp.write_text(json.dumps(_jsonable(data), indent=1))
    os.replace(tmp, paths["json"])
    write_csv(results, paths["csv"])
    paths["summary"].write_text(summary_markdown(results))
    paths.update(write_plots(results, out))
    return paths


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, Mapping):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars
        return _jsonable(obj.item())
    return obj


def write_csv(results: Mapping[str, Any], path: Path) -> Path:
    """One row per method and round: :data:`CSV_COLUMNS`, then the methods' own metrics."""
    extras = sorted({k for rec in results["runs"] for row in rec["history"] for k in row}
                    - set(CSV_COLUMNS))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=[*CSV_COLUMNS, *extras], restval="")
        writer.writeheader()
        for rec in results["runs"]:
            for row in rec["history"]:
                writer.writerow({"label": rec["label"], "method": rec["method"], **row})
    return path


def write_plots(results: Mapping[str, Any], out: Path) -> dict[str, Path]:
    """Accuracy against cumulative uplink bytes (log axis) and against rounds (PNG, Agg)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    runs = [r for r in results["runs"] if r["status"] == "ok" and r["history"]]
    target = float(results["target_accuracy"])
    p = results["preset"]
    title = f"{p['name']}: {p['dataset']}, {p['model']}, {p['num_clients']} clients, " \
            f"{p['partition']}"
    cmap = plt.get_cmap("tab10")
    styles = ["-", "--", "-.", ":"]
    paths = {}
    for name, xkey, xlabel, logx in (
        ("accuracy_vs_uplink", "cum_up_bytes", "cumulative uplink bytes (all clients)", True),
        ("accuracy_vs_rounds", "round", "server round", False),
    ):
        fig, ax = plt.subplots(figsize=(8.5, 5.0), dpi=110)
        for i, rec in enumerate(runs):
            rows = [r for r in rec["history"] if not logx or float(r[xkey]) > 0]
            if not rows:
                continue
            is_ref = rec["label"] == REFERENCE
            ax.plot([float(r[xkey]) for r in rows], [100 * float(r["accuracy"]) for r in rows],
                    label=rec["label"], color="black" if is_ref else cmap(i % 10),
                    linestyle="-" if is_ref else styles[i % len(styles)],
                    linewidth=2.6 if is_ref else 1.4, zorder=3 if is_ref else 2)
        ax.axhline(100 * target, color="grey", linewidth=0.8, linestyle=":",
                   label=f"target {_pct(target)}")
        if logx:
            ax.set_xscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("test accuracy (%)")
        ax.set_title(title, fontsize=10)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5))
        fig.tight_layout()
        path = out / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        paths[name] = path
    return paths


def load_results(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read ``results.json`` (a file or the folder holding it)."""
    p = Path(path)
    if p.is_dir():
        p = p / "results.json"
    if not p.is_file():
        raise FileNotFoundError(f"no results.json at {p}")
    data = json.loads(p.read_text())
    if data.get("format") != RESULTS_FORMAT:
        raise ValueError(f"{p} is not a dq-flower compare result (format "
                         f"{data.get('format')!r})")
    return data

