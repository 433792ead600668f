"""docs/text.md's table of seeds is the runs' results.json, row by row."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _row(seed: int) -> str:
    """The table row computed from ``results/text_lora_seed<seed>/results.json``."""
    runs = json.loads((ROOT / f"results/text_lora_seed{seed}/results.json").read_text())
    lora, dq = runs["lora-fedavg"]["history"], runs["dq"]["history"]
    target, lora_up = lora[-1]["perplexity"], sum(p["up_bytes"] for p in lora)
    sent = 0
    for point in dq:
        sent += point["up_bytes"]
        if point["round"] and point["perplexity"] <= target:
            break
    else:
        raise AssertionError(f"seed {seed}: DQ never reached {target}")
    return (f"| {seed} | {dq[0]['perplexity']:.2f} | {target:.3f} ({lora_up:,} B) | "
            f"{point['round']}, {sent:,} B | {lora_up / sent:.1f}x | "
            f"{dq[-1]['perplexity']:.3f} ({sum(p['up_bytes'] for p in dq):,} B) |")


def test_the_seeds_table_is_the_runs():
    page = (ROOT / "docs/text.md").read_text()
    rows = [line for line in page.splitlines() if re.match(r"^\| [0-9] \| \d+\.\d\d \|", line)]
    assert rows == [_row(seed) for seed in (0, 1, 2)]
