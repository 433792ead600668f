"""``dq-flower compare``, ``tune`` and ``report``: parsed arguments in, exit status out.

Errors the user can fix end with one line on stderr and status 2.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from dq_flower import compare
from dq_flower.cli_common import EXIT_FAILED_RUNS, PROG, fail
from dq_flower.compare.devices import parse_device, parse_server
from dq_flower.compare.fmt import fmt_value, pct
from dq_flower.compare.grids import describe_axes
from dq_flower.compare.links import LinkProfile, parse_links
from dq_flower.compare.presets import PRESET_DIR, load_preset, preset_names
from dq_flower.compare.run import check_engine, quiet_flower
from dq_flower.compare.tune import TuneSettings, apply_tuning, tune_runs
from dq_flower.compare.work import attach_devices
from dq_flower.harness.methods import method_names

__all__ = ["cmd_compare", "cmd_tune", "cmd_report"]


def _list_presets() -> int:
    print(f"presets ({PRESET_DIR}):")
    for name in preset_names():
        try:
            pr = load_preset(name)
        except ValueError as exc:
            print(f"  {name:<18} (invalid: {exc})")
            continue
        print(f"  {name:<18} {pr.dataset}/{pr.model}, {pr.num_clients} clients, {pr.rounds} "
              f"rounds, target {pr.target_accuracy:g}: {pr.description}")
    print("methods: " + ", ".join(method_names()))
    return 0


def _scenario(args: argparse.Namespace):
    """The preset with the flags, ``--set`` items, planned runs, ``d`` and training rows."""
    preset = load_preset(args.preset).with_overrides(
        methods=args.methods, dataset=args.dataset, model=args.model, rounds=args.rounds,
        num_clients=args.num_clients, partition=args.partition, dirichlet_alpha=args.alpha,
        fraction_train=args.fraction_train, target_accuracy=args.target_accuracy,
        seed=args.seed, data_dir=args.data_dir)
    sets = compare.parse_set(args.sets)
    plans = compare.plan_runs(preset, sets)
    d, n_train = compare.check_data(preset)
    subset = int(plans[0].resolved.get("train-rows", 0) or 0) if plans else 0
    return preset, sets, plans, d, min(n_train, subset) if subset else n_train


def _tune_settings(args: argparse.Namespace, preset: Any):
    rounds = args.tune_rounds or max(1, preset.rounds // 5)
    return TuneSettings(rounds=rounds, validation_fraction=args.validation_fraction,
                        engine=args.tune_engine, max_extensions=args.tune_extensions,
                        epoch_rounds=args.tune_epoch_rounds,
                        share=tuple(tuple(s.split("=", 1)) for s in args.tune_share))


def _tune(args: argparse.Namespace, preset: Any, sets: Any, plans: Any, quiet: bool,
          save: Any = None):
    """Tune, print the choices; the tuned preset and its plans (``save`` after each method)."""
    settings = _tune_settings(args, preset)
    print(f"tuning step sizes: {settings.rounds} rounds per grid point, "
          f"{pct(settings.validation_fraction)} of the training rows held out for scoring "
          f"(the test set is not used), engine {settings.engine}")
    with quiet_flower(False):
        records = tune_runs(plans, settings, report=None if quiet else print,
                            num_cpus_per_client=getattr(args, "num_cpus_per_client", 1.0),
                            earlier=preset.tuning, on_record=save)
    for label, rec in records.items():
        choice = ", ".join(f"{k} {fmt_value(v)}" for k, v in rec["choice"].items())
        best = next((s for s in rec["scores"] if s["knobs"] == rec["choice"]), None)
        score = f"validation accuracy {pct(best['accuracy'])}; " if best else ""
        if rec.get("shared-from"):
            print(f"  {label}: {choice} (as tuned for {rec['shared-from']})")
            continue
        print(f"  {label}: {choice or 'every grid point failed: defaults kept'} ({score}"
              f"tuned over {describe_axes(rec['axes'])})")
    tuned = apply_tuning(preset, records)
    return tuned, compare.plan_runs(tuned, sets)


def cmd_compare(args: argparse.Namespace) -> int:
    """``dq-flower compare``: run several methods on one scenario.

    Run a list of methods on one scenario with the same data, model, partition, clients,
    rounds and seed, in Flower's simulation engine (default) or in-process. Writes
    results.json, results.csv (per method and round), summary.md (D, d, uplink bits, final
    accuracy, rounds and uplink bytes to the target accuracy, ratio to DQ) and PNG plots to
    --out. Flags override the preset's values. DQ uploads quantized raw samples: use it on
    trusted networks only.
    """
    if args.list_presets:
        return _list_presets()
    try:
        preset, sets, plans, d, n_train = _scenario(args)
        links = parse_links(args.links)
        devices = [parse_device(d) for d in args.devices]
        server_device = parse_server(args.server_device)
        check_engine(args.engine, args.ray_address)
        if args.tune:
            _tune_settings(args, preset)  # validates the tuning flags before any run
    except FileNotFoundError as exc:
        return fail(f"{exc} On the command line: --data-dir DIR.")
    except ValueError as exc:
        return fail(str(exc))
    out = Path(args.out) if args.out else Path("results") / preset.name
    if out.exists() and not out.is_dir():
        return fail(f"--out {out}: exists and is not a folder")
    _print_scenario(preset, plans, d, n_train, args.engine, out)
    t0 = time.perf_counter()
    try:
        if args.tune:
            preset, plans = _tune(args, preset, sets, plans, args.quiet)
        progress = compare.ConsoleProgress(rounds=not args.quiet)
        results = compare.run_comparison(
            preset, out, sets=sets, engine=args.engine, progress=progress, plans=plans,
            num_cpus_per_client=args.num_cpus_per_client,
            num_gpus_per_client=args.num_gpus_per_client, verbose=args.verbose,
            resume=args.resume, links=links, ray_address=args.ray_address,
            devices=devices, server_device=server_device,
            command=shlex.join([PROG, *args.argv]))
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; the finished methods' results are in {out}/",
              file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # e.g. --out names a file
        return fail(str(exc))
    return _report_outcome(results, out, links, time.perf_counter() - t0)


def _print_scenario(preset: Any, plans: Any, d: int, n_train: int, engine: str,
                    out: Path) -> None:
    print(f"{PROG} compare: preset {preset.name}: {preset.dataset} (d = {d}, {n_train} "
          f"training samples), model {preset.model}, {preset.num_clients} clients, "
          f"{preset.partition} partition"
          + (f" (alpha {preset.dirichlet_alpha:g})" if preset.partition == "dirichlet" else "")
          + f", {preset.rounds} rounds, seed {preset.seed}, engine {engine}")
    print(f"methods: {', '.join(p.spec.label for p in plans)}; target accuracy "
          f"{100 * preset.target_accuracy:.1f}%; output {out}/")


def _report_outcome(results: dict[str, Any], out: Path, links: list[LinkProfile],
                    wall: float) -> int:
    print()
    print((out / "summary.md").read_text())
    print(f"total wall time {wall:.1f} s ({wall / 60:.1f} min)")
    print("written:")
    names = ["results.json", "results.csv", "summary.md", "accuracy_vs_uplink.png",
             "accuracy_vs_rounds.png", *(f"accuracy_vs_time_{x.name}.png" for x in links)]
    for name in names:
        if (out / name).is_file():
            print(f"  {out / name}")
    failed = compare.failed_runs(results)
    for rec in failed:
        print(f"{PROG}: {rec['label']} failed: {compare.error_line(rec)}", file=sys.stderr)
    if failed and len(failed) == len(results["runs"]):  # the last line names a cause
        print(f"{PROG}: error: every method failed (see summary.md and results.json); "
              f"{failed[0]['label']}: {compare.error_line(failed[0], limit=2000)}",
              file=sys.stderr)
        return EXIT_FAILED_RUNS
    if failed:
        print(f"{PROG}: {len(failed)} of {len(results['runs'])} methods failed (see "
              f"summary.md); the other methods' results are in {out}/", file=sys.stderr)
    return 0


def cmd_tune(args: argparse.Namespace) -> int:
    """``dq-flower tune``: write a preset with tuned step sizes.

    For every method of the scenario, run each point of its step-size grid (server lr;
    client-lr where it takes local steps or epochs; see README 'Comparing methods') for
    --tune-rounds rounds, trained on the training rows minus a held-out
    --validation-fraction and scored on the held-out rows (never the test set). Choose the
    best validation accuracy (ties: fewer uplink bytes) and write a preset TOML with the
    chosen values and the tuning record; dq-flower compare --preset FILE then runs it.
    """
    try:
        preset, sets, plans, d, n_train = _scenario(args)
        _tune_settings(args, preset)
    except FileNotFoundError as exc:
        return fail(f"{exc} On the command line: --data-dir DIR.")
    except ValueError as exc:
        return fail(str(exc))
    out = Path(args.out) if args.out else Path("results") / f"{preset.name}-tuned.toml"
    if out.is_dir():
        return fail(f"--out {out}: is a folder; give the .toml file to write")
    print(f"{PROG} tune: preset {preset.name}: {preset.dataset} (d = {d}, {n_train} training "
          f"samples), model {preset.model}, {preset.num_clients} clients; methods: "
          f"{', '.join(p.spec.label for p in plans)}")
    header = (f"written by: {shlex.join([PROG, *args.argv])}\n"
              "step sizes tuned on a validation split of the training rows (see "
              "[tuning.<method>]);\nrun it with: dq-flower compare --preset " + str(out))

    def save(records: Any) -> None:  # after each method: an interrupted tuning resumes
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(apply_tuning(preset, records).to_toml(header))

    try:
        tuned, _ = _tune(args, preset, sets, plans, args.quiet, save)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(tuned.to_toml(header))
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; nothing written", file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    print(f"written: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``dq-flower report``."""
    try:
        results = compare.load_results(args.folder)
        if args.links:
            results["links"] = [x.to_json() for x in parse_links(args.links)]
        if args.devices:
            attach_devices(results, [parse_device(d) for d in args.devices],
                           parse_server(args.server_device))
    except (ValueError, FileNotFoundError) as exc:
        return fail(str(exc))
    if args.target_accuracy is not None:
        results["target_accuracy"] = args.target_accuracy
    if args.high_target_accuracy is not None:
        results["high_target_accuracy"] = args.high_target_accuracy
    folder = Path(args.folder)
    folder = folder if folder.is_dir() else folder.parent
    paths = compare.write_reports(results, folder)
    print(paths["summary"].read_text())
    for path in paths.values():
        print(f"  {path}")
    return 0
