"""``server-autocast = "bfloat16"``: the server's store steps run the forward in bfloat16."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dq_flower.dq.config import DQConfig
from dq_flower.model_ops import WeightedSteps


def _net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Flatten(),
                         nn.Linear(4 * 8 * 8, 3))


def _data() -> tuple[np.ndarray, np.ndarray]:
    x = np.random.default_rng(0).random((64, 1, 8, 8), dtype=np.float32)
    return x, (x.reshape(64, -1).mean(1) * 6).astype(np.int64) % 3


def _loss(model: nn.Module) -> float:
    x, y = _data()
    with torch.no_grad():
        return float(nn.functional.cross_entropy(model(torch.from_numpy(x)),
                                                 torch.from_numpy(y)))


def _steps(autocast: str, seen: list[torch.dtype]) -> nn.Module:
    model = _net()
    model[0].register_forward_hook(lambda m, i, out: seen.append(out.dtype))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    steps = WeightedSteps(model, optimizer, None, autocast)
    x, y = _data()
    losses = [steps.step(x, y, np.full(64, 1 / 64, np.float32)) for _ in range(40)]
    steps.close()
    assert all(np.isfinite(losses)) and losses[-1] < losses[0]
    return model


def test_the_forward_runs_in_bfloat16_and_the_weights_stay_float32():
    seen_bf16: list[torch.dtype] = []
    seen_fp32: list[torch.dtype] = []
    bf16, fp32 = _steps("bfloat16", seen_bf16), _steps("none", seen_fp32)
    assert set(seen_bf16) == {torch.bfloat16} and set(seen_fp32) == {torch.float32}
    assert all(p.dtype == torch.float32 for p in bf16.parameters())
    a = torch.cat([p.detach().flatten() for p in bf16.parameters()])
    b = torch.cat([p.detach().flatten() for p in fp32.parameters()])
    # other rounding, the same training: after 40 steps the weights apart by 0.07% of their
    # norm, the float32 loss on the rows the same to 1e-4 (bounds 10x the measured)
    assert not torch.equal(a, b)
    assert float((a - b).norm() / b.norm()) < 0.01
    assert abs(_loss(bf16) - _loss(fp32)) < 1e-3


def test_the_knob_takes_bfloat16_or_none_and_refuses_others_naming_it():
    assert DQConfig().server_autocast == "none"
    assert DQConfig(server_autocast="bfloat16").server_autocast == "bfloat16"
    with pytest.raises(ValueError, match="server-autocast"):
        DQConfig(server_autocast="float16")
