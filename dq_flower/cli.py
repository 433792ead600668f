"""The ``dq-flower`` command.

Subcommands
-----------
``compare``
    Run a list of methods on one scenario (a preset from ``simulations/``, with flags that
    override it) and write ``results.json``, ``results.csv``, ``summary.md`` and plots.
``report``
    Redraw ``summary.md`` and the plots of an output folder from its ``results.json``.
``deploy``
    Mounted when :mod:`dq_flower.deploy.cli` is importable: it must provide
    ``add_deploy_parser(subparsers)`` that adds its parser(s) and sets ``func`` (a callable
    ``func(args) -> int``) with ``set_defaults``.

Errors the user can fix (unknown preset or method, a bad flag or knob value, missing data
files) end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import textwrap
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["main", "build_parser"]

PROG = "dq-flower"
EXIT_USAGE = 2
EXIT_FAILED_RUNS = 1


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be an integer >= 1, got {text!r}")
    return value


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None


def _float_in(lo: float, hi: float | None, lo_open: bool = True):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        bad_lo = value <= lo if lo_open else value < lo
        if value != value or bad_lo or (hi is not None and value > hi):
            span = f"({lo}, {hi}]" if hi is not None else f"> {lo}"
            raise argparse.ArgumentTypeError(f"must be in {span}, got {text!r}")
        return value

    return parse


def _methods_arg(text: str) -> tuple[str, ...]:
    names = tuple(m.strip() for m in text.split(",") if m.strip())
    if not names:
        raise argparse.ArgumentTypeError("expected a comma-separated list of method names")
    return names


def _add_compare(sub: Any) -> None:
    p = sub.add_parser(
        "compare",
        help="run several methods on one scenario; write results, summary and plots",
        description=textwrap.fill(
            "Run a list of methods on one scenario with the same data, model, partition, "
            "clients, rounds and seed, in Flower's simulation engine (default) or in-process. "
            "Writes results.json, results.csv (per method and round), summary.md (D, d, "
            "uplink bits, final accuracy, rounds and uplink bytes to the target accuracy, "
            "ratio to DQ) and PNG plots to --out. Flags override the preset's values. "
            "DQ uploads quantized raw samples: use it on trusted networks only.", 79),
        epilog=(
            "examples:\n"
            "  dq-flower compare --preset digits-mlp\n"
            "  dq-flower compare --preset digits-mlp --methods dq,fedavg,qsgd --rounds 10 "
            "--engine inprocess\n"
            "  dq-flower compare --preset fmnist-wide-cnn --rounds 30 --set dq.budget=128\n"
            "  dq-flower compare --preset digits-mlp --partition dirichlet --alpha 0.1 "
            "--set local-steps=5\n"
            "  dq-flower compare --list-presets"),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--preset", default="digits-mlp", metavar="NAME|FILE",
                   help="scenario: a preset name from simulations/ (digits-mlp, fmnist-cnn, "
                        "fmnist-wide-cnn, cifar10-resnet, ...) or a path to a .toml file "
                        "(default: %(default)s)")
    p.add_argument("--list-presets", action="store_true",
                   help="list the presets and the registered methods, then exit")
    p.add_argument("--methods", type=_methods_arg, metavar="M1,M2,...",
                   help="comma-separated methods (registered names, the preset's variants, "
                        "or 'all'); default: the preset's list")
    p.add_argument("--dataset", metavar="NAME",
                   help="data set: digits, fmnist, cifar10 or npz:<path> (default: the "
                        "preset's)")
    p.add_argument("--model", metavar="NAME",
                   help="model: logreg, mlp, cnn, wide-cnn, resnet20 or resnet18 (default: the "
                        "preset's)")
    p.add_argument("--rounds", type=_positive_int, metavar="N",
                   help="server rounds of every method (>= 1; a method's own "
                        "num-server-rounds, from the preset or --set, takes precedence)")
    p.add_argument("--num-clients", type=_positive_int, metavar="N",
                   help="simulated clients, one data partition each (>= 1)")
    p.add_argument("--partition", choices=("iid", "dirichlet", "pathological"),
                   help="how the training set is split among the clients")
    p.add_argument("--alpha", type=_float_in(0.0, None), metavar="A",
                   help="Dirichlet concentration for --partition dirichlet (> 0; smaller is "
                        "more skewed, e.g. 0.1)")
    p.add_argument("--fraction-train", type=_float_in(0.0, 1.0), metavar="F",
                   help="fraction of the clients sampled each round, in (0, 1]")
    p.add_argument("--target-accuracy", type=_float_in(0.0, 1.0), metavar="T",
                   help="test accuracy (a fraction, e.g. 0.85) whose cost in rounds and uplink "
                        "bytes the summary compares")
    p.add_argument("--seed", type=_int, metavar="S",
                   help="root of every random choice; the same for every method")
    p.add_argument("--data-dir", metavar="DIR",
                   help="folder of the data files (fmnist: IDX files, default "
                        "/usr/share/datasets/fashion-mnist; cifar10: the folder holding "
                        "cifar-10-batches-py)")
    p.add_argument("--out", metavar="DIR",
                   help="output folder (default: results/<preset>); files in it are replaced")
    p.add_argument("--engine", choices=("simulation", "inprocess"), default="simulation",
                   help="'simulation': Flower's simulation engine (Ray), one simulation per "
                        "method; 'inprocess': an in-process grid without Ray (fast, for tests "
                        "and quick looks) (default: %(default)s)")
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="set a method knob, e.g. --set bits=3 (every method that knows the key) "
                        "or --set dq.budget=128 (one method); repeatable")
    p.add_argument("--num-cpus-per-client", type=_float_in(0.0, None), default=1.0,
                   metavar="C", help="Ray CPUs per simulated client (default: %(default)s)")
    p.add_argument("--num-gpus-per-client", type=_float_in(0.0, None, lo_open=False),
                   default=0.0, metavar="G",
                   help="Ray GPUs per simulated client, e.g. 0.1 to let 10 clients share one "
                        "GPU; with 0 the clients train on the CPU while the server uses a GPU "
                        "when one is visible (default: %(default)s)")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished methods of an earlier results.json in --out whose "
                        "engine and run config are identical; run only the others")
    p.add_argument("--quiet", action="store_true",
                   help="print one line per method instead of one per round")
    p.add_argument("--verbose", action="store_true", help="keep Flower's own log output")
    p.set_defaults(func=cmd_compare)


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="redraw summary.md and the plots from results.json",
                       description="Rewrite summary.md, results.csv and the PNG plots of a "
                                   "compare output folder from its results.json (optionally "
                                   "with another target accuracy), without rerunning.")
    p.add_argument("folder", metavar="DIR", help="output folder of dq-flower compare")
    p.add_argument("--target-accuracy", type=_float_in(0.0, 1.0), metavar="T",
                   help="report the cost of reaching this accuracy instead")
    p.set_defaults(func=cmd_report)


def build_parser() -> argparse.ArgumentParser:
    """The ``dq-flower`` argument parser (subcommands ``compare``, ``report``, ``deploy``)."""
    parser = _Parser(prog=PROG, description="dq_flower: data quantization for "
                     "communication-efficient training in Flower, with byte-exact baselines.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_compare(sub)
    _add_report(sub)
    try:
        from dq_flower.deploy.cli import add_deploy_parser  # written in the deployment issue
    except ModuleNotFoundError as exc:  # only a missing deploy package is expected
        if exc.name not in ("dq_flower.deploy", "dq_flower.deploy.cli"):
            raise
        add_deploy_parser = None
    if add_deploy_parser is not None:
        add_deploy_parser(sub)
    return parser


def _version() -> str:
    from dq_flower import __version__

    return __version__


def _fail(message: str) -> int:
    print(f"{PROG}: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def _list_presets() -> int:
    from dq_flower.compare.presets import load_preset, preset_names
    from dq_flower.harness.methods import method_names

    print("presets (simulations/*.toml):")
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


def cmd_compare(args: argparse.Namespace) -> int:
    """``dq-flower compare``."""
    if args.list_presets:
        return _list_presets()
    from dq_flower import compare
    from dq_flower.compare.presets import load_preset

    try:
        preset = load_preset(args.preset).with_overrides(
            methods=args.methods, dataset=args.dataset, model=args.model, rounds=args.rounds,
            num_clients=args.num_clients, partition=args.partition, dirichlet_alpha=args.alpha,
            fraction_train=args.fraction_train, target_accuracy=args.target_accuracy,
            seed=args.seed, data_dir=args.data_dir)
        sets = compare.parse_set(args.sets)
        plans = compare.plan_runs(preset, sets)
        d, n_train = compare.check_data(preset)
    except FileNotFoundError as exc:
        return _fail(f"{exc} On the command line: --data-dir DIR.")
    except ValueError as exc:
        return _fail(str(exc))
    out = Path(args.out) if args.out else Path("results") / preset.name
    if out.exists() and not out.is_dir():
        return _fail(f"--out {out}: exists and is not a folder")
    print(f"{PROG} compare: preset {preset.name}: {preset.dataset} (d = {d}, {n_train} "
          f"training samples), model {preset.model}, {preset.num_clients} clients, "
          f"{preset.partition} partition"
          + (f" (alpha {preset.dirichlet_alpha:g})" if preset.partition == "dirichlet" else "")
          + f", {preset.rounds} rounds, seed {preset.seed}, engine {args.engine}")
    print(f"methods: {', '.join(p.spec.label for p in plans)}; target accuracy "
          f"{100 * preset.target_accuracy:.1f}%; output {out}/")
    progress = compare.ConsoleProgress(rounds=not args.quiet)
    t0 = time.perf_counter()
    try:
        results = compare.run_comparison(
            preset, out, sets=sets, engine=args.engine, progress=progress, plans=plans,
            num_cpus_per_client=args.num_cpus_per_client,
            num_gpus_per_client=args.num_gpus_per_client, verbose=args.verbose,
            resume=args.resume,
            command=shlex.join([PROG, *args.argv]))
    except KeyboardInterrupt:
        print(f"\n{PROG}: interrupted; the finished methods' results are in {out}/",
              file=sys.stderr)
        return 130
    except (ValueError, OSError) as exc:  # e.g. --out names a file
        return _fail(str(exc))
    wall = time.perf_counter() - t0
    print()
    print((out / "summary.md").read_text())
    print(f"total wall time {wall:.1f} s ({wall / 60:.1f} min)")
    print("written:")
    for name in ("results.json", "results.csv", "summary.md", "accuracy_vs_uplink.png",
                 "accuracy_vs_rounds.png"):
        print(f"  {out / name}")
    failed = compare.failed_runs(results)
    for rec in failed:
        print(f"{PROG}: {rec['label']} failed: {compare.error_line(rec)}", file=sys.stderr)
    if failed and len(failed) == len(results["runs"]):
        print(f"{PROG}: error: every method failed (see summary.md and results.json)",
              file=sys.stderr)
        return EXIT_FAILED_RUNS
    if failed:
        print(f"{PROG}: {len(failed)} of {len(results['runs'])} methods failed (see "
              f"summary.md); the other methods' results are in {out}/", file=sys.stderr)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``dq-flower report``."""
    from dq_flower import compare

    try:
        results = compare.load_results(args.folder)
    except (ValueError, FileNotFoundError) as exc:
        return _fail(str(exc))
    if args.target_accuracy is not None:
        results["target_accuracy"] = args.target_accuracy
    folder = Path(args.folder)
    folder = folder if folder.is_dir() else folder.parent
    paths = compare.write_reports(results, folder)
    print(paths["summary"].read_text())
    for path in paths.values():
        print(f"  {path}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = build_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    args.argv = argv
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
