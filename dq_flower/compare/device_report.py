"""Time to the target per (device, link) pair: the summary's "Time on devices and links".

Needs ``workload``, ``devices``, ``server_device`` and ``links`` in ``results.json``
(:func:`attach_devices` adds the first three).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dq_flower.compare.devices import MEASURED, ComputeProfile
from dq_flower.compare.fmt import fmt_seconds, is_failed, pct, time_cell
from dq_flower.compare.links import LinkProfile, cumulative_times, links_of, time_to_target
from dq_flower.compare.work import Workload, profiled_history, workload_of

__all__ = ["PairTime", "pair_times", "device_link_table", "device_section", "device_verdict",
           "attach_devices"]


@dataclass(frozen=True)
class PairTime:
    """One method's simulated seconds on one (device, link) pair (``None``: unknown)."""

    label: str
    to_target: float | None  # None: not reached
    total: float | None  # the whole run
    runs: bool = True  # whether the device can run the method at all


def pair_times(results: Mapping[str, Any], workload: Workload, device: ComputeProfile,
               server: ComputeProfile, link: LinkProfile) -> list[PairTime]:
    """Every successful run's time on ``device`` and ``link``, the server on ``server``."""
    target = float(results["target_accuracy"])
    out = []
    for rec in results["runs"]:
        if is_failed(rec) or not rec.get("history"):
            continue
        hist = profiled_history(rec, workload, device, server)
        if hist is None:
            out.append(PairTime(str(rec["label"]), None, None, runs=False))
            continue
        times = cumulative_times(hist, link)
        out.append(PairTime(str(rec["label"]), time_to_target(hist, link, target),
                            times[-1] if times else None))
    return out


def _fastest(times: Sequence[PairTime]) -> tuple[float, str] | None:
    """``(seconds, label)`` of the first run to reach the target (``None``: none did)."""
    return min(((t.to_target, t.label) for t in times if t.to_target is not None), default=None)


def _mflop(flops: float) -> str:
    mflop = flops / 1e6  # 22.9, 1,112.3; three significant digits below one (0.0192)
    return f"{mflop:,.1f}" if mflop >= 1 else f"{mflop:.3g}"


def device_link_table(results: Mapping[str, Any], workload: Workload,
                      devices: Sequence[ComputeProfile], server: ComputeProfile,
                      links: Sequence[LinkProfile]) -> list[str]:
    """The markdown table: a row per (device, link) pair, a column per method, the fastest."""
    target = pct(float(results["target_accuracy"]))
    labels = [str(r["label"]) for r in results["runs"]
              if not is_failed(r) and r.get("history")]
    if not labels:
        return []
    lines = [
        "## Time on devices and links", "",
        f"Simulated time to reach {target} with every client on the device and link of the "
        f"row and the server on {server.describe()}: each round's compute is the model's "
        f"FLOPs ({_mflop(workload.flops.forward)} MFLOP forward, "
        f"{_mflop(workload.flops.train)} MFLOP forward and backward per sample, "
        "counted with torch.utils.flop_counter) times the samples each side passes through "
        "the model, over the profile's FLOP/s; the bytes are the measured ones over the "
        "link. \"cannot train\": the device cannot run a backward pass, and the method's "
        "clients train; \"not reached\" gives the time of the whole run.", "",
        "| device | link | " + " | ".join(labels) + " | fastest |",
        "|---|---|" + "---:|" * len(labels) + "---|"]
    for device in devices:
        for link in links:
            times = pair_times(results, workload, device, server, link)
            by_label = {t.label: t for t in times}
            fastest = _fastest(times)
            lines.append(f"| {device.name} | {link.name} | "
                         + " | ".join(time_cell(by_label[x].to_target, by_label[x].total)
                                      if by_label[x].runs else "cannot train" for x in labels)
                         + f" | {fastest[1] if fastest else 'none reached'} |")
    lines += ["", "Profiles and their sources:", ""]
    for profile in [*devices, *([server] if server not in devices else [])]:
        lines.append(f"- {profile.describe()}: {profile.source}.")
    for link in links:
        lines.append(f"- {link.describe()}" + (f": {link.source}." if link.source else "."))
    return lines + [""]


def device_section(results: Mapping[str, Any]) -> list[str]:
    """:func:`device_link_table` from ``results``' own fields (``[]`` without them)."""
    profiles = _profiles(results)
    return device_link_table(results, *profiles) if profiles and profiles[3] else []


def _profiles(results: Mapping[str, Any]
              ) -> tuple[Workload, list[ComputeProfile], ComputeProfile, list[LinkProfile]] | None:
    if not results.get("workload") or not results.get("devices"):
        return None
    workload = Workload.from_json(results["workload"])
    devices = [ComputeProfile.from_json(d) for d in results["devices"]]
    server_data = results.get("server_device")
    server = ComputeProfile.from_json(server_data) if server_data else MEASURED
    return workload, devices, server, links_of(results)


def device_verdict(results: Mapping[str, Any]) -> list[str]:
    """Verdict lines: per device profile, the fastest method to the target on each link."""
    profiles = _profiles(results)
    if profiles is None:
        return []
    workload, devices, server, links = profiles
    target = pct(float(results["target_accuracy"]))
    out = []
    for device in devices:
        parts = []
        for link in links:
            fastest = _fastest(pair_times(results, workload, device, server, link))
            parts.append(f"{link.name} {fastest[1]} ({fmt_seconds(fastest[0])})"
                         if fastest else f"{link.name} none")
        if parts:
            out.append(f"- Fastest to {target} with every client on {device.name} (server "
                       f"on {server.name}): " + "; ".join(parts) + ".")
    return out


def _train_rows(results: Mapping[str, Any]) -> int:
    """The ``train-rows`` subset the runs trained on (0: all rows)."""
    for run in results.get("runs") or []:
        value = (run.get("config") or {}).get("train-rows")
        if isinstance(value, int) and value > 0:
            return value
    value = (results.get("preset") or {}).get("knobs", {}).get("train-rows", 0)
    return int(value) if isinstance(value, int) else 0


def attach_devices(results: dict[str, Any], devices: Sequence[ComputeProfile],
                   server: ComputeProfile, train_rows: int | None = None) -> None:
    """Give ``results`` the workload (of its preset, on ``train_rows``) and profiles."""
    rows = _train_rows(results) if train_rows is None else train_rows
    workload = workload_of(results["preset"], None, rows)
    results["workload"] = workload.to_json()
    results["devices"] = [d.to_json() for d in devices]
    results["server_device"] = server.to_json()
