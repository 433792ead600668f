"""DQ's ablation tables and the source paper's claims, from the comparison results.

    .venv/bin/python simulations/ablation.py      # after regenerate.py ran the experiments

Reads ``results/readme/<experiment>/results.json`` of the ablation experiments
(``fmnist-ablation``, ``fmnist-ablation-dirichlet``: DQ one axis at a time) and of the convex
case (``digits-logreg-convex``), whichever exist, and writes

- ``docs/results/<ablation experiment>/ablation.md``: one table per axis (bit width, scorer
  and rule, compensation at 1 bit, lossless coder, share of the data uploaded): uplink per
  sample, rounds and uplink bytes to the target, final and best accuracy, final test loss;
- ``docs/results/dq-claims.md``: each claim of the method's source paper with the number
  measured here, including the ones that do not hold (shown on
  ``docs/experiments/dq-ablation.md``); the same text, with links to the tables, replaces
  the README's block between ``<!-- results:dq-claims -->`` markers.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "simulations"))

from regenerate import splice_readme  # noqa: E402

from dq_flower.compare.fmt import fmt_bytes, pct  # noqa: E402

RESULTS = ROOT / "results" / "readme"
PUBLISHED = ROOT / "docs" / "results"
README = ROOT / "README.md"
ABLATIONS = ("fmnist-ablation", "fmnist-ablation-dirichlet")
CONVEX = "digits-logreg-convex"
CLAIMS_MARK = "dq-claims"

#: (axis title, [(run label, setting shown)]); ``dq`` is the default point of every axis.
AXES: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    ("Bit width of the samples", (("dq-1bit", "1 bit"), ("dq", "2 bits (default)"),
                                  ("dq-4bit", "4 bits"), ("dq-8bit", "8 bits"))),
    ("Importance scorer / selection rule", (
        ("dq", "uniform / topk (default)"), ("dq-loss-topk", "loss / topk"),
        ("dq-loss-sample", "loss / sample"), ("dq-gradnorm-sample", "gradnorm / sample"))),
    ("Compensation at 1 bit (first-step mode)", (
        ("dq-1bit", "none"), ("dq-1bit-identity", "identity (float32)"),
        ("dq-1bit-qsgd", "qsgd (4 levels)"), ("dq-1bit-ef-sign", "ef-sign (1 bit)"))),
    ("Lossless coder", (("dq-raw", "none"), ("dq", "zlib (default)"), ("dq-lzma", "lzma"),
                        ("dq-zstd", "zstd"))),
    ("Share of the training data uploaded", (("dq", "budget 90 per round"),
                                             ("dq-all-data", "budget 150 per round"))),
)

#: An accuracy gap below this (a fraction) is "no gap to close".
MIN_GAP = 0.005


def load(name: str) -> dict[str, Any] | None:
    """The ``results.json`` of experiment ``name``, if it was run."""
    path = RESULTS / name / "results.json"
    return json.loads(path.read_text()) if path.is_file() else None


def runs_by_label(results: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """The finished runs of a comparison, by label."""
    return {r["label"]: r for r in results["runs"] if r.get("status") == "ok"}


def final(run: Mapping[str, Any], key: str) -> float:
    """``key`` of the run's last round."""
    return float(run["history"][-1][key])


def uploaded_share(run: Mapping[str, Any], n_train: int) -> float:
    """Fraction of the training samples in the server's store at the end."""
    return float(run["history"][-1].get("stored", 0)) / n_train


def _row(setting: str, run: Mapping[str, Any] | None, n_train: int) -> str:
    if run is None:
        return f"| {setting} | not run | | | | | | | |"
    s = run["stats"]
    rounds = s["rounds_to_target"]
    to_target = s["up_bytes_to_target"]
    return (f"| {setting} | {s['uplink']['bits']:,.0f} b | "
            f"{pct(uploaded_share(run, n_train))} | "
            f"{rounds if rounds is not None else 'not reached'} | "
            f"{fmt_bytes(to_target) if to_target is not None else 'not reached'} | "
            f"{pct(s['final_accuracy'])} | {pct(s['best_accuracy'])} | "
            f"{final(run, 'loss'):.3f} | {fmt_bytes(s['total_up_bytes'])} |")


def n_train_of(results: Mapping[str, Any]) -> int:
    """Training samples of the scenario (every client's data once)."""
    from dq_flower.harness.tasks.data import load_dataset_cached

    preset = results["preset"]
    data = load_dataset_cached(preset["dataset"], preset.get("data_dir") or None,
                               int(preset["seed"]))
    return int(data.train_x.shape[0])


def ablation_markdown(name: str, results: Mapping[str, Any]) -> str:
    """One table per axis of a DQ ablation experiment."""
    runs = runs_by_label(results)
    preset = results["preset"]
    n_train = n_train_of(results)
    target = pct(float(results["target_accuracy"]))
    split = (f"Dirichlet({preset['dirichlet_alpha']:g})" if preset["partition"] == "dirichlet"
             else preset["partition"].upper())
    lines = [f"# DQ ablation: {name}", "",
             f"{preset['description']}; {split} split, {preset['num_clients']} clients, "
             f"{preset['rounds']} rounds, seed {preset['seed']}. Every row is DQ with one "
             f"knob changed from the default (2 bits, uniform scores, top-k rule, no "
             f"compensation, zlib, budget 90 samples per client and round). Target test "
             f"accuracy: {target}.", ""]
    header = ("| setting | uplink per sample | data uploaded | rounds to " + target
              + " | uplink to " + target + " | final acc | best acc | final test loss | "
              "total uplink |")
    for title, rows in AXES:
        lines += [f"## {title}", "", header, "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
        lines += [_row(setting, runs.get(label), n_train) for label, setting in rows]
        lines.append("")
        if title == "Lossless coder":
            lines += _coder_note(runs, rows)
    lines += ["\"uplink per sample\" is the measured payload bits per uploaded sample (side "
              "information and any compensation included); \"data uploaded\" is the share of "
              "the training samples in the server's store at the end. Run: "
              f"`{results.get('command', '')}`.", ""]
    return "\n".join(lines)


def bits_per_sample(run: Mapping[str, Any], rounds: int) -> float:
    """Measured payload bits per uploaded sample over the run's first ``rounds`` rounds."""
    rows = [r for r in run["history"] if 1 <= int(r["round"]) <= rounds]
    samples = sum(int(r.get("selected", 0) or 0) for r in rows)
    return sum(float(r.get("up_payload_bits", 0) or 0) for r in rows) / max(1, samples)


def _coder_note(runs: Mapping[str, Mapping[str, Any]],
                rows: Sequence[tuple[str, str]]) -> list[str]:
    """Bits per sample of every coder over the same first rounds (the shortest run's)."""
    present = [(label, setting, runs[label]) for label, setting in rows if label in runs]
    if len(present) < 2:
        return []
    rounds = min(len(run["history"]) - 1 for _, _, run in present)
    same = ", ".join(f"{setting.split(' ')[0]} {bits_per_sample(run, rounds):,.0f} b"
                     for _, setting, run in present)
    return [f"Coding is lossless, so every coder trains exactly as zlib does; the shorter "
            f"runs measure the bytes only. Over the same first {rounds} rounds, bits per "
            f"uploaded sample: {same}.", ""]


def _acc(runs: Mapping[str, Mapping[str, Any]], label: str) -> float | None:
    run = runs.get(label)
    return None if run is None else float(run["stats"]["final_accuracy"])


def compensation_claim(runs: Mapping[str, Mapping[str, Any]], where: str) -> list[str]:
    """How much of the 1-bit accuracy gap (to 8 bits) each compensation closes."""
    one, eight = _acc(runs, "dq-1bit"), _acc(runs, "dq-8bit")
    if one is None or eight is None:
        return []
    gap = eight - one
    head = (f"- **Compensation closes the 1-bit accuracy gap** ({where}): 1-bit data alone "
            f"ends at {pct(one)} ({_up(runs, 'dq-1bit')} uplink), 8-bit data at {pct(eight)} "
            f"({_up(runs, 'dq-8bit')})")
    if gap < MIN_GAP:
        return [head + f": a gap of {100 * gap:.1f} points, nothing to close; the compensations "
                "end at " + ", ".join(f"{pct(a)} ({c}, {_up(runs, lbl)})"
                                      for c, a, lbl in _comp(runs)) + "."]
    parts = [f"{c} {pct(a)} ({100 * (a - one) / gap:+.0f}% of the gap closed, "
             f"{_up(runs, lbl)})" for c, a, lbl in _comp(runs)]
    return [head + f" (gap {100 * gap:.1f} points); with compensation: " + ", ".join(parts)
            + "."]


def _up(runs: Mapping[str, Mapping[str, Any]], label: str) -> str:
    return fmt_bytes(runs[label]["stats"]["total_up_bytes"])


def _comp(runs: Mapping[str, Mapping[str, Any]]) -> list[tuple[str, float, str]]:
    out = []
    for label, codec in (("dq-1bit-identity", "identity"), ("dq-1bit-qsgd", "qsgd"),
                         ("dq-1bit-ef-sign", "ef-sign")):
        acc = _acc(runs, label)
        if acc is not None:
            out.append((codec, acc, label))
    return out


def importance_claim(runs: Mapping[str, Mapping[str, Any]], n_train: int,
                     where: str) -> list[str]:
    """Accuracy with part of the data under importance selection vs uniform and all data."""
    uniform, everything = runs.get("dq"), runs.get("dq-all-data")
    if uniform is None:
        return []
    share = pct(uploaded_share(uniform, n_train))
    text = (f"- **Importance selection with {share} of the samples** ({where}): uniform "
            f"selection ends at {pct(_acc(runs, 'dq') or 0)}")
    parts = [f"{name} {pct(acc)}" for label, name in (
        ("dq-loss-topk", "loss/topk"), ("dq-loss-sample", "loss/sample"),
        ("dq-gradnorm-sample", "gradnorm/sample")) if (acc := _acc(runs, label)) is not None]
    if parts:
        text += "; importance scorers: " + ", ".join(parts)
    if everything is not None:
        text += (f"; all the data ({pct(uploaded_share(everything, n_train))} uploaded, "
                 f"uniform): {pct(_acc(runs, 'dq-all-data') or 0)}")
    return [text + "."]


def convex_claim(results: Mapping[str, Any]) -> list[str]:
    """DQ's final test loss against full-precision SGD on logistic regression."""
    runs = runs_by_label(results)
    full = runs.get("full-precision")
    if full is None:
        return []
    ref = final(full, "loss")
    parts = [f"{name} {final(runs[label], 'loss'):.4f} ({final(runs[label], 'loss') - ref:+.4f})"
             for label, name in (("dq-2bit", "2-bit data"), ("dq-1bit", "1-bit data"),
                                 ("dq-2bit-qsgd", "2-bit data + qsgd compensation"))
             if label in runs]
    return [f"- **Convex case** (logistic regression on the digits, one server step per "
            f"round on fresh samples, {results['preset']['rounds']} rounds): full-precision "
            f"minibatch SGD ends at a test loss of {ref:.4f}; DQ: " + ", ".join(parts) + "."]


def claims_markdown(ablations: Mapping[str, Mapping[str, Any]],
                    convex: Mapping[str, Any] | None, links: bool = True) -> str:
    """The source paper's claims, each with the number measured here.

    ``links``: end with links to the tables (paths from the repository root: the README).
    """
    lines: list[str] = []
    for name, results in ablations.items():
        runs = runs_by_label(results)
        where = ("Fashion-MNIST, wide CNN, Dirichlet(0.1)" if "dirichlet" in name
                 else "Fashion-MNIST, wide CNN, IID")
        lines += compensation_claim(runs, where)
        lines += importance_claim(runs, n_train_of(results), where)
    if convex is not None:
        lines += convex_claim(convex)
    if not lines:
        return "No ablation results yet: run `simulations/regenerate.py fmnist-ablation`."
    if not links:
        return "\n".join(lines)
    sources = [f"docs/results/{n}/ablation.md" for n in ablations]
    if convex is not None:
        sources.append(f"docs/results/{CONVEX}/summary.md")
    return ("\n".join(lines) + "\n\nTables: " + ", ".join(f"[{s}]({s})" for s in sources)
            + "; the page [docs/experiments/dq-ablation.md](docs/experiments/dq-ablation.md).")


def main(argv: Sequence[str] | None = None) -> int:
    ablations = {}
    for name in ABLATIONS:
        results = load(name)
        if results is None:
            continue
        ablations[name] = results
        out = PUBLISHED / name
        out.mkdir(parents=True, exist_ok=True)
        (out / "ablation.md").write_text(ablation_markdown(name, results))
        print(f"written: {(out / 'ablation.md').relative_to(ROOT)}")
    convex = load(CONVEX)
    (PUBLISHED / "dq-claims.md").write_text(claims_markdown(ablations, convex, False) + "\n")
    text = README.read_text()
    spliced = splice_readme(text, CLAIMS_MARK, claims_markdown(ablations, convex))
    if spliced != text:
        README.write_text(spliced)
        print("updated: README.md")
    print(f"written: {(PUBLISHED / 'dq-claims.md').relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
