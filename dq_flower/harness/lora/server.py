"""The server of federated LoRA fine-tuning: Flower's own ``FedAvg`` on the adapters alone.

The ``ArrayRecord`` the strategy starts from, broadcasts and averages holds only the
adapter tensors (:func:`initial_adapters`); the base model stays where it is on every
party. Held-out perplexity is measured on the base with the averaged adapters merged in
(:class:`HeldOutText`), per device and over all of them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, MetricRecord
from flwr.serverapp.strategy import FedAvg
from torch import nn

from dq_flower.harness.lora.adapters import (
    LoraSettings,
    adapter_record,
    load_adapters,
    merged,
    with_adapters,
)
from dq_flower.harness.tasks.pretrain import byte_windows
from dq_flower.model_ops import next_token_loss
from dq_flower.text_input import token_windows

__all__ = ["HeldOutText", "lora_fedavg", "initial_adapters", "adapters_evaluate_fn",
           "weights_evaluate_fn", "held_out_windows"]


def lora_fedavg(num_nodes: int) -> FedAvg:
    """Flower's ``FedAvg`` over all ``num_nodes`` devices each round, no evaluate round.

    The server measures held-out perplexity itself (``evaluate_fn``).
    """
    return FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=num_nodes,
                  min_available_nodes=num_nodes)


def initial_adapters(base: nn.Module, settings: LoraSettings) -> ArrayRecord:
    """The adapters every device starts from (``lora_B`` zero: the base model itself)."""
    return adapter_record(with_adapters(base, settings))


@dataclass(frozen=True)
class HeldOutText:
    """Held-out windows ``(n, length)`` of token ids, per device, in the devices' order."""

    names: tuple[str, ...]
    windows: tuple[torch.Tensor, ...]

    @torch.no_grad()
    def metrics(self, model: nn.Module, batch: int = 128) -> MetricRecord:
        """``perplexity`` over every window (each weighs the same), ``perplexity-<name>``."""
        was = model.training
        model.eval()
        out: dict[str, float] = {}
        total, count = 0.0, 0
        for name, windows in zip(self.names, self.windows, strict=True):
            loss = sum(float(next_token_loss(model(windows[s:s + batch]),
                                             windows[s:s + batch]).sum())
                       for s in range(0, windows.shape[0], batch))
            out[f"perplexity-{name}"] = math.exp(loss / max(windows.shape[0], 1))
            total, count = total + loss, count + int(windows.shape[0])
        model.train(was)
        return MetricRecord({"perplexity": math.exp(total / max(count, 1)), **out})


def adapters_evaluate_fn(base: nn.Module, settings: LoraSettings, held: HeldOutText
                         ) -> Callable[[int, ArrayRecord], MetricRecord]:
    """``evaluate_fn`` for ``strategy.start``: the base with the round's adapters merged in."""
    wrapped = with_adapters(base, settings)

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        load_adapters(wrapped, arrays)
        return held.metrics(merged(wrapped))

    return evaluate


def weights_evaluate_fn(model: nn.Module, held: HeldOutText
                        ) -> Callable[[int, ArrayRecord], MetricRecord]:
    """``evaluate_fn`` for a strategy that trains the whole model (DQ, ``upload-all``)."""
    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model.load_state_dict(arrays.to_torch_state_dict())
        return held.metrics(model)

    return evaluate


def held_out_windows(names: Sequence[str], texts: Sequence[str], window: int,
                     per_device: int, tokenizer: Any = None) -> HeldOutText:
    """The first ``per_device`` consecutive windows of each held-out text.

    Tokens: the text's UTF-8 bytes, or the ids of ``tokenizer`` (an object with ``encode``).
    """
    if tokenizer is None:
        return HeldOutText(tuple(names),
                           tuple(byte_windows(t, window)[:per_device] for t in texts))
    return HeldOutText(tuple(names), tuple(
        torch.from_numpy(token_windows(t, window, tokenizer=tokenizer)[0][:per_device])
        for t in texts))
