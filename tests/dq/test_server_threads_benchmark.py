"""benchmarks/server_threads.py runs: one thread against PyTorch's own count, side by side."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("threads", ["1", "2"])
def test_the_benchmark_prints_both_step_times_and_their_ratio(threads):
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "server_threads.py"), "--model", "mlp",
         "--steps", "6", "--repeats", "1"], cwd=ROOT, capture_output=True, text=True,
        timeout=300, check=True, env={**os.environ, "OMP_NUM_THREADS": threads}
    ).stdout
    assert f"PyTorch's threads {threads}," in out, out
    row = re.search(r"^mlp\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)", out, re.M)
    assert row, out
    one, own, ratio = map(float, row.groups())
    assert one > 0 and own > 0
    assert ratio == pytest.approx(own / one, rel=0.05, abs=0.02)  # printed rounded
