"""The server's device selection on a machine without CUDA (the GPU path itself has not
run on a GPU): ``auto`` takes the CPU, an explicit ``cuda`` fails before any round."""

from __future__ import annotations

import pytest
import torch

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.model_ops import resolve_device


class _CountingGrid(InProcessGrid):
    """An in-process grid that counts the message exchanges it was asked for."""

    exchanges = 0

    def send_and_receive(self, messages, *, timeout=None):  # noqa: D102
        self.exchanges += 1
        return super().send_and_receive(messages, timeout=timeout)


def test_auto_chooses_the_cpu_and_cuda_the_gpu_by_what_torch_sees(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(ValueError, match="'cuda' was asked for but no CUDA GPU is visible"):
        resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # as on a GPU machine
    assert resolve_device("auto") == torch.device("cuda")
    assert resolve_device("cuda") == torch.device("cuda")
    assert resolve_device("cpu") == torch.device("cpu")


def test_explicit_cuda_without_a_gpu_fails_before_any_round(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    grid = _CountingGrid(client_app, 2)
    with pytest.raises(ValueError, match="no CUDA GPU is visible"):
        run_server(grid, build_run_config("dq", num_clients=2, rounds=1, device="cuda"))
    assert grid.exchanges == 0


def test_auto_without_a_gpu_trains_on_the_cpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = run_server(InProcessGrid(client_app, 2),
                        build_run_config("qsgd", num_clients=2, rounds=1, device="auto"))
    assert len(result.history) == 2 and result.history[1]["accuracy"] > 0
