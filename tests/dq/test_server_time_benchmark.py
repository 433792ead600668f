"""benchmarks/server_time.py runs: DQ's phase and the plain loop to the same test accuracy."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "server_time.py"


def _module():
    spec = importlib.util.spec_from_file_location("server_time", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def test_the_plain_loop_stops_at_the_first_score_at_or_above_the_target():
    bench = _module()
    easy = bench.plain_phase("digits-mlp", 1000, 0.5, seed=0, max_steps=2000)
    assert easy.steps % bench.EVAL_EVERY == 0 and easy.accuracy >= 0.5
    hard = bench.plain_phase("digits-mlp", 1000, 1.01, seed=0, max_steps=150)
    assert hard.steps == 150 and hard.accuracy < 1.01 and hard.seconds > 0
    assert easy.steps < 2000


@pytest.mark.slow  # a DQ round and its loop, about 20 s on an idle core
def test_the_benchmark_prints_both_phases_and_their_ratios():
    out = subprocess.run([sys.executable, str(SCRIPT), "--repeats", "1"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, check=True).stdout
    rows = {m.group(1): m.groups()[1:] for m in re.finditer(
        r"^digits-mlp\s+(dq|plain|ratio)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)}
    assert set(rows) == {"dq", "plain", "ratio"}
    dq_steps, plain_steps = int(rows["dq"][0]), int(rows["plain"][0])
    assert float(rows["ratio"][0]) == round(dq_steps / plain_steps, 2)
