"""Learning-rate tuning that cannot see the test set (``dq-flower tune``, ``compare --tune``).

Each point of a run's step-size grid runs ``rounds`` rounds trained on the training rows
minus a held-out ``validation-fraction`` and is scored on those rows. The best validation
accuracy wins (ties: fewer uplink bytes, then the earlier point); an axis whose best value
sits at its edge is extended (0.3 -> 1 -> 3, at most ``max_extensions`` times). The
record (grid, scores, choice) is kept in the preset's ``[tuning.<label>]``.
"""

from __future__ import annotations

import dataclasses
import math
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dq_flower.compare.grids import grid_points, step_axes
from dq_flower.compare.presets import Preset, tuned_split
from dq_flower.compare.run import PlannedRun, run_one
from dq_flower.harness.method_registry import family_of
from dq_flower.harness.methods import validate_run_config

__all__ = ["TuneSettings", "tune_plan", "tune_runs", "apply_tuning", "choose", "extend_axes"]

TUNE_ENGINES = ("inprocess", "simulation")


def _check_int(value: Any, low: int, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name}: must be an integer >= {low}, got {value!r}")


@dataclass(frozen=True)
class TuneSettings:
    """How tuning runs (the ``--tune-*`` and ``--validation-fraction`` flags).

    ``epoch_rounds`` (default ``rounds``) is the horizon of the methods that train a whole
    local epoch per round; ``share`` holds ``(label, source)`` pairs of runs that take
    another run's tuned step sizes (``--tune-share fedavg-qsgd2=fedavg``).
    """

    def rounds_for(self, plan: PlannedRun) -> int:
        """The tuning horizon of ``plan`` (at most its own rounds)."""
        epochs = (family_of(plan.family).epoch_rounds
                  or int(plan.resolved.get("local-epochs", 0) or 0) > 0)
        rounds = self.epoch_rounds if epochs and self.epoch_rounds else self.rounds
        return min(rounds, int(plan.run_config["num-server-rounds"]))

    def matches(self, record: Mapping[str, Any], plan: PlannedRun) -> bool:
        """Whether ``record``, an earlier search of ``plan`` (not shared), ran under these."""
        return (not record.get("shared-from")
                and record.get("rounds") == self.rounds_for(plan)
                and record.get("validation-fraction") == self.validation_fraction
                and record.get("engine") == self.engine
                and int(record.get("extensions", 0)) <= self.max_extensions
                and all(record.get(k, v) == v for k, v in tuned_split(plan.run_config).items())
                and bool(record.get("choice")))

    rounds: int = 10  # of every grid point, at most the run's own
    validation_fraction: float = 0.2
    engine: str = "inprocess"  # or simulation
    max_extensions: int = 2  # 0 keeps the grid as it is
    epoch_rounds: int | None = None
    share: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        for label, source in self.share:
            if not label or not source or label == source:
                raise ValueError(f"tune-share: expected LABEL=SOURCE with two different "
                                 f"labels, got {label}={source}")
        if self.epoch_rounds is not None:
            _check_int(self.epoch_rounds, 1, "tune-epoch-rounds")
        _check_int(self.max_extensions, 0, "tune-extensions")
        _check_int(self.rounds, 1, "tune-rounds")
        if not 0 < self.validation_fraction < 1:
            raise ValueError(f"validation-fraction: must be in (0, 1), got "
                             f"{self.validation_fraction!r}")
        if self.engine not in TUNE_ENGINES:
            raise ValueError(f"tune-engine: must be one of {TUNE_ENGINES}, got "
                             f"{self.engine!r}")


def choose(scores: Sequence[Mapping[str, Any]]) -> int | None:
    """Index of the best score (accuracy, fewer uplink bytes, first); ``None``: all failed."""
    ranked = [(-float(sc["accuracy"]), int(sc.get("up-bytes", 0)), i)
              for i, sc in enumerate(scores)
              if not sc.get("failed") and math.isfinite(float(sc.get("accuracy", math.nan)))]
    return min(ranked)[2] if ranked else None


def _trial(plan: PlannedRun, point: Mapping[str, float], rounds: int,
           fraction: float) -> PlannedRun:
    extra = {**point, "num-server-rounds": rounds, "validation-fraction": fraction,
             "checkpoint-dir": ""}
    return dataclasses.replace(plan, run_config={**plan.run_config, **extra},
                               knobs={**plan.knobs, **extra})


def tune_plan(plan: PlannedRun, settings: TuneSettings,
              report: Callable[[str], None] | None = None,
              num_cpus_per_client: float = 1.0) -> dict[str, Any] | None:
    """Tune one planned run; its tuning record (``None``: it has no step sizes).

    The record: the settings and client split, ``axes``, ``scores`` (per grid point:
    ``knobs`` and ``accuracy`` and ``up-bytes``, or ``failed`` and ``error``) and
    ``choice`` (empty when every point failed).
    """
    axes = step_axes(plan.family, plan.resolved)
    if not axes:
        return None
    rounds = settings.rounds_for(plan)
    scores: list[dict[str, Any]] = []
    extensions = 0
    while True:
        done = [sc["knobs"] for sc in scores]
        todo = [p for p in grid_points(axes) if p not in done]
        scores += _score_points(plan, todo, rounds, settings, report, num_cpus_per_client)
        best = choose(scores)
        if best is None or extensions >= settings.max_extensions:
            break
        wider = extend_axes(axes, scores[best]["knobs"])
        if wider == axes:
            break
        axes, extensions = wider, extensions + 1
    # scores in the order of the final grid (every point of it was run)
    order = {tuple(sorted(p.items())): i for i, p in enumerate(grid_points(axes))}
    scores.sort(key=lambda sc: order[tuple(sorted(sc["knobs"].items()))])
    best = choose(scores)
    return {"method": plan.spec.method, "rounds": rounds,
            "validation-fraction": settings.validation_fraction, "engine": settings.engine,
            **tuned_split(plan.run_config),
            "axes": {k: list(v) for k, v in axes.items()}, "extensions": extensions,
            "scores": scores,
            "choice": dict(scores[best]["knobs"]) if best is not None else {}}


def _score_points(plan: PlannedRun, points: Sequence[Mapping[str, float]], rounds: int,
                  settings: TuneSettings, report: Callable[[str], None] | None,
                  num_cpus_per_client: float) -> list[dict[str, Any]]:
    """Run each grid point for ``rounds`` rounds; its validation score (or its failure)."""
    scores: list[dict[str, Any]] = []
    for i, point in enumerate(points, start=1):
        trial = _trial(plan, point, rounds, settings.validation_fraction)
        t0 = time.perf_counter()
        try:
            validate_run_config(trial.run_config)
            result = run_one(trial, settings.engine, lambda row: None, num_cpus_per_client,
                              False)
        except KeyboardInterrupt:
            raise
        except (Exception, SystemExit) as exc:  # noqa: BLE001  (a diverging point fails)
            scores.append({"knobs": dict(point), "failed": True,
                           "error": f"{type(exc).__name__}: {exc}",
                           "traceback": traceback.format_exc()})
            line = f"failed: {type(exc).__name__}: {exc}"
        else:
            last = result.history[-1]
            scores.append({"knobs": dict(point), "accuracy": float(last["accuracy"]),
                           "up-bytes": int(last["cum_up_bytes"]), "failed": False})
            line = f"validation accuracy {100 * float(last['accuracy']):.1f}%"
        if report is not None:
            knobs = ", ".join(f"{k} {v:g}" for k, v in point.items())
            report(f"[tune {plan.spec.label} {i}/{len(points)}] {knobs}: {line} "
                   f"({time.perf_counter() - t0:.1f} s, {rounds} round{'s' * (rounds != 1)})")
    return scores


def _next_value(value: float, values: Sequence[float], up: bool) -> float:
    """The next grid value beyond ``value``: 1-3-10 steps, else the edge's own ratio."""
    exponent = math.floor(math.log10(value))
    mantissa = round(value / 10.0 ** exponent, 6)
    if mantissa in (1.0, 3.0):
        step = {(1.0, True): 3.0, (3.0, True): 10 / 3, (1.0, False): 10 / 3,
                (3.0, False): 3.0}[(mantissa, up)]
    else:
        ordered = sorted(values)
        pair = ordered[-2:] if up else ordered[:2]
        step = pair[1] / pair[0] if len(pair) == 2 and pair[0] > 0 else 3.0
    return float(f"{value * step if up else value / step:.6g}")


def extend_axes(axes: Mapping[str, tuple[float, ...]],
                choice: Mapping[str, float]) -> dict[str, tuple[float, ...]]:
    """``axes`` with one more value beyond each edge ``choice`` sits on.

    Not for a one-value axis, nor below a value that is not positive.
    """
    out: dict[str, tuple[float, ...]] = {}
    for key, values in axes.items():
        ordered = sorted(values)
        value = choice.get(key)
        if len(ordered) > 1 and value == ordered[-1]:
            ordered.append(_next_value(ordered[-1], ordered, up=True))
        elif len(ordered) > 1 and value == ordered[0] and ordered[0] > 0:
            ordered.insert(0, _next_value(ordered[0], ordered, up=False))
        out[key] = tuple(ordered)
    return out


def tune_runs(plans: Sequence[PlannedRun], settings: TuneSettings,
              report: Callable[[str], None] | None = None,
              num_cpus_per_client: float = 1.0,
              earlier: Mapping[str, Mapping[str, Any]] | None = None,
              on_record: Callable[[dict[str, dict[str, Any]]], None] | None = None,
              ) -> dict[str, dict[str, Any]]:
    """``label -> tuning record`` of every run with step sizes.

    ``earlier`` records that :meth:`TuneSettings.matches` are kept; ``on_record`` gets the
    records after each new one.
    """
    out: dict[str, dict[str, Any]] = {}
    shared = dict(settings.share)
    labels = {p.spec.label for p in plans}
    for label, source in shared.items():
        if label not in labels or source not in labels:
            raise ValueError(f"tune-share {label}={source}: both must be among the runs "
                             f"({', '.join(sorted(labels))})")
    # the sources first, so that every run sharing their step sizes finds them
    for plan in sorted(plans, key=lambda p: p.spec.label in shared):
        old = (earlier or {}).get(plan.spec.label)
        if plan.spec.label in shared:
            source = shared[plan.spec.label]
            record = _shared_record(plan, out.get(source), source)
        elif old is not None and settings.matches(old, plan):
            out[plan.spec.label] = dict(old)
            if report is not None:
                report(f"[tune {plan.spec.label}] kept the earlier tuning: "
                       + ", ".join(f"{k} {v:g}" for k, v in old["choice"].items()))
            continue
        else:
            record = tune_plan(plan, settings, report, num_cpus_per_client)
        if record is not None:
            out[plan.spec.label] = record
            if on_record is not None:
                on_record(out)
    return out


def _shared_record(plan: PlannedRun, source: Mapping[str, Any] | None,
                   label: str) -> dict[str, Any] | None:
    """The record of a run that takes ``label``'s tuned step sizes (its own knobs only)."""
    axes = step_axes(plan.family, plan.resolved)
    if source is None or not axes:
        return None
    choice = {k: v for k, v in (source.get("choice") or {}).items() if k in axes}
    if set(choice) != set(axes):
        raise ValueError(f"tune-share {plan.spec.label}={label}: {label} tunes "
                         f"{', '.join(source.get('choice') or {}) or 'nothing'}, "
                         f"{plan.spec.label} needs {', '.join(axes)}")
    return {**{k: v for k, v in source.items() if k != "choice"}, "method": plan.spec.method,
            "shared-from": label, "choice": choice}


def apply_tuning(preset: Preset, records: Mapping[str, Mapping[str, Any]]) -> Preset:
    """``preset`` with the choices in ``[methods.<label>]`` and the records (no tracebacks)."""
    knobs = {k: dict(v) for k, v in preset.method_knobs.items()}
    kept: dict[str, dict[str, Any]] = {}
    for label, record in records.items():
        knobs.setdefault(label, {}).update(record.get("choice") or {})
        kept[label] = {**record, "scores": [{k: v for k, v in sc.items() if k != "traceback"}
                                            for sc in record.get("scores") or []]}
    return dataclasses.replace(preset, method_knobs=knobs, tuning={**preset.tuning, **kept})
