"""``server-autocast``: the server's store steps run the forward in bfloat16 where asked or,
at ``auto`` (the default), where the CPU computes bfloat16 natively and the model is large."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server import step_compute as step_compute_module
from dq_flower.dq.server.step_compute import forward_flops, native_bfloat16, step_compute
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.model_ops import WeightedSteps
from tests.dq.test_server_threads import CLASSES, DIM
from tests.dq.test_server_threads import _data as store_data


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


def test_the_knob_takes_auto_bfloat16_or_none_and_refuses_others_naming_it():
    assert DQConfig().server_autocast == "auto"
    assert DQConfig(server_autocast="none").server_autocast == "none"
    assert DQConfig(server_autocast="bfloat16").server_autocast == "bfloat16"
    with pytest.raises(ValueError, match="server-autocast"):
        DQConfig(server_autocast="float16")


def test_native_bfloat16_is_read_from_the_cpu_flags(tmp_path):
    with_bf16, without = tmp_path / "a", tmp_path / "b"
    with_bf16.write_text("flags\t\t: fpu avx512f avx512_bf16 avx512_vnni\n")
    without.write_text("flags\t\t: fpu avx2 avx512f avx512bw\n")
    assert native_bfloat16(with_bf16) and not native_bfloat16(without)
    assert not native_bfloat16(tmp_path / "missing")  # not Linux: not taken


def test_forward_flops_counts_a_sample_and_leaves_the_mode():
    model = nn.Sequential(nn.Linear(10, 5), nn.Dropout(0.5), nn.Linear(5, 2)).train()
    assert forward_flops(model, np.zeros((4, 10), np.float32)) == 2 * (10 * 5 + 5 * 2)
    assert model.training


def _wide() -> nn.Module:  # 2 * (12 * 40,000 + 40,000 * 3) = 1.2 MFLOP a sample
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(DIM, 40_000), nn.ReLU(), nn.Linear(40_000, CLASSES))


def _trainer(model: nn.Module, autocast: str) -> ServerTrainer:
    cfg = DQConfig(upload_schedule="fixed", server_steps=3, augmentation="none",
                   server_autocast=autocast)
    return ServerTrainer(cfg, model, torch.optim.SGD(model.parameters(), lr=0.01),
                         store_data(), None, loss_fn=None, seed=3)


@pytest.mark.parametrize("native", [True, False])
def test_auto_takes_bfloat16_for_large_models_on_a_native_cpu_only(monkeypatch, native):
    monkeypatch.setattr(step_compute_module, "native_bfloat16", lambda: native)
    rows = np.zeros((2, DIM), np.float32)
    assert step_compute(_wide(), rows, 64, 1, "auto").autocast == (
        "bfloat16" if native else "none")
    small = nn.Sequential(nn.Linear(DIM, 8), nn.ReLU(), nn.Linear(8, CLASSES))  # 0.0002 MFLOP
    assert step_compute(small, rows, 64, 1, "auto").autocast == "none"
    for value in ("none", "bfloat16"):  # set by the user: kept
        assert step_compute(_wide(), rows, 64, 1, value).autocast == value


def test_auto_is_chosen_once_a_trainer(monkeypatch):
    monkeypatch.setattr(step_compute_module, "native_bfloat16", lambda: True)
    counted: list[int] = []
    monkeypatch.setattr(step_compute_module, "forward_flops",
                        lambda model, rows, tokens=False: counted.append(len(rows)) or 2e6)
    trainer = _trainer(_wide(), "auto")
    for _ in range(2):  # two rounds of store steps
        trainer.train_gradient(1, None, [], [7])
    assert trainer.compute().autocast == "bfloat16" and len(counted) == 1


def test_auto_steps_as_the_choice_it_makes(monkeypatch):
    """``auto`` on a large model of a native CPU is ``bfloat16``, bit for bit."""
    monkeypatch.setattr(step_compute_module, "native_bfloat16", lambda: True)
    weights = []
    for value in ("auto", "bfloat16", "none"):
        model = _wide()
        _trainer(model, value).train_gradient(1, None, [], [7])
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert torch.equal(weights[0], weights[1]) and not torch.equal(weights[0], weights[2])
