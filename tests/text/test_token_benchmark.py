"""The token-coder benchmark runs end to end on a small database and prints its table."""

import importlib.util
import sys
from pathlib import Path

from dq_flower.harness.tasks.data.austen import NOVELS
from tests.text.austen_files import novel_lines, write_db

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "token_coder.py"


def test_benchmark_smoke(tmp_path, capsys):
    folder = write_db(tmp_path / "db", {n: novel_lines(n, 12) for n in NOVELS})
    spec = importlib.util.spec_from_file_location("token_benchmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules["token_benchmark"] = module
    spec.loader.exec_module(module)
    text = module.main(["--window", "16", "--windows", "1", "2", "--messages", "2",
                        "--data-dir", str(folder)])
    rows = [line.split("|")[1:-1] for line in text.splitlines()[2:]]
    assert [r[0].strip() for r in rows] == ["1 x 16 B", "2 x 16 B"]
    for row in rows:
        assert int(row[1]) == 12  # two messages from each of the six devices
        bits = [float(v) for v in row[3:7]]
        assert all(b > 0 for b in bits)  # bits per character of the four coders
        assert bits[0] < bits[2]  # tiny messages: xz's container alone outweighs the text
    assert "| tokens | zlib | xz | lzma-raw |" in capsys.readouterr().out
