"""The ``dq-flower`` command's parser: ``compare``, ``tune``, ``report`` and ``deploy``.

Errors the user can fix end with one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

from dq_flower import __version__
from dq_flower.cli_common import EXIT_FAILED_RUNS, EXIT_USAGE, PROG, fail
from dq_flower.compare import commands
from dq_flower.deploy.cli import add_deploy_parser
from dq_flower.extras import install_hint, missing_extra
from dq_flower.harness.tasks.data.partitions import PARTITION_SCHEMES

__all__ = ["main", "build_parser", "PROG", "EXIT_USAGE", "EXIT_FAILED_RUNS"]


class _Parser(argparse.ArgumentParser):
    """``ArgumentParser`` whose errors are one line (no usage block)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _share_arg(text: str) -> str:
    label, sep, source = text.partition("=")
    if not sep or not label.strip() or not source.strip():
        raise argparse.ArgumentTypeError(f"expected LABEL=SOURCE, got {text!r}")
    return f"{label.strip()}={source.strip()}"


def _int_type(lo: int | None = None, expected: str = "an integer") -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
        if lo is not None and value < lo:
            raise argparse.ArgumentTypeError(f"must be an integer >= {lo}, got {text!r}")
        return value

    return parse


_int, _int_at_least_0, _positive_int = _int_type(), _int_type(0), _int_type(1, "an integer >= 1")


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


def _add_scenario_flags(p: argparse.ArgumentParser) -> None:
    """The flags that define the scenario and the methods' knobs (compare and tune)."""
    p.add_argument("--methods", type=_methods_arg, metavar="M1,M2,...",
                   help="comma-separated methods (registered names, the preset's variants, "
                        "or 'all'); default: the preset's list")
    p.add_argument("--dataset", metavar="NAME",
                   help="data set: digits, fmnist, cifar10, hapt or npz:<path> (default: "
                        "the preset's)")
    p.add_argument("--model", metavar="NAME",
                   help="model: logreg, mlp, cnn, wide-cnn, cnn1d, resnet20 or resnet18 "
                        "(default: the preset's)")
    p.add_argument("--rounds", type=_positive_int, metavar="N",
                   help="server rounds of every method (>= 1; a method's own "
                        "num-server-rounds, from the preset or --set, takes precedence)")
    p.add_argument("--num-clients", type=_positive_int, metavar="N",
                   help="simulated clients, one data partition each (>= 1)")
    p.add_argument("--partition", choices=PARTITION_SCHEMES,
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
    p.add_argument("--set", dest="sets", action="append", default=[], metavar="KEY=VALUE",
                   help="set a method knob, e.g. --set bits=3 (every method that knows the key) "
                        "or --set dq.budget=128 (one method); repeatable")


def _add_tune_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tune-rounds", type=_positive_int, metavar="N",
                   help="rounds of every tuning run (default: a fifth of --rounds, at least "
                        "1; at most a method's own rounds)")
    p.add_argument("--validation-fraction", type=_float_in(0.0, 0.99), default=0.2,
                   metavar="F",
                   help="fraction of the TRAINING rows held out to score the tuning runs, "
                        "drawn by the seed; the test set is never read (default: "
                        "%(default)s)")
    p.add_argument("--tune-epoch-rounds", type=_positive_int, metavar="N",
                   help="rounds of the tuning runs of methods that train a whole local epoch "
                        "per round (fedavg, fedavg-*) (default: --tune-rounds)")
    p.add_argument("--tune-share", action="append", default=[], type=_share_arg,
                   metavar="LABEL=SOURCE",
                   help="run LABEL takes the step sizes tuned for run SOURCE instead of a "
                        "search of its own, e.g. fedavg-qsgd2=fedavg (the same local "
                        "training); repeatable")
    p.add_argument("--tune-extensions", type=_int_at_least_0, default=2, metavar="N",
                   help="extend an axis whose best value sits at the grid's edge by one more "
                        "value beyond it (0.3 -> 1 -> 3), at most N times (default: "
                        "%(default)s; 0: the grid as it is)")
    p.add_argument("--tune-engine", choices=("inprocess", "simulation"), default="inprocess",
                   help="engine of the tuning runs (default: %(default)s: the same strategies "
                        "and client code without Ray)")


def _add_link_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--link", dest="links", action="append", default=[], metavar="SPEC",
                   help="a network profile whose simulated time to the target the summary "
                        "reports: lte (10mbit/1mbit/50ms), wifi (50mbit/20mbit/10ms), "
                        "datacenter (10gbit/10gbit/0.1ms), the constrained nbiot, lorawan, "
                        "lorawan-sf12, iridium (frames with a payload limit; see the docs), "
                        "or name=down/up/latency, e.g. "
                        "sat=20mbit/2mbit/600ms (latency: the round trip); repeatable "
                        "(default: lte, wifi and datacenter)")


def _add_device_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", dest="devices", action="append", default=[], metavar="NAME",
                   help="a device profile whose time to the target per link the summary "
                        "reports: measured (this machine's times), mcu, rpi4, phone, "
                        "laptop-core, or name=GFLOPS; repeatable (default: no such table)")
    p.add_argument("--server-device", default="measured", metavar="NAME",
                   help="the server's profile for --device: measured, gpu, laptop-core or "
                        "name=GFLOPS (default: %(default)s)")


def _command_parser(sub: Any, name: str, help_text: str, command: Callable[..., int],
                    examples: Sequence[str]) -> argparse.ArgumentParser:
    """A subcommand's parser: its description ``command``'s docstring after the summary."""
    body = (inspect.getdoc(command) or "").split("\n\n", 1)[-1]
    description = " ".join(body.split())
    return sub.add_parser(name, help=help_text, description=textwrap.fill(description, 79),
                          epilog="examples:\n" + "\n".join(f"  {e}" for e in examples),
                          formatter_class=argparse.RawDescriptionHelpFormatter)


def _add_compare(sub: Any) -> None:
    p = _command_parser(
        sub, "compare", "run several methods on one scenario; write results, summary and plots",
        commands.cmd_compare,
        ["dq-flower compare --preset digits-mlp",
         "dq-flower compare --preset digits-mlp --methods dq,fedavg,qsgd --rounds 10 "
         "--engine inprocess",
         "dq-flower compare --preset fmnist-wide-cnn --rounds 30 --set dq.budget=128",
         "dq-flower compare --preset digits-mlp --partition dirichlet --alpha 0.1 "
         "--set local-steps=5",
         "dq-flower compare --preset digits-mlp --engine inprocess --tune --tune-rounds 10",
         "dq-flower compare --preset digits-mlp --link lte --link sat=20mbit/2mbit/600ms",
         "dq-flower compare --preset digits-mlp --ray-address 10.0.0.5:6379",
         "dq-flower compare --list-presets"])
    p.add_argument("--preset", default="digits-mlp", metavar="NAME|FILE",
                   help="scenario: a preset name (digits-mlp, fmnist-cnn, fmnist-wide-cnn, "
                        "cifar10-resnet, ...; --list-presets lists them) or a path to a "
                        ".toml file "
                        "(default: %(default)s)")
    p.add_argument("--list-presets", action="store_true",
                   help="list the presets and the registered methods, then exit")
    _add_scenario_flags(p)
    p.add_argument("--out", metavar="DIR",
                   help="output folder (default: results/<preset>); files in it are replaced")
    p.add_argument("--engine", choices=("simulation", "inprocess"), default="simulation",
                   help="'simulation': Flower's simulation engine (Ray), one simulation per "
                        "method; 'inprocess': an in-process grid without Ray (fast, for tests "
                        "and quick looks) (default: %(default)s)")
    p.add_argument("--num-cpus-per-client", type=_float_in(0.0, None), default=1.0,
                   metavar="C", help="Ray CPUs per simulated client (default: %(default)s)")
    p.add_argument("--num-gpus-per-client", type=_float_in(0.0, None, lo_open=False),
                   default=0.0, metavar="G",
                   help="Ray GPUs per simulated client, e.g. 0.1 to let 10 clients share one "
                        "GPU; with 0 the clients train on the CPU while the server uses a GPU "
                        "when one is visible (default: %(default)s)")
    p.add_argument("--ray-address", metavar="HOST:PORT",
                   help="with --engine simulation: join this running Ray cluster (its head's "
                        "address, as printed by 'ray start --head'; or auto) instead of "
                        "starting Ray here; the cluster's nodes run the simulated clients, "
                        "this process the server (default: $RAY_ADDRESS if set, else a Ray "
                        "on this machine)")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished methods of an earlier results.json in --out whose "
                        "engine and run config are identical; run only the others")
    p.add_argument("--quiet", action="store_true",
                   help="print one line per method instead of one per round")
    p.add_argument("--verbose", action="store_true", help="keep Flower's own log output")
    p.add_argument("--tune", action="store_true",
                   help="first tune every method's step sizes on a validation split of the "
                        "training rows (as dq-flower tune does), then compare with the chosen "
                        "values; the grids, scores and choices go into results.json and "
                        "summary.md")
    _add_tune_flags(p)
    _add_link_flag(p)
    _add_device_flags(p)
    p.set_defaults(func=commands.cmd_compare)


def _add_tune(sub: Any) -> None:
    p = _command_parser(
        sub, "tune", "tune each method's step sizes on a validation split; write a tuned preset",
        commands.cmd_tune,
        ["dq-flower tune --preset digits-mlp --tune-rounds 10 --out tuned.toml",
         "dq-flower compare --preset tuned.toml --engine inprocess"])
    p.add_argument("--preset", default="digits-mlp", metavar="NAME|FILE",
                   help="scenario: a preset name (see compare --list-presets) or a path to "
                        "a .toml file "
                        "(default: %(default)s)")
    _add_scenario_flags(p)
    _add_tune_flags(p)
    p.add_argument("--out", metavar="FILE",
                   help="the tuned preset to write (default: results/<preset>-tuned.toml)")
    p.add_argument("--num-cpus-per-client", type=_float_in(0.0, None), default=1.0,
                   metavar="C", help="Ray CPUs per simulated client with --tune-engine "
                                     "simulation (default: %(default)s)")
    p.add_argument("--quiet", action="store_true", help="print only the choices")
    p.set_defaults(func=commands.cmd_tune)


def _add_report(sub: Any) -> None:
    p = sub.add_parser("report", help="redraw summary.md and the plots from results.json",
                       description="Rewrite summary.md, results.csv and the PNG plots of a "
                                   "compare output folder from its results.json (optionally "
                                   "with another target accuracy), without rerunning.")
    p.add_argument("folder", metavar="DIR", help="output folder of dq-flower compare")
    p.add_argument("--target-accuracy", type=_float_in(0.0, 1.0), metavar="T",
                   help="report the cost of reaching this accuracy instead")
    p.add_argument("--high-target-accuracy", type=_float_in(0.0, 1.0), metavar="T",
                   help="also report the uplink bytes to this higher accuracy (0: none)")
    p.add_argument("--link", dest="links", action="append", default=[], metavar="SPEC",
                   help="report the simulated time on these link profiles instead (as "
                        "compare --link); repeatable")
    _add_device_flags(p)
    p.set_defaults(func=commands.cmd_report)


def build_parser() -> argparse.ArgumentParser:
    """The ``dq-flower`` argument parser: ``compare``, ``tune``, ``report``, ``deploy``."""
    parser = _Parser(prog=PROG, description="dq_flower: data quantization for "
                     "communication-efficient training in Flower, with byte-exact baselines.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    _add_compare(sub)
    _add_tune(sub)
    _add_report(sub)
    add_deploy_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; returns the exit status."""
    parser = build_parser()
    argv = list(argv) if argv is not None else sys.argv[1:]
    args = parser.parse_args(argv)
    args.argv = argv
    if getattr(args, "func", None) is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        if args.command in ("compare", "tune") and not getattr(args, "list_presets", False):
            for module in ("torch", "sklearn"):  # every run trains: fail before the first
                if importlib.util.find_spec(module) is None:
                    raise ModuleNotFoundError(f"No module named {module!r}", name=module)
        return int(args.func(args) or 0)
    except ModuleNotFoundError as exc:  # a client-only install: one line naming the extra
        extra = missing_extra(exc)
        if extra is None:
            raise
        return fail(f"{PROG} {args.command} needs the {extra!r} extra (no module named "
                    f"{exc.name!r} here); install it: {install_hint(extra)}")


if __name__ == "__main__":
    sys.exit(main())
