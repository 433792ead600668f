"""The user-app zoo at full size: each app with Flower's FedAvg, DQ at its defaults and DQ's
``upload-all`` baseline.

Runs every app of ``tests/apps`` whose data is available (or those named by ``--apps``)
at its own size (nodes, rounds, fraction of nodes sampled per round) with each kind,
through Flower's simulation engine (Ray, the default) or the package's in-process grid,
and prints a Markdown table: each kind's final central accuracy (a regression app's
test loss, its ``METRIC``) and uplink bytes (``upload-all``: every node's rows sent once
at DQ's bits and coder, ``upload-schedule = "all"``), the uplink ratio FedAvg/DQ, DQ's downlink,
each kind's wall time, and the verdict "DQ within 2 points of FedAvg's final accuracy (or
above; a loss at most ``1 + TOLERANCE`` times FedAvg's) with at most a fifth of its
uplink" (or the share an app states, ``UPLINK_SHARE``). Writes ``table.md`` and
``results.json`` (every round's metric, uplink bytes by round and by node, bytes and wall
time) to ``--out``.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/user_apps.py [--engine simulation|inprocess]
        [--apps fmnist_cnn digits_skew_mlp tabular_mlp fmnist_partial ...] [--rounds N]
        [--kinds fedavg dq upload-all] [--out out/user_apps]
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import os
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
os.environ.setdefault("FLWR_HOME", tempfile.mkdtemp(prefix="flwr-home-"))
os.environ.setdefault("RAY_TMPDIR", tempfile.mkdtemp(prefix="ray-"))

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.apps.runner import KINDS, AppRun, dq_keeps_up, run_app  # noqa: E402

APPS = ("fmnist_cnn", "digits_skew_mlp", "tabular_mlp", "fmnist_partial", "wine_raw",
        "giant_node", "many_small", "cancer_raw", "diabetes_regression", "tiny_nodes",
        "hapt_cnn", "cancer_binary", "diabetes_raw", "load_forecast",
        "digits_frozen", "tab_embeddings", "hf_tutorial", "keras_images", "hapt_stream",
        "onehot_labels", "cancer_sigmoid", "wine_dummies", "cancer_batchnorm",
        "fmnist_autoencoder", "large_site", "sensor_glitch", "huber_prices",
        "long_waves", "clinic_columns")
MARGIN = 0.02
UPLINK_SHARE = 1 / 5


def verdict(app, fed: AppRun, dq: AppRun) -> bool:
    """DQ within ``MARGIN`` of FedAvg's final accuracy (or above; a loss within the app's
    tolerance), <= 1/5 of its uplink (or the app's own ``UPLINK_SHARE``)."""
    share = getattr(app, "UPLINK_SHARE", UPLINK_SHARE)
    return (dq_keeps_up(app, fed.final, dq.final, MARGIN)
            and dq.up_bytes <= share * fed.up_bytes)


def shown(run: AppRun) -> str:
    """A final accuracy as a percentage, another metric as its value and name."""
    return f"{run.final:.2%}" if run.metric == "accuracy" else f"{run.final:.3f} {run.metric}"


def table(rows: list[tuple[object, AppRun, AppRun, AppRun | None]]) -> str:
    """The Markdown table; the ``upload-all`` columns where every row has that run."""
    every = all(row[3] is not None for row in rows)
    lines = ["| app | FedAvg final acc | FedAvg uplink (B) | DQ final acc | DQ uplink (B) "
             + ("| upload-all final acc | upload-all uplink (B) " if every else "")
             + "| uplink FedAvg/DQ | DQ downlink (B) | wall FedAvg / DQ (s) "
             "| within 2 points and <= 1/5 uplink (or the app's share) |",
             "|---|---:|---:|---:|---:|" + ("---:|---:|" if every else "") + "---:|---:|---:|---|"]
    for app, fed, dq, everything in rows:
        ratio = fed.up_bytes / dq.up_bytes if dq.up_bytes else float("inf")
        baseline = (f"| {shown(everything)} | {everything.up_bytes:,} "
                    if every and everything is not None else "")
        lines.append(f"| {fed.app} | {shown(fed)} | {fed.up_bytes:,} | {shown(dq)} "
                     f"| {dq.up_bytes:,} {baseline}| {ratio:.1f}x | {dq.down_bytes:,} "
                     f"| {fed.wall_s:.1f} / {dq.wall_s:.1f} "
                     f"| {'yes' if verdict(app, fed, dq) else 'no'} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", choices=("simulation", "inprocess"), default="simulation")
    parser.add_argument("--apps", nargs="+", default=list(APPS), metavar="APP",
                        help=f"modules of tests/apps (default: {' '.join(APPS)})")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds for every app (default: each app's own ROUNDS)")
    parser.add_argument("--kinds", nargs="+", choices=KINDS, default=list(KINDS),
                        help="fedavg and dq always run; upload-all where named (default: all)")
    parser.add_argument("--out", type=Path, default=Path("out/user_apps"))
    args = parser.parse_args()

    import torch

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    rows, results = [], {}
    for name in (a.removesuffix(".py") for a in args.apps):
        app = importlib.import_module(f"tests.apps.{name}")
        if not app.available():
            print(f"skipping {name}: its data is not available", flush=True)
            continue
        runs = {}
        for kind in (k for k in KINDS if k in {"fedavg", "dq", *args.kinds}):
            runs[kind] = run_app(app, kind, args.rounds, engine=args.engine)
            r = runs[kind]
            print(f"{app.NAME} {kind}: final {shown(r)}, up {r.up_bytes:,} B, "
                  f"down {r.down_bytes:,} B, {r.wall_s:.1f} s", flush=True)
        rows.append((app, runs["fedavg"], runs["dq"], runs.get("upload-all")))
        results[app.NAME] = {
            "module": name, "nodes": app.NUM_NODES, "rounds": args.rounds or app.ROUNDS,
            "fraction_train": getattr(app, "FRACTION_TRAIN", 1.0), "engine": args.engine,
            "min_available_nodes": getattr(app, "MIN_AVAILABLE_NODES", None),
            "train_config": getattr(app, "TRAIN_CONFIG", None),
            "verdict": verdict(app, runs["fedavg"], runs["dq"]),
            **{kind: dataclasses.asdict(r) for kind, r in runs.items()}}
    md = table(rows)
    print("\n" + md)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "table.md").write_text(md)
    (args.out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {args.out / 'table.md'} and {args.out / 'results.json'}")


if __name__ == "__main__":
    main()
