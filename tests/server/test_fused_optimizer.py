"""The server's own optimizers take PyTorch's fused step where every parameter allows it."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from dq_flower.server.common import FUSED_DEVICES, _fusable, decay_groups, make_optimizer

pytestmark = pytest.mark.skipif("cpu" not in FUSED_DEVICES,
                                reason="PyTorch before 2.4 has no fused step on the CPU")


def _trained(optimizer_name: str, fused: bool) -> torch.Tensor:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    if fused:
        optimizer = make_optimizer(optimizer_name, decay_groups(model, 5e-4), 0.05, 0.9, 5e-4)
    elif optimizer_name == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9,
                                    weight_decay=5e-4)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05, weight_decay=5e-4)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(64, 8, generator=gen), torch.randint(3, (64,), generator=gen)
    for _ in range(30):
        optimizer.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        optimizer.step()
    return torch.cat([p.detach().flatten() for p in model.parameters()])


@pytest.mark.parametrize("name", ["sgd", "adam"])
def test_the_fused_step_is_the_same_rule(name):
    model = nn.Linear(4, 2)
    optimizer = make_optimizer(name, decay_groups(model, 5e-4), 0.05, 0.9, 5e-4)
    assert all(group["fused"] for group in optimizer.param_groups)
    # the same update up to float rounding: 30 steps apart by less than 1e-5
    assert torch.allclose(_trained(name, True), _trained(name, False), atol=1e-5)


def test_a_sparse_embedding_keeps_the_plain_step():
    class Bag(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.words = nn.Embedding(50, 4, sparse=True)
            self.out = nn.Linear(4, 2)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.out(self.words(ids).mean(1))

    model = Bag()
    optimizer = make_optimizer("sgd", decay_groups(model, 5e-4), 0.05, 0.0, 5e-4)
    assert [group["fused"] for group in optimizer.param_groups] == [True, False]
    before = model.words.weight.detach().clone()
    nn.functional.cross_entropy(model(torch.randint(50, (8, 5))), torch.zeros(8).long()
                                ).backward()
    optimizer.step()  # the fused step would refuse the sparse gradient
    assert not torch.equal(before, model.words.weight)


def test_parameters_without_fused_kernels_keep_the_plain_step():
    on_meta = nn.Parameter(torch.ones(3, device="meta"))  # no fused kernel on this device
    assert _fusable([{"params": [on_meta]}]) is None
    assert _fusable([{"params": [nn.Parameter(torch.ones(3))]}, on_meta]) is None
    assert _fusable([nn.Parameter(torch.ones(3, dtype=torch.float64))]) is True
