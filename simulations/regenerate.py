"""Regenerate every comparison table and plot that the README and the docs show.

    .venv/bin/python simulations/regenerate.py            # all experiments, in order
    .venv/bin/python simulations/regenerate.py --list     # what would run, and how
    .venv/bin/python simulations/regenerate.py digits-mlp digits-mlp-dirichlet
    .venv/bin/python simulations/regenerate.py --resume fmnist-wide-cnn  # after a kill

Each experiment is one ``dq-flower compare`` command (printed before it runs). Its output
folder is ``results/readme/<experiment>/``; the summary and the two plots are then copied to
``docs/results/<experiment>/``, which the documentation pages (``docs/experiments/``)
include as they are. Where README.md has a block between ``<!-- results:<experiment> -->``
and ``<!-- /results:<experiment> -->`` (the headline experiment), the summary's body (with
the uplink plot) replaces it; experiments without a block there are left to the docs. The
fmnist and cifar10 experiments need their data files (see docs/compare.md).
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
RESULTS = ROOT / "results" / "readme"
PUBLISHED = ROOT / "docs" / "results"
COPIED = ("summary.md", "accuracy_vs_uplink.png", "accuracy_vs_rounds.png")

#: experiment -> arguments of ``dq-flower compare`` (the README's numbers come from these).
EXPERIMENTS: dict[str, list[str]] = {
    # `make demo`: every method, embedded digits, IID, Flower's simulation engine
    "digits-mlp": ["--preset", "digits-mlp"],
    # the same on a strongly non-IID split
    "digits-mlp-dirichlet": ["--preset", "digits-mlp", "--partition", "dirichlet",
                             "--alpha", "0.1"],
    # DQ's upload modes (data, gradient, auto) on logistic regression, in-process
    "digits-upload-mode": ["--preset", "digits-upload-mode", "--engine", "inprocess"],
    # the large-D regime (D/d = 1,094), sized for 2 CPU cores (about 75 minutes): every
    # gradient baseline 150 rounds (one local step each), DQ 40 (it reaches 85% in fewer),
    # FedAvg 6 (a full local epoch per client and round); in-process engine (the same
    # strategies and client code as in simulation, without Ray). A baseline that does not
    # reach 85% gets a lower bound on its ratio to DQ.
    # FedAvg with a compressed one-epoch update (fedavg-*) 10 rounds each (about 20 minutes
    # more in all).
    "fmnist-wide-cnn": ["--preset", "fmnist-wide-cnn", "--rounds", "150", "--engine",
                        "inprocess", "--methods", "dq,fedavg,sgd,qsgd,terngrad,signsgd,"
                        "ef-signsgd,topk,powersgd,bingrad,orq,qsgd-tau5,fedavg-qsgd2,"
                        "fedavg-qsgd4,fedavg-ef-sign,fedavg-topk,fedavg-fp16",
                        "--set", "dq.num-server-rounds=40",
                        "--set", "fedavg.num-server-rounds=6",
                        *(arg for m in ("fedavg-qsgd2", "fedavg-qsgd4", "fedavg-ef-sign",
                                        "fedavg-topk", "fedavg-fp16")
                          for arg in ("--set", f"{m}.num-server-rounds=10"))],
    # the same on Dirichlet(0.1) client data, against FedAvg (20 rounds of one local epoch:
    # client drift slows it) and compressed local updates (QSGD, tau = 5, 100 rounds); the
    # other baselines are not rerun on this partition (about 20 minutes in all).
    "fmnist-wide-cnn-dirichlet": ["--preset", "fmnist-wide-cnn", "--partition", "dirichlet",
                                  "--alpha", "0.1", "--rounds", "100", "--engine", "inprocess",
                                  "--methods", "dq,fedavg,qsgd-tau5",
                                  "--set", "dq.num-server-rounds=40",
                                  "--set", "fedavg.num-server-rounds=20"],
    # DQ's ablation, one axis at a time (bits, scorer/rule, compensation at 1 bit, lossless
    # coder), wide CNN, 40 rounds of 90 samples per client (about 35 minutes on 2 cores per
    # split); simulations/ablation.py then writes one table per axis and the claims
    "fmnist-ablation": ["--preset", "fmnist-ablation", "--engine", "inprocess"],
    "fmnist-ablation-dirichlet": ["--preset", "fmnist-ablation", "--engine", "inprocess",
                                  "--partition", "dirichlet", "--alpha", "0.1"],
    # DQ's compensation modes at 1 bit (none, first step, store-level control variate,
    # refreshed residuals every 5 and 10 rounds) against 2 and 8 bits, small CNN, IID
    # (about 40 minutes on 2 cores)
    "fmnist-compensation": ["--preset", "fmnist-compensation", "--engine", "inprocess"],
}


def command(name: str, resume: bool = False) -> list[str]:
    """The full command line of experiment ``name``."""
    return [sys.executable, "-m", "dq_flower.cli", "compare", *EXPERIMENTS[name], "--out",
            str((RESULTS / name).relative_to(ROOT)), "--quiet",
            *(["--resume"] if resume else [])]


#: Summary sections left to the experiment's docs page (the README stays short).
DOCS_ONLY_SECTIONS = ("## Time on links", "## Step sizes")


def _without_sections(body: str, headers: tuple[str, ...]) -> str:
    """``body`` without the ``## `` sections whose header line starts with ``headers``."""
    out, skipping = [], False
    for line in body.split("\n"):
        if line.startswith("## "):
            skipping = line.startswith(headers)
        if not skipping:
            out.append(line)
    return "\n".join(out)


def readme_block(name: str, summary: str) -> str:
    """The README's view of one experiment: the summary's table and verdict, and the plot.

    The time-on-links and step-size sections stay on the experiment's docs page.
    """
    body = summary.split("\n", 1)[1].strip() if summary.startswith("# ") else summary.strip()
    body = _without_sections(body, DOCS_ONLY_SECTIONS)
    body = body.replace("\n## Verdict\n", "\n**Verdict**\n")
    body += (f"\n\nTime on links and the step sizes: "
             f"[docs/experiments/{name}.md](docs/experiments/{name}.md).")
    plot = f"docs/results/{name}/accuracy_vs_uplink.png"
    return f"{body}\n\n![accuracy against cumulative uplink bytes]({plot})"


def splice_readme(text: str, name: str, block: str) -> str:
    """Replace the marked block of experiment ``name`` in the README ``text``."""
    start, end = f"<!-- results:{name} -->", f"<!-- /results:{name} -->"
    if start not in text or end not in text:
        return text
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{start}\n{block}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("names", nargs="*", metavar="EXPERIMENT",
                        help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}")
    parser.add_argument("--list", action="store_true", help="print the commands and exit")
    parser.add_argument("--resume", action="store_true",
                        help="keep the methods an interrupted run finished (same config)")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment(s) {', '.join(unknown)}; known: "
                     f"{', '.join(EXPERIMENTS)}")
    names = args.names or list(EXPERIMENTS)
    if args.list:
        for name in names:
            print(f"{name}: {shlex.join(['dq-flower', *command(name)[3:]])}")
        return 0
    status = 0
    for name in names:
        cmd = command(name, args.resume)
        print(f"== {name}: {shlex.join(['dq-flower', *cmd[3:]])}", flush=True)
        t0 = time.perf_counter()
        code = subprocess.call(cmd, cwd=ROOT)
        print(f"== {name}: exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        status = status or code
        target = PUBLISHED / name
        target.mkdir(parents=True, exist_ok=True)
        for file in COPIED:
            src = RESULTS / name / file
            if src.is_file():
                shutil.copy2(src, target / file)
        summary = target / "summary.md"
        if summary.is_file():
            text = README.read_text()
            spliced = splice_readme(text, name, readme_block(name, summary.read_text()))
            if spliced != text:
                README.write_text(spliced)
            where = ("README.md and " if f"<!-- results:{name} -->" in text else "")
            print(f"== {name}: updated {where}{target.relative_to(ROOT)}/", flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
