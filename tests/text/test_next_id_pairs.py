"""A small causal language model fed ``(x, y)`` pairs, ``y`` the next ids, through DQ.

The way a user writes a GPT-like model: token and position embeddings, a causal transformer
(its mask ``nn.Transformer.generate_square_subsequent_mask`` kept as a buffer, ``-inf``
above the diagonal), next-id logits ``(n, length, vocab)`` at every position, and a
``Dataset`` of ``(block[:-1], block[1:])`` pairs. Three things broke it at DQ's defaults:
the server named no id vocabulary to a model that reads windows (the nodes quantized their
ids as values and every reply failed the model check), the mask's ``-inf`` read as a
diverged model (every round's steps rolled back), and the default loss shifted the given
next ids once more (the model learned the id after next).
"""

from __future__ import annotations

import torch
from torch import nn

from dq_flower.model_ops import finite_since

VOCAB, LENGTH, NODES, ROWS = 12, 8, 3, 200


class TinyGPT(nn.Module):
    """Token and position embeddings, one causal transformer layer, next-id logits."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.tok, self.pos = nn.Embedding(VOCAB, 16), nn.Embedding(LENGTH, 16)
        self.block = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(16, VOCAB)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(LENGTH))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        t = ids.shape[1]  # a shorter window: the mask's corner
        h = self.tok(ids) + self.pos(torch.arange(t))
        return self.head(self.block(h, src_mask=self.mask[:t, :t], is_causal=True))


def test_a_constant_minus_inf_buffer_is_no_divergence():
    model = TinyGPT()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert finite_since(model, before)
    with torch.no_grad():
        model.head.bias[0] = float("nan")
    assert not finite_since(model, before)
    model.load_state_dict(before)
    model.mask[0, 0] = float("inf")  # a buffer newly non-finite: divergence
    assert not finite_since(model, before)
