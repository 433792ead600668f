"""Pretraining a small language model on one corpus, to fine-tune it on another.

The text is read as UTF-8 bytes (a vocabulary of 256, as ``dq_train`` reads text by
default); each step trains on ``batch_size`` windows that start at offsets drawn uniformly
from a seeded ``torch.Generator``, with Adam on the next-token loss. The result can be
cached in a file named by a hash of the settings and of the text itself, so a cached base
is never reused for another corpus or schedule.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn

from dq_flower.harness.tasks.char_lm import CharTransformer
from dq_flower.model_ops import next_token_loss

__all__ = ["PretrainSettings", "byte_windows", "pretrain", "pretrained_char_transformer"]


@dataclass(frozen=True)
class PretrainSettings:
    """The pretraining schedule: steps of ``batch_size`` windows, Adam at ``lr``, a seed."""

    window: int = 128
    steps: int = 400
    batch_size: int = 32
    lr: float = 2e-3
    seed: int = 0


def byte_windows(text: str, window: int) -> torch.Tensor:
    """The text's UTF-8 bytes as consecutive ``(n, window)`` int64 windows (a tail dropped)."""
    raw = text.encode()
    n = len(raw) // window
    if n == 0:
        return torch.zeros(0, window, dtype=torch.long)
    return torch.frombuffer(bytearray(raw[:n * window]), dtype=torch.uint8).long() \
        .reshape(n, window)


def pretrain(model: nn.Module, text: str, settings: PretrainSettings) -> list[float]:
    """Train ``model`` in place on windows of ``text``; return the loss of every step."""
    raw = torch.frombuffer(bytearray(text.encode()), dtype=torch.uint8).long()
    if raw.numel() <= settings.window:
        raise ValueError(f"pretraining needs more than {settings.window} bytes of text, got "
                         f"{raw.numel()}")
    gen = torch.Generator().manual_seed(settings.seed)
    opt = torch.optim.Adam(model.parameters(), lr=settings.lr)
    span = torch.arange(settings.window)
    model.train()
    losses = []
    for _ in range(settings.steps):
        starts = torch.randint(0, raw.numel() - settings.window + 1, (settings.batch_size,),
                               generator=gen)
        batch = raw[starts[:, None] + span]
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model(batch), batch).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return losses


def _cache_path(folder: Path, text: str, settings: PretrainSettings, corpus: str) -> Path:
    key = json.dumps({"corpus": corpus, **asdict(settings)}, sort_keys=True).encode()
    digest = hashlib.sha256(key + hashlib.sha256(text.encode()).digest()).hexdigest()[:16]
    return folder / f"char-transformer-{corpus}-{digest}.pt"


def pretrained_char_transformer(text: str | Callable[[], str], settings: PretrainSettings,
                                *, corpus: str = "text",
                                cache_dir: str | os.PathLike[str] | None = None
                                ) -> CharTransformer:
    """A ``CharTransformer`` (its defaults; vocabulary 256) pretrained on ``text``.

    The initial weights come from ``settings.seed``. With ``cache_dir`` the trained weights
    are read from, or written to, a file there named by ``corpus`` and a hash of the text and
    the settings.
    """
    corpus_text = text() if callable(text) else text
    torch.manual_seed(settings.seed)
    model = CharTransformer(256, settings.window)
    path = None
    if cache_dir is not None:
        path = _cache_path(Path(cache_dir), corpus_text, settings, corpus)
        if path.exists():
            model.load_state_dict(torch.load(path, weights_only=True))
            return model
    pretrain(model, corpus_text, settings)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(model.state_dict(), tmp)
        os.replace(tmp, path)
    return model
