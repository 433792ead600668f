"""simulations/regenerate.py: the experiment list and the README splice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from dq_flower.compare.presets import PRESET_DIR

ROOT = Path(__file__).resolve().parents[2]


def _module(name="regenerate"):
    spec = importlib.util.spec_from_file_location(name, ROOT / "simulations" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_block_replaces_only_its_marked_region():
    # Prepare
    regen = _module()
    summary = "# Comparison: x\n\nScenario...\n\n| t |\n\n## Verdict\n\n- dq won\n"
    text = ("intro\n<!-- results:x -->\nold table\n<!-- /results:x -->\nmiddle\n"
            "<!-- results:y -->\nkeep\n<!-- /results:y -->\n")
    # Execute
    out = regen.splice_readme(text, "x", regen.readme_block("x", summary))
    # Assert
    assert "old table" not in out and "keep" in out and out.startswith("intro\n")
    assert "Scenario...\n\n| t |\n\n**Verdict**\n\n- dq won" in out
    assert "# Comparison" not in out
    assert "](docs/results/x/accuracy_vs_uplink.png)\n<!-- /results:x -->\nmiddle" in out
    assert regen.splice_readme(text, "z", "new") == text  # no markers: unchanged


def test_every_experiment_names_a_packaged_preset():
    regen = _module()
    for name, args in regen.EXPERIMENTS.items():
        preset = args[args.index("--preset") + 1]
        assert (PRESET_DIR / f"{preset}.toml").is_file(), name
    # every published experiment is shown: the headline one in the README (a block that
    # regenerate.py splices), every one on a docs page that shows its summary.md (written
    # into the page by simulations/inline_docs.py)
    readme = (ROOT / "README.md").read_text()
    assert "<!-- inline: docs/results/digits-mlp/summary.md#verdict -->" in readme
    pages = "".join(p.read_text() for p in (ROOT / "docs" / "experiments").glob("*.md"))
    for name in regen.EXPERIMENTS:
        assert f"<!-- inline: docs/results/{name}/summary.md" in pages, name


def test_tuned_experiments_tune_first_then_compare_with_the_tuned_preset(tmp_path):
    regen = _module()
    name = "fmnist-wide-cnn"
    tune, compare = regen.tune_command(name), regen.command(name)
    assert tune[3] == "tune" and compare[3] == "compare"
    out = tune[tune.index("--out") + 1]
    assert out == "results/readme/fmnist-wide-cnn/tuned.toml"
    assert compare[compare.index("--preset") + 1] == out  # compare runs the tuned preset
    assert "--engine" not in tune and compare[compare.index("--engine") + 1] == "inprocess"
    # the scenario flags (methods, rounds, per-method rounds) are the same in both
    for flag in ("--methods", "--rounds"):
        assert tune[tune.index(flag) + 1] == compare[compare.index(flag) + 1]
    assert [a for a in tune if "num-server-rounds" in a] == \
        [a for a in compare if "num-server-rounds" in a]
    assert regen.tune_command("fmnist-compensation") is None  # not every experiment tunes


def _ablation():
    return _module("ablation")


def _run(label, final_acc, loss=0.5, stored=600):
    return {"label": label, "status": "ok",
            "history": [{"round": 1, "loss": loss, "stored": stored}],
            "stats": {"final_accuracy": final_acc, "best_accuracy": final_acc,
                      "rounds_to_target": 3, "up_bytes_to_target": 1000,
                      "total_up_bytes": 2000, "uplink": {"bits": 960.0}}}


def test_ablation_claims_state_the_share_of_the_gap_each_compensation_closes():
    abl = _ablation()
    runs = {r["label"]: r for r in (_run("dq-1bit", 0.80), _run("dq-8bit", 0.90),
                                    _run("dq-1bit-qsgd", 0.88), _run("dq-1bit-ef-sign", 0.78))}
    line = abl.compensation_claim(runs, "here")[0]
    assert ("1-bit data alone ends at 80.0% (2 kB uplink), 8-bit data at 90.0% (2 kB) "
            "(gap 10.0 points)") in line
    assert "qsgd 88.0% (+80% of the gap closed, 2 kB)" in line
    assert "ef-sign 78.0% (-20% of the gap closed, 2 kB)" in line  # a failing claim says so
    runs["dq-8bit"] = _run("dq-8bit", 0.802)
    assert "nothing to close" in abl.compensation_claim(runs, "here")[0]
    assert abl.compensation_claim({}, "here") == []


def test_ablation_claims_compare_importance_with_uniform_at_the_same_share_and_convex_loss():
    abl = _ablation()
    runs = {r["label"]: r for r in (_run("dq", 0.85, stored=600),
                                    _run("dq-loss-sample", 0.86, stored=600),
                                    _run("dq-all-data", 0.87, stored=1000))}
    line = abl.importance_claim(runs, 1000, "here")[0]
    assert line.startswith("- **Importance selection with 60.0% of the samples** (here)")
    assert "uniform selection ends at 85.0%; importance scorers: loss/sample 86.0%" in line
    assert "all the data (100.0% uploaded, uniform): 87.0%" in line
    convex = {"preset": {"rounds": 7}, "runs": [_run("full-precision", 0.9, loss=0.30),
                                                 _run("dq-2bit", 0.9, loss=0.3125)]}
    text = abl.convex_claim(convex)[0]
    assert "full-precision minibatch SGD ends at a test loss of 0.3000" in text
    assert "2-bit data 0.3125 (+0.0125)" in text and "7 rounds" in text


def test_ablation_tables_have_one_row_per_setting_and_mark_runs_not_made():
    abl = _ablation()
    preset = {"description": "d", "partition": "iid", "dirichlet_alpha": 0.1,
              "num_clients": 4, "rounds": 3, "seed": 0, "dataset": "digits", "data_dir": ""}
    results = {"preset": preset, "target_accuracy": 0.8, "command": "dq-flower compare x",
               "runs": [_run("dq", 0.85, loss=0.25, stored=1437),
                        _run("dq-8bit", 0.9, stored=718)]}
    text = abl.ablation_markdown("abl", results)
    assert ("| 2 bits (default) | 960 b | 100.0% | 3 | 1 kB | 85.0% | 85.0% | 0.250 | 2 kB |"
            in text)
    assert "| 8 bits | 960 b | 50.0% |" in text  # 718 of digits' 1,437 training rows
    assert "| 1 bit | not run | | | | | | | |" in text
    assert text.count("## ") == len(abl.AXES)


def test_coder_rows_are_compared_over_the_same_first_rounds():
    abl = _ablation()
    long_run = {"history": [{"round": 0}] + [
        {"round": r, "selected": 10, "up_payload_bits": 1000 * r} for r in range(1, 5)]}
    short = {"history": [{"round": 0}, {"round": 1, "selected": 10, "up_payload_bits": 500}]}
    assert abl.bits_per_sample(long_run, 2) == (1000 + 2000) / 20
    note = abl._coder_note({"dq": long_run, "dq-raw": short},
                           (("dq-raw", "none"), ("dq", "zlib (default)")))
    assert "Over the same first 1 rounds, bits per uploaded sample: none 50 b, zlib 100 b." \
        in note[0]
