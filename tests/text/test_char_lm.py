"""The tiny character transformer: its size, causality, loss and that it learns."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dq_flower.harness.tasks.char_lm import next_token_loss, perplexity
from dq_flower.harness.tasks.models import make_model
from dq_flower.model_ops import num_params
from tests.text.test_token_coder import ENGLISH


def test_a_few_hundred_thousand_parameters():
    assert num_params(make_model("char-transformer", (128,), 256)) == 285_568
    assert num_params(make_model("char-transformer", (64,), 256, width=64, blocks=3)) \
        < num_params(make_model("char-transformer", (128,), 256))


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match=r"token windows \(length,\)"):
        make_model("char-transformer", (1, 8, 8), 256)
    with pytest.raises(ValueError, match="divisible by heads"):
        make_model("char-transformer", (16,), 256, width=30, heads=4)
    model = make_model("char-transformer", (16,), 256)
    with pytest.raises(ValueError, match="at most 16"):
        model(torch.zeros(1, 17, dtype=torch.long))


def test_logits_at_a_position_see_only_the_tokens_up_to_it():
    model = make_model("char-transformer", (32,), 256, seed=1).eval()
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[:, 20] = (y[:, 20] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(y)
    assert a.shape == (2, 32, 256)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])
    # float rows holding ids (as a sample store keeps them) give the same logits
    with torch.no_grad():
        assert torch.equal(model(x.float()), a)


def test_the_loss_is_the_mean_cross_entropy_of_the_next_token():
    logits = torch.randn(3, 5, 7, generator=torch.Generator().manual_seed(2))
    ids = torch.randint(0, 7, (3, 5), generator=torch.Generator().manual_seed(3))
    loss = next_token_loss(logits, ids)
    by_hand = [np.mean([-torch.log_softmax(logits[i, t], 0)[ids[i, t + 1]].item()
                        for t in range(4)]) for i in range(3)]
    assert loss.shape == (3,)
    assert np.allclose(loss.numpy(), by_hand, atol=1e-6)


def test_an_untrained_model_is_near_uniform_and_training_lowers_perplexity():
    raw = np.frombuffer((ENGLISH * 6).encode(), dtype=np.uint8)
    windows = torch.from_numpy(raw[:raw.size // 64 * 64].reshape(-1, 64).astype(np.int64))
    model = make_model("char-transformer", (64,), 256, seed=0)
    before = perplexity(model, windows)
    assert 150 < before < 400  # about the 256 of a uniform guess
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        opt.zero_grad()
        next_token_loss(model(windows), windows).mean().backward()
        opt.step()
    after = perplexity(model, windows)
    assert after < 12 and math.isfinite(after)  # measured: 297 -> 1.75 (seed 0)
