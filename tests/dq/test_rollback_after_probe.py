"""A round rolled back after the optimizer probe switched optimizers goes on training.

The trainer's optimizer probe can switch the server's optimizer inside a round's steps
(``use_optimizer`` hands the guard the new one). When those steps are then undone (the
user's model raised on a row, or the model went non-finite), the guard restored the state
of the optimizer it had snapshotted into the new one: SGD's state loaded into Adam left it
without ``betas`` and the next round's first step raised ``KeyError``, ending the run.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from dq_flower.server.robust import StepGuard


def test_an_optimizer_switched_to_during_undone_steps_starts_afresh():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    guard = StepGuard(model, sgd)
    adam = torch.optim.Adam(model.parameters(), lr=0.01)

    def steps() -> float:
        guard.optimizer = adam  # as the trainer's use_optimizer does after the probe
        model(torch.ones(4, 3)).sum().backward()
        adam.step()
        raise RuntimeError("index out of range in self")  # the user's model on a row

    loss, failure = guard.run(steps)
    assert np.isnan(loss) and failure.startswith("raised RuntimeError")
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())
    assert guard.optimizer is adam and not adam.state  # its moments were of steps undone
    assert adam.param_groups[0]["betas"] == (0.9, 0.999)
    model.zero_grad()
    model(torch.ones(4, 3)).sum().backward()
    adam.step()  # the next round's first step
    assert guard.run(lambda: 1.5) == (1.5, None)


def test_the_same_optimizer_gets_its_state_back():
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(4, 3)).sum().backward()
    sgd.step()
    momentum = sgd.state[model.weight]["momentum_buffer"].clone()
    guard = StepGuard(model, sgd)

    def steps() -> float:
        model(torch.ones(4, 3)).sum().backward()
        sgd.step()
        raise RuntimeError("boom")

    guard.run(steps)
    assert torch.equal(sgd.state[model.weight]["momentum_buffer"], momentum)
