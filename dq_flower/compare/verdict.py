"""The verdict of ``summary.md``: who reached the target with the fewest bytes, who was faster.

A function of the runs' statistics (:func:`dq_flower.compare.summary.run_summaries`) alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from dq_flower.compare.fmt import fmt_bytes, fmt_ratio, fmt_seconds, is_failed, pct
from dq_flower.compare.links import links_of
from dq_flower.harness.method_registry import family_of

__all__ = ["verdict_lines", "verdict_extras"]


def _is_quantized_gradient(rec: Mapping[str, Any]) -> bool:
    return (family_of(str(rec["family"])).payload_unit == "coord"
            and rec["config"].get("codec") not in ("identity", None))


def _least_uplink(pairs: Sequence[tuple[Any, Mapping[str, Any]]]
                  ) -> tuple[Any, Mapping[str, Any], bool]:
    """Of ``(run, stats)`` pairs, the fewest bytes to the target, True (else in all, False)."""
    reached = [(x, s) for x, s in pairs if s["up_bytes_to_target"] is not None]
    if reached:
        x, s = min(reached, key=lambda xs: xs[1]["up_bytes_to_target"])
        return x, s, True
    x, s = min(pairs, key=lambda xs: xs[1]["total_up_bytes"])
    return x, s, False


def _competitor_line(pairs: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                     ref_label: str, base: int, tpct: str, quantized: bool) -> list[str]:
    """The verdict line on the ``(run, stats)`` of ``pairs`` with the fewest uplink bytes."""
    if not pairs:
        return []
    r, s, reached = _least_uplink(pairs)
    lbl = r["label"]
    if reached:
        ratio = s["up_bytes_to_target"] / base
        head = (f"- Best quantized-gradient baseline to reach {tpct}: " if quantized else
                f"- **Strongest competitor overall** (fewest uplink bytes to {tpct} of every "
                "other method): ")
        return [head + f"{lbl} with {fmt_bytes(s['up_bytes_to_target'])}: {ref_label} used "
                + (f"{fmt_ratio(ratio)} fewer uplink bytes." if ratio >= 1 else
                   f"more {'uplink bytes ' if quantized else ''}({lbl} needed only "
                   f"{fmt_ratio(ratio)} of {ref_label}'s).")]
    if quantized:
        return [f"- No quantized-gradient baseline reached {tpct} in these rounds, so the "
                f"ratio to the best of them is a lower bound: at least "
                f"{fmt_ratio(s['total_up_bytes'] / base)} ({lbl} "
                f"sent {fmt_bytes(s['total_up_bytes'])} without reaching {tpct}"
                + ("; the others sent more" if len(pairs) > 1 else "")
                + "). More rounds would tell the real ratio."]
    return [f"- **Strongest competitor overall**: no other method reached {tpct}; "
            f"{ref_label} used at least {fmt_ratio(s['total_up_bytes'] / base)} fewer "
            f"uplink bytes than any of them ({lbl} sent the least, "
            f"{fmt_bytes(s['total_up_bytes'])})."]


def verdict_lines(runs: Sequence[Mapping[str, Any]], stats: Sequence[Mapping[str, Any]],
                  ref_label: str, target: float) -> list[str]:
    """The verdict's lines on the reference's bytes to ``target`` against every other run."""
    by_label = {s["label"]: s for s in stats}
    ref = by_label.get(ref_label)
    tpct = pct(target)
    if ref is None or ref["status"] != "ok":
        return [f"- {ref_label} did not run successfully; no ratios to it can be given."]
    if ref["rounds_to_target"] is None:
        return _reference_missed_lines(ref, ref_label, stats, tpct)
    base = max(1, int(ref["up_bytes_to_target"]))
    out = [f"- {ref_label} reached {tpct} at round {ref['rounds_to_target']} with "
           f"{fmt_bytes(ref['up_bytes_to_target'])} of uplink."]
    others = [(r, by_label[r["label"]]) for r in runs
              if r["label"] != ref_label and not is_failed(r)]
    quant = [(r, st) for r, st in others if _is_quantized_gradient(r)]
    out += _competitor_line(quant, ref_label, base, tpct, quantized=True)
    out += _competitor_line(others, ref_label, base, tpct, quantized=False)
    out += _others_lines(others, ref_label, ref["rounds_to_target"], base, tpct)
    return out


def _reference_missed_lines(ref: Mapping[str, Any], ref_label: str,
                            stats: Sequence[Mapping[str, Any]], tpct: str) -> list[str]:
    """The verdict when the reference did not reach the target: who did."""
    out = [f"- **{ref_label} did not reach {tpct}** in {ref['rounds']} rounds (best "
           f"{pct(ref['best_accuracy'])}, {fmt_bytes(ref['total_up_bytes'])} uplink); "
           "no byte ratio to it can be given."]
    winners = [s for s in stats if s["status"] == "ok" and s["rounds_to_target"] is not None]
    if winners:
        out.append("- Reached the target: " + ", ".join(
            f"{s['label']} ({fmt_bytes(s['up_bytes_to_target'])})" for s in winners) + ".")
    return out


def _others_lines(others: Sequence[tuple[Mapping[str, Any], Mapping[str, Any]]],
                  ref_label: str, ref_rounds: int, base: int, tpct: str) -> list[str]:
    """The verdict lines on the ``others`` that beat the reference, missed, or were faster."""
    out: list[str] = []
    losers = [(r["label"], s) for r, s in others
              if s["up_bytes_to_target"] is not None and s["up_bytes_to_target"] <= base]
    if losers:
        out.append(f"- **{ref_label} does not win against "
                   + ", ".join(f"{lbl} ({fmt_bytes(s['up_bytes_to_target'])}, "
                               f"{fmt_ratio(s['up_bytes_to_target'] / base)})"
                               for lbl, s in losers)
                   + f"**: they reached {tpct} with no more uplink bytes than {ref_label}.")
    elif any(s["rounds_to_target"] is not None for _, s in others):
        out.append(f"- Every other method that reached {tpct} needed more uplink bytes than "
                   f"{ref_label}.")
    else:
        out.append(f"- No other method reached {tpct} within the rounds.")
    missed = [(r["label"], s) for r, s in others if s["rounds_to_target"] is None]
    if missed:
        out.append(f"- Did not reach {tpct} within the rounds: "
                   + ", ".join(f"{lbl} (best {pct(s['best_accuracy'])})" for lbl, s in missed)
                   + ".")
    faster = [r["label"] for r, s in others
              if s["rounds_to_target"] is not None and s["rounds_to_target"] < ref_rounds]
    if faster:
        out.append(f"- Fewer rounds than {ref_label} to reach {tpct}: {', '.join(faster)}.")
    return out


def verdict_extras(results: Mapping[str, Any], stats: Sequence[Mapping[str, Any]]) -> list[str]:
    """Verdict lines on unstable runs and on the fastest method to the target per link."""
    out: list[str] = []
    unstable = [s for s in stats if s["status"] == "ok" and s.get("unstable")]
    if unstable:
        out.append("- **Unstable** (final accuracy more than 5 points below its best): "
                   + ", ".join(f"{s['label']} (final {pct(s['final_accuracy'])}, best "
                               f"{pct(s['best_accuracy'])})" for s in unstable) + ".")
    target = pct(float(results["target_accuracy"]))
    for link in links_of(results):
        reached = [(s["time_to_target"][link.name], s["label"]) for s in stats
                   if s["status"] == "ok" and s["time_to_target"].get(link.name) is not None]
        if reached:
            t, label = min(reached)
            out.append(f"- Fastest to {target} on {link.name}: {label} "
                       f"({fmt_seconds(t)} simulated).")
    return out
