"""A tiny causal transformer over bytes or characters, for the text tests and CI runs.

``char-transformer`` (:func:`char_transformer`): token and position embeddings, pre-norm
transformer blocks with causal self-attention (no dropout), a final norm and a linear
head; on windows of 128 bytes at its defaults (width 96, 2 blocks, 4 heads) 285,568
parameters. It reads windows ``(batch, length)`` of ids (integers, or floats holding
integers, as flat rows are stored) and returns next-token logits ``(batch, length,
vocab)``: position ``t`` predicts token ``t + 1`` from tokens ``0..t``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import nn

from dq_flower.model_ops import next_token_loss

__all__ = ["CharTransformer", "char_transformer", "next_token_loss", "perplexity"]


class CharTransformer(nn.Module):
    """A decoder-only transformer over ``vocab`` symbols and windows of ``length``."""

    def __init__(self, vocab: int, length: int, width: int = 96, blocks: int = 2,
                 heads: int = 4) -> None:
        super().__init__()
        if vocab < 2 or length < 2 or width < 1 or blocks < 1 or heads < 1 \
                or width % heads:
            raise ValueError(f"char-transformer needs vocab >= 2, length >= 2 and a width "
                             f"divisible by heads; got vocab={vocab}, length={length}, "
                             f"width={width}, heads={heads}")
        self.vocab, self.length = int(vocab), int(length)
        self.embed = nn.Embedding(vocab, width)
        self.position = nn.Parameter(torch.zeros(length, width))
        nn.init.normal_(self.position, std=0.02)
        layer = nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, blocks, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)
        self.causal: torch.Tensor
        mask = torch.triu(torch.full((length, length), float("-inf")), diagonal=1)
        self.register_buffer("causal", mask, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Next-token logits ``(batch, length, vocab)`` of windows ``x (batch, length)``."""
        ids = x.reshape(x.shape[0], -1)
        if ids.is_floating_point():
            ids = ids.round().long()
        t = ids.shape[1]
        if t > self.length:
            raise ValueError(f"windows of {t} tokens; this model takes at most {self.length}")
        h = self.embed(ids) + self.position[:t]
        h = self.blocks(h, mask=self.causal[:t, :t], is_causal=True)
        return self.head(self.norm(h))


def char_transformer(input_shape: Sequence[int], num_classes: int, width: int = 96,
                     blocks: int = 2, heads: int = 4) -> nn.Module:
    """The registry's builder: ``input_shape`` is ``(length,)``, ``num_classes`` the vocab."""
    shape = tuple(int(s) for s in input_shape)
    if len(shape) != 1:
        raise ValueError(f"char-transformer needs token windows (length,), got {shape}")
    return CharTransformer(num_classes, shape[0], width, blocks, heads)


@torch.no_grad()
def perplexity(model: nn.Module, windows: torch.Tensor, batch: int = 256) -> float:
    """``exp`` of the mean next-token loss over ``windows`` (every window weighs the same)."""
    was_training = model.training
    model.eval()
    total = 0.0
    for start in range(0, windows.shape[0], batch):
        part = windows[start:start + batch]
        total += float(next_token_loss(model(part), part).sum())
    model.train(was_training)
    return math.exp(total / max(windows.shape[0], 1))
