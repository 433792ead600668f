"""Per-run statistics and the ``summary.md`` text: scenario, table, sections, verdict.

Everything here is a function of the content of ``results.json`` alone, so
``dq-flower report DIR`` rewrites the summary without rerunning anything.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dq_flower.codecs import coder_for, names
from dq_flower.compare.fmt import (
    fmt_bytes,
    fmt_ratio,
    fmt_value,
    is_failed,
    pct,
    time_cell,
)
from dq_flower.compare.grids import describe_axes, step_axes
from dq_flower.compare.links import cumulative_times, links_of, time_to_target
from dq_flower.compare.verdict import verdict_extras, verdict_lines
from dq_flower.compare.work import device_section, device_verdict
from dq_flower.dq.config import auto_bits
from dq_flower.harness.method_registry import family_of

__all__ = ["REFERENCE", "UNSTABLE_DROP", "coder_of_run", "is_failed", "failed_runs",
           "error_line", "run_summaries", "summary_markdown", "fmt_bytes", "time_table",
           "step_size_lines", "verdict_extras"]

#: The method every other one is compared with (ratios of uplink bytes to the target).
REFERENCE = "dq"
#: A run whose final accuracy is more than this below its best is marked unstable.
UNSTABLE_DROP = 0.05


def failed_runs(results: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The failed run records of ``results`` (see :func:`is_failed`), in run order."""
    return [rec for rec in results["runs"] if is_failed(rec)]


def error_line(record: Mapping[str, Any], limit: int = 300) -> str:
    """A failed run's error on one line, at most ``limit`` characters (the JSON keeps all)."""
    text = " ".join(str(record.get("error") or "unknown error").split())
    return text if len(text) <= limit else text[:limit - 3].rstrip() + "..."


def _first_reaching(history: list[Mapping[str, Any]], target: float) -> Mapping[str, Any] | None:
    return next((row for row in history if float(row["accuracy"]) >= target), None)


def _sum(rows: Sequence[Mapping[str, Any]], key: str) -> float:
    return sum(float(r.get(key, 0) or 0) for r in rows)


def _per(bits: float, count: float) -> float:
    return bits / count if count else float("nan")


def _uplink_unit(record: Mapping[str, Any]) -> dict[str, Any]:
    """Uplink payload size per unit: per sample for DQ, per coordinate for weights/gradients."""
    rows = [r for r in record.get("history") or [] if int(r["round"]) >= 1]
    D, d = int(record["num_params"]), int(record["data_dim"])
    bits = _sum(rows, "up_payload_bits")
    kind = family_of(str(record["family"])).payload_unit

    def replies(rows: Sequence[Mapping[str, Any]]) -> float:
        # the payload bits include replies the norm screen then rejected: divide by every
        # reply they count (older records lack "coded_replies": their accepted replies)
        return sum(float(r.get("coded_replies", r.get("replies", 0)) or 0) for r in rows)

    if kind == "sample":
        grad_rows = [r for r in rows if r.get("gradient_round") == 1]
        data_rows = [r for r in rows if r.get("gradient_round") != 1]
        per = _per(_sum(data_rows, "up_payload_bits"), _sum(data_rows, "selected"))
        configured = record["config"].get("bits")
        if configured == 0:  # auto: the strategy's choice for d (every harness sample
            configured = auto_bits(d)  # under 64 coordinates is a flat table's)
        unit = {"unit": "sample", "bits": per, "bits_per_coord": _per(per, d),
                "configured_bits": configured}
        if grad_rows:  # upload-mode gradient or auto; every decoded reply's bits count
            unit["gradient_rounds"] = len(grad_rows)
            unit["gradient_bits_per_coord"] = _per(_sum(grad_rows, "up_payload_bits"),
                                                   replies(grad_rows) * D)
        return unit
    if kind == "coord" and bits:
        per = _per(bits, replies(rows) * D)
        unit = {"unit": "coord", "bits": per, "bits_per_coord": per, "configured_bits": None}
        if all("up_raw_payload_bits" in r for r in rows):
            unit["raw_bits_per_coord"] = _per(_sum(rows, "up_raw_payload_bits"),
                                              replies(rows) * D)
        return unit
    # FedAvg: float32 weights; the payload bits are not reported, the wire bytes are
    cfg = record["config"]
    n = int(cfg.get("num-partitions", 1))
    count = len(rows) * max(1, math.ceil(float(cfg.get("fraction-train", 1.0)) * n))
    per = _per(8 * sum(float(r["up_bytes"]) for r in rows), count * D)
    return {"unit": "coord (wire)", "bits": per, "bits_per_coord": per,
            "configured_bits": None}


def coder_of_run(record: Mapping[str, Any]) -> str:
    """The lossless coder a run's uploads used.

    ``entropy-coder`` (or ``entropy=`` in its ``codec-params``); ``none`` for Flower's
    FedAvg, whose float32 weights Flower sends as they are, and for older results.
    """
    cfg = record.get("config") or {}
    if not family_of(str(record.get("family", "gradient"))).coded:
        return "none"
    for part in str(cfg.get("codec-params") or "").split(","):
        key, _, value = part.partition("=")
        if key.strip() == "entropy":
            return value.strip()
    coder = str(cfg.get("entropy-coder") or "none")
    codec = cfg.get("codec")
    return coder_for(codec, coder) if codec in names() else coder


def run_summaries(results: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per-run statistics: accuracy, cost to the target, totals, coder, ``unstable``.

    ``time_to_target`` and ``total_time`` are simulated seconds per link of ``results``.
    """
    target = float(results["target_accuracy"])
    links = links_of(results)
    out = []
    for rec in results["runs"]:
        hist = rec.get("history") or []
        failed = is_failed(rec)
        if failed or not hist:
            out.append({"label": rec["label"], "status": "failed" if failed else "ok",
                        "final_accuracy": float("nan"), "best_accuracy": float("nan"),
                        "rounds_to_target": None, "up_bytes_to_target": None,
                        "down_bytes_to_target": None, "total_up_bytes": 0,
                        "total_down_bytes": 0, "rounds": 0, "unstable": False,
                        "time_to_target": {}, "total_time": {},
                        "wall_s": float(rec.get("wall_s") or 0.0),
                        **({"error": error_line(rec)} if failed else {})})
            continue
        hit = _first_reaching(hist, target)
        high = float(results.get("high_target_accuracy") or 0.0)
        high_hit = _first_reaching(hist, high) if high else None
        last = hist[-1]
        best = max((float(r["accuracy"]) for r in hist if not math.isnan(float(r["accuracy"]))),
                   default=float("nan"))  # rounds eval-every skipped carry nan
        totals = {link.name: cumulative_times(hist, link) for link in links}
        out.append({
            "label": rec["label"], "status": "ok",
            "final_accuracy": float(last["accuracy"]),
            "best_accuracy": best,
            "unstable": best - float(last["accuracy"]) > UNSTABLE_DROP,
            "rounds_to_target": int(hit["round"]) if hit is not None else None,
            "up_bytes_to_target": int(hit["cum_up_bytes"]) if hit is not None else None,
            "down_bytes_to_target": int(hit["cum_down_bytes"]) if hit is not None else None,
            "total_up_bytes": int(last["cum_up_bytes"]),
            "total_down_bytes": int(last["cum_down_bytes"]),
            "rounds": int(last["round"]),
            "ended_early": bool(last.get("ended_early")),
            "up_bytes_to_high": int(high_hit["cum_up_bytes"]) if high_hit is not None else None,
            "wall_s": float(rec.get("wall_s", last.get("wall_s", 0.0))),
            "uplink": _uplink_unit(rec),
            "coder": coder_of_run(rec),
            "time_to_target": {link.name: time_to_target(hist, link, target)
                               for link in links},
            "total_time": {name: (t[-1] if t else None) for name, t in totals.items()},
        })
    return out


def summary_markdown(results: Mapping[str, Any]) -> str:
    """The ``summary.md`` text: scenario, per-method table, plain verdict."""
    target = float(results["target_accuracy"])
    runs = results["runs"]
    stats = run_summaries(results)
    high = float(results.get("high_target_accuracy") or 0.0)
    by_label = {s["label"]: s for s in stats}
    ref_label = REFERENCE if REFERENCE in by_label else (runs[0]["label"] if runs else "")
    lines = _scenario_lines(results, target)
    lines += _table_lines(runs, stats, ref_label, by_label.get(ref_label), target, high)
    lines += _notes_lines(ref_label, stats)
    lines += time_table(results, stats)
    lines += device_section(results)
    lines += step_size_lines(results)
    lines += ["## Verdict", ""]
    lines += verdict_lines(runs, stats, ref_label, target)
    lines += verdict_extras(results, stats)
    lines += device_verdict(results)
    lines += _failed_lines(runs)
    lines += ["", "DQ uploads quantized raw training samples to the server: use it on trusted "
              "networks only; it is not a privacy mechanism.", ""]
    lines += _run_lines(results)
    return "\n".join(lines)


def _scenario_lines(results: Mapping[str, Any], target: float) -> list[str]:
    p = results["preset"]
    ok = [r for r in results["runs"] if not is_failed(r)]
    lines = [f"# Comparison: {p['name']}", ""]
    if p.get("description"):
        lines += [p["description"], ""]
    dims = sorted({(r["num_params"], r["data_dim"]) for r in ok})
    dim_text = "; ".join(f"D = {D:,} model parameters, d = {d:,} data coordinates, "
                         f"D/d = {D / d:,.0f}" for D, d in dims if d)
    return lines + [
        f"Scenario: data set `{p['dataset']}`, model `{p['model']}`, {p['num_clients']} "
        f"clients, `{p['partition']}` partition"
        + (f" (alpha {p['dirichlet_alpha']})" if p["partition"] == "dirichlet" else "")
        + f", fraction-train {p['fraction_train']}, {p['rounds']} rounds, seed {p['seed']}, "
        f"engine `{results['engine']}`. Target test accuracy: {pct(target)}.",
        "",
        (dim_text + "." if dim_text else ""),
        "",
    ]


def _notes_lines(ref_label: str, stats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The paragraph under the table that says what its columns mean."""
    return ["", f"\"uplink vs {ref_label}\" is the method's uplink bytes to reach the target "
            f"divided by {ref_label}'s: above 1x, {ref_label} needed fewer bytes; "
            "\"> Nx (not reached)\" divides all the bytes the method sent without reaching "
            "it. Bytes are measured from the serialized Flower messages; \"uplink payload\" "
            "counts the codec's exact bits (side information included) per uploaded sample "
            "or per model coordinate and upload, as sent (after the lossless \"coder\", "
            "applied per message where it shrinks it). "
            + ("\"ended early\": DQ's adaptive schedule stopped asking for samples and "
               "its training reached a plateau, so the run stopped before its last round. "
               if any(st.get("ended_early") for st in stats) else "")
            + "\"unstable\": the final accuracy is "
            f"more than {100 * UNSTABLE_DROP:.0f} points below the best. \"wall s\" is the "
            "method's whole run, starting the engine (Ray, in simulation) included.", ""]


def _failed_lines(runs: Sequence[Mapping[str, Any]]) -> list[str]:
    failed = [r for r in runs if is_failed(r)]
    if not failed:
        return []
    lines = ["", "## Failed runs", ""]
    lines += [f"- {r['label']}: {error_line(r)}" for r in failed]
    if len(failed) == len(runs):
        lines += ["", "Every method failed: there is nothing to compare."]
    return lines


def _run_lines(results: Mapping[str, Any]) -> list[str]:
    """The closing line on the invocation: command, wall time, machine, commit, reuse."""
    env = results.get("environment") or {}
    if not (results.get("command") or env):
        return []
    commit = env.get("git_commit", "")
    reused = [r["label"] for r in results["runs"] if r.get("reused")]
    modified = env.get("git_modified") or []
    return [
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
    raw = u.get("raw_bits_per_coord")
    if raw is not None and raw == raw and abs(raw - u["bits"]) > 1e-9 * max(1.0, raw):
        return f"{u['bits']:.3g} b/coord ({raw:.3g} before coding)"
    return f"{u['bits']:.3g} b/coord"


def _or_not_reached(value: Any, fmt: Callable[[Any], str] = str) -> str:
    return "not reached" if value is None else fmt(value)


def _ratio_cell(stats: Mapping[str, Any], ref: Mapping[str, Any] | None) -> str:
    """Uplink bytes to target of a method divided by the reference's (DQ's)."""
    if ref is None or ref.get("up_bytes_to_target") is None or stats["status"] != "ok":
        return "n/a"
    base = max(1, int(ref["up_bytes_to_target"]))
    if stats["up_bytes_to_target"] is not None:
        return fmt_ratio(stats["up_bytes_to_target"] / base)
    return f"> {fmt_ratio(stats['total_up_bytes'] / base)} (not reached)"


def _row(rec: Mapping[str, Any], s: Mapping[str, Any], ref: Mapping[str, Any] | None,
         high: float) -> str:
    if s["status"] != "ok" or "uplink" not in s:  # failed, or no round recorded
        what = "failed" if s["status"] != "ok" else "no rounds"
        return (f"| {rec['label']} | - | - | - | - | - | {what} | - | - | - | n/a | - "
                + ("| - " if high else "") + f"| - | {s['wall_s']:.1f} |")
    final = pct(s["final_accuracy"]) + (" **unstable**" if s.get("unstable") else "")
    return (
        f"| {rec['label']} | {rec['num_params']:,} | {rec['data_dim']:,} | "
        f"{_fmt_unit(s['uplink'])} | {s.get('coder', 'none')} | {s['rounds']}"
        f"{' (ended early)' if s.get('ended_early') else ''} | {final} | "
        f"{pct(s['best_accuracy'])} | "
        f"{_or_not_reached(s['rounds_to_target'])} | "
        f"{_or_not_reached(s['up_bytes_to_target'], fmt_bytes)} | "
        f"{_ratio_cell(s, ref)} | "
        + (f"{_or_not_reached(s.get('up_bytes_to_high'), fmt_bytes)} | " if high else "")
        + f"{fmt_bytes(s['total_up_bytes'])} | "
        f"{fmt_bytes(s['total_down_bytes'])} | {s['wall_s']:.1f} |")


def _table_lines(runs: Sequence[Mapping[str, Any]], stats: Sequence[Mapping[str, Any]],
                 ref_label: str, ref: Mapping[str, Any] | None, target: float,
                 high: float) -> list[str]:
    """The per-method table; ratios of uplink bytes to ``ref``, ``ref_label``'s statistics."""
    return [
        f"| method | D | d | uplink payload | coder | rounds | final acc | best acc "
        f"| rounds to {pct(target)} "
        f"| uplink to {pct(target)} | uplink vs {ref_label} "
        + (f"| uplink to {pct(high)} " if high else "")
        + "| total uplink | total downlink | wall s |",
        "|---|---:|---:|---|---|---:|---:|---:|---:|---:|---:|" + ("---:|" if high else "")
        + "---:|---:|---:|",
        *(_row(rec, s, ref, high) for rec, s in zip(runs, stats, strict=True))]


def time_table(results: Mapping[str, Any], stats: Sequence[Mapping[str, Any]]) -> list[str]:
    """The "Time on links" table: simulated time to the target per link profile."""
    links = links_of(results)
    ok = [s for s in stats if s["status"] == "ok"]
    if not links or not any(s["total_time"].get(link.name) is not None
                            for s in ok for link in links):
        return []
    target = pct(float(results["target_accuracy"]))
    lines = ["## Time on links", "",
             f"Simulated time to reach {target} on each link (nothing sleeps): per round, "
             "the slowest sampled client's measured compute plus its measured downlink and "
             "uplink bytes over the link, one round trip of latency, and the server's "
             "measured compute; \"not reached\" gives the time of the whole run. Links: "
             + "; ".join(link.describe() for link in links) + ".", "",
             "| method | " + " | ".join(link.name for link in links) + " |",
             "|---|" + "---:|" * len(links)]
    for s in stats:
        cells = ["-" if s["status"] != "ok" else time_cell(s["time_to_target"].get(link.name),
                                                           s["total_time"].get(link.name))
                 for link in links]
        lines.append(f"| {s['label']} | " + " | ".join(cells) + " |")
    return lines + [""]


def _tuning_of(results: Mapping[str, Any], label: str) -> Mapping[str, Any] | None:
    record = ((results.get("preset") or {}).get("tuning") or {}).get(label)
    return record if isinstance(record, Mapping) else None


def _split_text(scenario: Mapping[str, Any]) -> str:
    """``iid`` or ``dirichlet (alpha 0.1)``; empty when ``scenario`` does not say."""
    partition = scenario.get("partition")
    if not partition:
        return ""
    if partition == "dirichlet":
        alpha = scenario.get("dirichlet-alpha", scenario.get("dirichlet_alpha"))
        return f"dirichlet (alpha {fmt_value(alpha)})"
    return str(partition)


def step_size_lines(results: Mapping[str, Any]) -> list[str]:
    """The "Step sizes" section: what each run used and, if tuned, the grid and scores."""
    lines = ["## Step sizes", ""]
    tuned_any = False
    for rec in results["runs"]:
        config = rec.get("config") or {}
        axes = step_axes(str(rec.get("family")), config)
        if not axes:
            continue
        record = _tuning_of(results, rec["label"])
        used = ", ".join(f"{k} {fmt_value(config.get(k))}" for k in axes)
        if record is None:
            lines.append(f"- {rec['label']}: {used} (default, not tuned)")
            continue
        tuned_any = True
        choice = record.get("choice") or {}
        if record.get("shared-from"):
            lines.append(f"- {rec['label']}: {used}, as tuned for {record['shared-from']} "
                         "(the same local training; not tuned separately)")
            continue
        grid = record.get("axes") or {k: [] for k in choice}
        scores = ", ".join(
            "failed" if sc.get("failed") else pct(float(sc.get("accuracy", float("nan"))))
            for sc in record.get("scores") or [])
        text = f"- {rec['label']}: {used}, tuned over {describe_axes(grid)}"
        text += f" (validation accuracy {scores})" if scores else ""
        edge = [k for k, v in choice.items() if grid.get(k) and len(grid[k]) > 1
                and v in (grid[k][0], grid[k][-1])]
        if record.get("extensions"):
            text += (f"; the grid was extended {record['extensions']} time(s) beyond the "
                     "edge the best point sat on")
        if edge:
            text += "; at the edge of the grid (" + ", ".join(edge) + ")"
        tuned_on, used_on = _split_text(record), _split_text(results.get("preset") or {})
        if tuned_on and tuned_on != used_on:
            text += f"; **tuned on the {tuned_on} split, used unchanged on this run's {used_on}**"
        mismatch = [k for k, v in choice.items() if config.get(k) != v]
        if mismatch:
            text += "; **the tuned " + ", ".join(
                f"{k} {fmt_value(choice[k])}" for k in mismatch) + " was overridden**"
        lines.append(text)
    if len(lines) == 2:
        return []
    if tuned_any:  # the first run's tuning that is not None
        some = next(t for t in (_tuning_of(results, r["label"]) for r in results["runs"])
                    if t is not None)
        held = pct(float(some.get("validation-fraction", 0)))
        lines += ["", f"Tuning ran each grid point for {some.get('rounds')} rounds, trained "
                  f"on the training rows minus a held-out {held} of them (drawn by the "
                  "seed) and scored on those held-out rows: the test "
                  "set was never read. The choice is the best final validation accuracy; "
                  "ties go to fewer uplink bytes. While the best point sat at the edge of "
                  "an axis, the axis was extended by one value beyond it (at most twice by "
                  "default)."]
    return lines + [""]
