"""The Python documentation as a federation: one device per section, held-out pages."""

from __future__ import annotations

from pathlib import Path

import pytest

from dq_flower.harness.tasks.data.pydocs import PYDOCS_SECTIONS, load_python_docs
from tests.scripts import load_script


def _docs(root: Path, pages: int = 4) -> Path:
    """A small docs folder: each default section's pages, one ``index.html`` elsewhere."""
    for section in PYDOCS_SECTIONS:
        folder = root / section
        folder.mkdir(parents=True)
        for i in range(pages):
            words = " ".join(f"{section}{i}w{j}" for j in range(40 + 10 * i))
            (folder / f"page{i}.html").write_text(
                f"<html><body><div class='related'>nav</div><h1>{section} {i}</h1>"
                f"<p>{words}</p></body></html>")
    (root / "index.html").write_text("<p>not a section's page</p>")
    return root


def test_one_device_per_section_whole_pages_held_out(tmp_path):
    fed = load_python_docs(_docs(tmp_path), seed=0)
    assert fed.name == "python-docs"
    assert [d.name for d in fed.devices] == list(PYDOCS_SECTIONS)
    for d in fed.devices:
        assert d.train_chapters + d.test_chapters == 4 and d.test_chapters >= 1
        assert d.train and d.test and "nav" not in d.train + d.test
        assert all(w.startswith(d.name) or w.isdigit() for w in (d.train + d.test).split())
        train_pages = {line for line in d.train.splitlines() if line.startswith(d.name + " ")}
        held_pages = {line for line in d.test.splitlines() if line.startswith(d.name + " ")}
        assert not train_pages & held_pages  # whole pages: none both trained and held
        assert len(d.test) >= 0.1 * (len(d.train) + len(d.test)) - 4
    again = load_python_docs(tmp_path, seed=0)
    assert again == fed  # seeded
    other = load_python_docs(tmp_path, sections=("faq", "tutorial"), seed=1)
    assert [d.name for d in other.devices] == ["faq", "tutorial"]
    with pytest.raises(FileNotFoundError, match="python3.11-doc"):
        load_python_docs(tmp_path, sections=("nosuch",))


def _script():
    return load_script("simulations/text_lora.py", "text_lora_fed")


def test_the_script_builds_the_docs_federation_pretrained_on_austen(tmp_path):
    script = _script()
    args = script._parser().parse_args(
        ["--federation", "python-docs", "--pydocs-dir", str(_docs(tmp_path)),
         "--chars", "100", "--window", "16", "--held-windows", "2"])
    task, corpus, _ = script._task(args)
    assert task.names == PYDOCS_SECTIONS
    fed = load_python_docs(tmp_path, seed=0)
    assert task.train == tuple(d.train[:100] for d in fed.devices)
    assert [len(w) for w in task.held.windows] == [2] * len(PYDOCS_SECTIONS)
    assert corpus == "austen"  # the base never saw the devices' text
    # its settings say so; the default federation's settings are as they were
    assert script._settings(args, "dq")["federation"] == "python-docs"
    default = script._parser().parse_args([])
    assert "federation" not in script._settings(default, "dq")
