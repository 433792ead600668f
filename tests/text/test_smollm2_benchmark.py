"""The SmolLM2 cost benchmark runs end to end with a tiny Llama and a small database."""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from dq_flower.harness.tasks.data.austen import NOVELS
from tests.text.austen_files import novel_lines, write_db

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "smollm2_cost.py"


class ByteTokenizer:
    """Text to its UTF-8 bytes, called as Hugging Face tokenizers are."""

    def __call__(self, text: str) -> SimpleNamespace:
        return SimpleNamespace(input_ids=list(text.encode()))


def test_benchmark_smoke(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    folder = write_db(tmp_path / "db", {n: novel_lines(n, 12) for n in NOVELS})
    spec = importlib.util.spec_from_file_location("smollm2_benchmark", BENCH)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "smollm2_benchmark", module)
    spec.loader.exec_module(module)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=16, intermediate_size=32,
                                      num_hidden_layers=1, num_attention_heads=2,
                                      num_key_value_heads=1)
    model = transformers.LlamaForCausalLM(config)
    params = sum(p.numel() for p in model.parameters())  # before peft adds its adapter
    monkeypatch.setattr(module, "load_smollm2", lambda: (model, ByteTokenizer()))
    table = module.main(["--length", "16", "--windows", "2", "--batch", "4", "--threads", "1",
                         "--repeats", "1", "--data-dir", str(folder)])
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    rows = dict(cells[2:])
    assert rows["parameters (float32)"] == f"{params:,}"
    ppl = float(rows["held-out perplexity (12 windows of 16 tokens, 2 per novel)"].split()[0])
    assert 100 < ppl < 600  # an untrained model over 256 ids
    assert "s CPU" in rows["full fine-tune step, 4 x 16 tokens, 1 thread(s)"]
    assert "1.00 characters a token" in rows["devices' training text"]
