"""Accuracy under attacking clients, with and without the robust options.

    .venv/bin/python simulations/robustness.py            # prints the table, updates the docs
    .venv/bin/python simulations/robustness.py --no-readme

Digits, the MLP, IID partitions, in-process grid, seed 0. Attackers are ordinary clients
of the same app that either do gradient ascent x10 (their loss is ``-10 x`` the
cross-entropy, so every gradient or compensation they send is ``-10 x`` an honest one) or,
for DQ's data uploads, flip their labels (``y -> 9 - y``). Scenarios: 1 attacker of 4
clients and 2 of 5. The table is spliced into ``docs/reliability.md`` (the documentation
page on robustness) between ``<!-- results:robustness -->`` markers.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch.nn import functional as F  # noqa: N812

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "reliability.md"  # where the table is spliced
sys.path.insert(0, str(ROOT))

import dq_flower  # noqa: E402
from dq_flower.harness.inprocess import InProcessGrid  # noqa: E402
from dq_flower.harness.tasks.data import load_dataset, load_partition  # noqa: E402
from dq_flower.harness.tasks.models import make_model  # noqa: E402

MARK = "robustness"


def _model():
    return make_model("mlp", (1, 8, 8), 10, seed=0)


def _ascent(out, y):
    return -10.0 * F.cross_entropy(out, y, reduction="none")


def _client(kind: str, nodes: int, attackers: int):
    shards = [load_partition("digits", k, nodes, "iid", 0.5, 0)[:2] for k in range(nodes)]

    def client(msg, context):
        pid = int(context.node_config["partition-id"])
        x, y = shards[pid]
        bad = pid >= nodes - attackers
        if kind == "gradient":
            return dq_flower.client.gradient_train(msg, context, (x, y), model=_model(),
                                                   loss_fn=_ascent if bad else None)
        if kind == "dq-flip":
            return dq_flower.client.dq_train(msg, context, (x, 9 - y if bad else y))
        return dq_flower.client.dq_train(msg, context, (x, y), model=_model(),
                                         loss_fn=_ascent if bad else None)

    return client


def _evaluate_fn():
    data = load_dataset("digits")
    model = _model()

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            pred = model(torch.from_numpy(data.test_x)).argmax(1).numpy()
        return MetricRecord({"accuracy": float((pred == data.test_y).mean())})

    return evaluate


def run(setting: str, robust: str, nodes: int, attackers: int) -> float:
    """Final test accuracy of one setting."""
    model = _model()
    # "plain mean": every defence of the mean off (norm screen, clip, direction screen)
    off = ({"norm_bound_factor": 0.0, "clip_factor": 0.0, "min_cosine": -1.0}
           if robust == PLAIN else {})
    rule = "mean" if robust.startswith("mean") or robust == PLAIN else robust
    if setting == "qsgd":
        strategy = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, aggregation=rule,
                                              trim_fraction=0.25, **off)
        kind, rounds = "gradient", 40
    elif setting == "dq-gradient":
        strategy = dq_flower.DQStrategy(model, upload_mode="gradient", gradient_codec="qsgd",
                                        server_steps=1, lr=0.1, robust_aggregation=rule,
                                        trim_fraction=0.25, **off)
        kind, rounds = "dq-gradient", 40
    else:
        strategy = dq_flower.DQStrategy(model, server_steps=40)
        kind, rounds = "dq-flip", 8
    result = strategy.start(grid=InProcessGrid(_client(kind, nodes, attackers), nodes),
                            initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds, evaluate_fn=_evaluate_fn())
    return float(result.evaluate_metrics_serverapp[rounds]["accuracy"])


PLAIN = "plain mean (no screen, clip or direction check)"
RULES = (PLAIN, "mean", "median", "trimmed-mean")
ROWS = [
    ("qsgd, gradient ascent x10", "qsgd", RULES),
    ("DQ gradient rounds (qsgd), gradient ascent x10", "dq-gradient", RULES),
    ("DQ data uploads, flipped labels", "dq-data", ("mean",)),
]
SCENARIOS = [(4, 0), (4, 1), (5, 2)]


def table() -> str:
    """The markdown table of every setting."""
    head = "| method and attack | aggregation | " + " | ".join(
        f"{a} of {n} attacking" for n, a in SCENARIOS) + " |"
    lines = [head, "|---|---|" + "---:|" * len(SCENARIOS)]
    for label, setting, rules in ROWS:
        for rule in rules:
            accs = [run(setting, rule, n, a) for n, a in SCENARIOS]
            name = {"mean": "mean + norm screen, clip, direction check (default)"}.get(rule,
                                                                                        rule)
            if setting == "dq-data":
                name = "none applies (trust model)"
            lines.append(f"| {label} | {name} | "
                         + " | ".join(f"{100 * acc:.1f}%" for acc in accs) + " |")
            print(lines[-1], flush=True)
    return "\n".join(lines)


def splice(readme: Path, body: str) -> None:
    """Replace the page's block between the robustness markers."""
    text = readme.read_text()
    pattern = re.compile(rf"(<!-- results:{MARK} -->\n).*?(<!-- /results:{MARK} -->)", re.S)
    if not pattern.search(text):
        raise SystemExit(f"{readme} has no <!-- results:{MARK} --> block")
    readme.write_text(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-readme", action="store_true",
                        help=f"only print the table (do not update {PAGE.relative_to(ROOT)})")
    args = parser.parse_args()
    logging.getLogger("flwr").setLevel(logging.WARNING)
    torch.set_num_threads(1)
    np.seterr(all="ignore")
    body = table()
    body += ("\n\nFinal test accuracy (digits, MLP, IID, seed 0; qsgd and DQ gradient rounds "
             "40 rounds, DQ data 8 rounds; trimmed mean cuts 25% at each end, i.e. one "
             "client of 4 or 5). Regenerate: `.venv/bin/python simulations/robustness.py`.")
    if not args.no_readme:
        splice(PAGE, body)
        print(f"updated {PAGE.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
