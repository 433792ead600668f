"""simulations/text_lora.py: DQ against federated LoRA fine-tuning, small and real."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.scripts import load_script

pytest.importorskip("peft")


def _script():
    return load_script("simulations/text_lora.py", "text_lora")


def test_the_tiny_comparison_counts_every_method_and_resumes(tmp_path):
    script = _script()
    results = script.main(["--tiny", "--out", str(tmp_path)])
    assert list(results) == ["lora-fedavg", "lora-fedavg-qsgd2", "upload-all", "dq",
                             "dq-scored"]
    summary = (tmp_path / "summary.md").read_text()
    assert "| lora-fedavg | 2 |" in summary and "| dq | 2 |" in summary
    assert (tmp_path / "perplexity_vs_uplink.png").stat().st_size > 1000
    lora, qsgd, dq = results["lora-fedavg"], results["lora-fedavg-qsgd2"], results["dq"]
    # every round of LoRA uploads the adapters from every device: the same bytes each round
    ups = [p["up_bytes"] for p in lora["history"][1:]]
    assert ups[0] == ups[1] > 3 * lora["adapter_bytes"]
    assert sum(p["up_bytes"] for p in qsgd["history"]) < 0.25 * sum(ups)
    assert all(f > 0 for f in lora["history"][1]["device_flops"].values())
    assert sum(dq["history"][1]["device_flops"].values()) == 0  # DQ's devices train nothing
    # devices given the model: the first round draws uniformly, sends no model
    scored = results["dq-scored"]["history"][1]
    assert scored["perplexity"] == dq["history"][1]["perplexity"]
    assert scored["down_bytes"] == dq["history"][1]["down_bytes"]
    assert dq["history"][-1]["perplexity"] < dq["history"][0]["perplexity"]
    # --resume keeps what was run with the same settings
    again = script.main(["--tiny", "--out", str(tmp_path), "--resume"])
    assert json.dumps(again, sort_keys=True) == json.dumps(results, sort_keys=True)


@pytest.mark.slow
def test_the_austen_comparison(tmp_path):
    pytest.importorskip("rdata")
    from dq_flower.harness.tasks.data.austen import find_austen_db
    from dq_flower.harness.tasks.data.pydocs import DEFAULT_PYDOCS_DIR

    try:
        find_austen_db()
    except FileNotFoundError:
        pytest.skip("needs Debian's r-cran-janeaustenr")
    if not Path(DEFAULT_PYDOCS_DIR).is_dir():
        pytest.skip("needs Debian's python3.11-doc")
    results = _script().main(["--out", str(tmp_path)])  # about 20 minutes on one core
    lora, dq = results["lora-fedavg"]["history"], results["dq"]["history"]
    assert lora[-1]["perplexity"] < lora[0]["perplexity"]
    assert (tmp_path / "summary.md").exists()
    assert dq[-1]["perplexity"] < lora[0]["perplexity"]


class _ByteTokenizer:
    """UTF-8 bytes, with ``encode`` and ``len`` as Hugging Face tokenizers have them."""

    def encode(self, text: str) -> list[int]:
        return list(text.encode())

    def __len__(self) -> int:
        return 256


def test_the_smollm2_path_runs_with_a_tiny_llama(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from dq_flower.harness.tasks.data import austen
    from dq_flower.harness.tasks.data.austen import NOVELS
    from tests.text.austen_files import novel_lines, write_db

    folder = write_db(tmp_path / "db", {n: novel_lines(n, 40) for n in NOVELS})
    real = austen.load_austen
    monkeypatch.setattr(austen, "load_austen", lambda *a, seed=0, **k: real(folder, seed=seed))
    script = _script()
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    llama = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=256, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=1))
    monkeypatch.setattr(script, "load_smollm2", lambda: (llama, _ByteTokenizer()))
    results = script.main([
        "--model", "smollm2", "--out", str(tmp_path / "out"), "--chars", "300",
        "--window", "16", "--held-windows", "2", "--lora-rounds", "1", "--local-steps", "1",
        "--local-batch", "2", "--methods", "lora-fedavg,dq", "--dq-rounds", "1", "--dq-knobs",
        'server_batch_size=4,max_server_steps=10,max_server_epochs=1,optimizer="adam",lr=0.01'])
    lora, dq = results["lora-fedavg"], results["dq"]
    assert lora["lora"]["targets"][:2] == ["q_proj", "k_proj"]  # every Llama projection
    assert lora["history"][1]["up_bytes"] > 6 * lora["adapter_bytes"]  # all six adapters
    assert lora["settings"]["model"] == "smollm2" and lora["settings"]["lr_max"] == 1e-3
    # DQ's server trained the Llama on int64 windows: its held-out perplexity fell
    assert dq["history"][1]["server_steps"] > 0
    assert dq["history"][1]["perplexity"] < dq["history"][0]["perplexity"]
    summary = (tmp_path / "out" / "summary.md").read_text()
    assert "Base: SmolLM2-135M-Instruct" in summary and "windows of 16 tokens" in summary


def test_tiny_refuses_another_model(capsys):
    with pytest.raises(SystemExit):
        _script().main(["--tiny", "--model", "smollm2", "--out", "unused"])
    assert "--tiny runs the tiny CharTransformer only" in capsys.readouterr().err
