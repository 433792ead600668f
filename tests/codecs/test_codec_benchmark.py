"""The codec benchmark runs end to end on tiny inputs and prints a complete table."""

import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "codecs.py"


def test_benchmark_smoke(capsys):
    spec = importlib.util.spec_from_file_location("codec_benchmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["codec_benchmark"] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    text = module.main(["--size", "20000", "--rows", "64", "--reps", "1", "--clock", "cpu"])
    lines = [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(lines) == 1 + len(module.CASES)  # header + one row per case
    for label, *_ in module.CASES:
        assert any(line.startswith(f"| {label} |") for line in lines)
    for line in lines[1:]:
        assert line.split("|")[6].strip() in {"yes", "**MISSED**", "n/a"}
    assert "compression" in capsys.readouterr().out
