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
    # every published experiment is shown: the headline one in the README (a block that
    # regenerate.py splices), every one on a docs page that includes its summary.md
    readme = (ROOT / "README.md").read_text()
    assert "<!-- results:digits-mlp -->" in readme
    pages = "".join(p.read_text() for p in (ROOT / "docs" / "experiments").glob("*.md"))
    for name in regen.EXPERIMENTS:
        assert f'--8<-- "docs/results/{name}/summary.md' in pages, name
