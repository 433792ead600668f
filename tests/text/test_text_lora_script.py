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
