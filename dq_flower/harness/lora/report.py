"""Tables, bytes to a target perplexity and the plot of a text comparison's histories.

A history is :func:`dq_flower.harness.lora.compare.run_method`'s: round 0 (the base) and
each round's held-out perplexity, bytes and device FLOPs. The target is the LoRA baseline's
final perplexity; a method's bytes to it are its cumulative bytes up to the first round
whose perplexity is at or below it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["to_target", "summary_rows", "markdown_table", "device_table", "round_table",
           "plot_histories", "fmt_bytes"]


#: Line styles: DQ in black on top, upload-all as crosses (the two often share a point).
_STYLES: dict[str, dict[str, Any]] = {
    "dq": {"marker": "o", "color": "black", "markersize": 9, "zorder": 4},
    "dq-scored": {"marker": "s", "color": "tab:purple", "markersize": 6, "zorder": 6},
    "upload-all": {"marker": "x", "color": "tab:red", "markersize": 11, "mew": 2, "zorder": 5},
}


def fmt_bytes(n: float | None) -> str:
    """``1,234 B``, ``12.3 kB``, ``4.56 MB`` (powers of 1,000); ``not reached`` for None."""
    if n is None:
        return "not reached"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}" if n < 100 * scale else f"{n / scale:,.0f} {unit}"
    return f"{int(n):,} B"


def to_target(history: Sequence[Mapping[str, Any]], target: float) -> dict[str, Any] | None:
    """The first round at or below ``target``: its number and the cumulative bytes and FLOPs."""
    up = down = flops = 0.0
    for point in history:
        up += point["up_bytes"]
        down += point["down_bytes"]
        flops += max(point["device_flops"].values(), default=0.0)
        if point["perplexity"] <= target:
            return {"round": int(point["round"]), "up_bytes": up, "down_bytes": down,
                    "device_flops": flops}
    return None


def _totals(history: Sequence[Mapping[str, Any]]) -> tuple[float, float, float, int]:
    up = sum(p["up_bytes"] for p in history)
    down = sum(p["down_bytes"] for p in history)
    flops = sum(max(p["device_flops"].values(), default=0.0) for p in history)
    return up, down, flops, sum(p.get("server_steps", 0) for p in history)


def summary_rows(results: Mapping[str, Mapping[str, Any]], reference: str = "lora-fedavg"
                 ) -> tuple[float, list[dict[str, Any]]]:
    """The target (``reference``'s final perplexity) and one row per method."""
    target = float(results[reference]["history"][-1]["perplexity"])
    ref = to_target(results[reference]["history"], target)
    rows = []
    for method, out in results.items():
        history = out["history"]
        up, down, flops, steps = _totals(history)
        hit = to_target(history, target)
        ratio = (ref["up_bytes"] / hit["up_bytes"]
                 if hit is not None and ref is not None and hit["up_bytes"] > 0 else None)
        rows.append({"method": method, "base": history[0]["perplexity"],
                     "final": history[-1]["perplexity"], "rounds": len(history) - 1,
                     "up_bytes": up, "down_bytes": down, "device_flops": flops,
                     "server_steps": steps, "to_target": hit, "up_ratio": ratio})
    return target, rows


def markdown_table(results: Mapping[str, Mapping[str, Any]], reference: str = "lora-fedavg"
                   ) -> list[str]:
    """The summary table in markdown: perplexity, bytes both ways, to the target, FLOPs."""
    target, rows = summary_rows(results, reference)
    lines = [f"Target: `{reference}`'s final held-out perplexity, {target:.3f}.", "",
             "| method | rounds | held-out perplexity (base -> final) | uplink | downlink | "
             "round at target | uplink to target | downlink to target | fewer uplink bytes "
             "than LoRA to target | training FLOPs per device | server steps |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        hit = r["to_target"]
        ratio = "-" if r["up_ratio"] is None else f"{r['up_ratio']:,.1f}x"
        lines.append(
            f"| {r['method']} | {r['rounds']} | {r['base']:.2f} -> {r['final']:.3f} | "
            f"{fmt_bytes(r['up_bytes'])} | {fmt_bytes(r['down_bytes'])} | "
            f"{hit['round'] if hit else '-'} | {fmt_bytes(hit['up_bytes'] if hit else None)} | "
            f"{fmt_bytes(hit['down_bytes'] if hit else None)} | "
            f"{ratio} | "
            f"{r['device_flops'] / 1e9:,.1f} GFLOP | {r['server_steps']:,} |")
    return lines


def device_table(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Final held-out perplexity per device and method (the base's in the first row)."""
    first = next(iter(results.values()))["history"]
    names = [k[len("perplexity-"):] for k in first[0] if k.startswith("perplexity-")]
    lines = ["| method | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names),
             "| base (round 0) | " + " | ".join(f"{first[0]['perplexity-' + n]:.2f}"
                                               for n in names) + " |"]
    for method, out in results.items():
        last = out["history"][-1]
        lines.append(f"| {method} | " + " | ".join(f"{last['perplexity-' + n]:.3f}"
                                                    for n in names) + " |")
    return lines


def round_table(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """Every round of every method: perplexity, the round's bytes, cumulative uplink."""
    lines = ["| method | round | held-out perplexity | uplink | downlink | cumulative uplink "
             "| training FLOPs per device |", "|---|---:|---:|---:|---:|---:|---:|"]
    for method, out in results.items():
        total = 0
        for p in out["history"][1:]:
            total += p["up_bytes"]
            lines.append(f"| {method} | {p['round']} | {p['perplexity']:.3f} | "
                         f"{fmt_bytes(p['up_bytes'])} | {fmt_bytes(p['down_bytes'])} | "
                         f"{fmt_bytes(total)} | "
                         f"{max(p['device_flops'].values(), default=0.0) / 1e9:,.2f} GFLOP |")
    return lines


def plot_histories(results: Mapping[str, Mapping[str, Any]], path: str,
                   reference: str = "lora-fedavg", title: str = "") -> None:
    """Held-out perplexity against cumulative uplink bytes (log scale), one line a method."""
    import matplotlib  # loaded only where a plot is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the backend is chosen

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for method, out in results.items():
        xs, ys, up = [], [], 0
        for p in out["history"][1:]:
            up += p["up_bytes"]
            xs.append(max(up, 1))
            ys.append(p["perplexity"])
        style = _STYLES.get(method, {"marker": "o"})
        ax.plot(xs, ys, label=method, **style)
    if reference in results:
        target = results[reference]["history"][-1]["perplexity"]
        ax.axhline(target, color="grey", linestyle=":", label=f"{reference} final")
    base = next(iter(results.values()))["history"][0]["perplexity"]
    ax.axhline(base, color="black", linewidth=0.8, linestyle="--", label="pretrained base")
    ax.set_xscale("log")
    ax.set_xlabel("cumulative uplink bytes (every message counted)")
    ax.set_ylabel("held-out perplexity")
    ax.set_title(title or "held-out perplexity against uplink bytes")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
