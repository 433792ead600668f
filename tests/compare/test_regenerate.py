"""simulations/regenerate.py: the experiment list and the README splice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module():
    spec = importlib.util.spec_from_file_location("regenerate", ROOT / "simulations" /
                                                  "regenerate.py")
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


def test_every_experiment_names_a_preset_in_simulations():
    regen = _module()
    for name, args in regen.EXPERIMENTS.items():
        preset = args[args.index("--preset") + 1]
        assert (ROOT / "simulations" / f"{preset}.toml").is_file(), name
    # the README shows a block for every published experiment but the upload-mode one,
    # whose condensed table is written by hand
    readme = (ROOT / "README.md").read_text()
    for name in regen.EXPERIMENTS:
        if name != "digits-upload-mode":
            assert f"<!-- results:{name} -->" in readme, name
