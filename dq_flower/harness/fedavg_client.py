"""Client side of Flower's FedAvg: E local epochs of SGD, reply the float32 weights.

The reply carries the new state dict under ``arrays`` and a ``MetricRecord`` with
``num-examples`` (FedAvg's weight) and ``train-loss``.
"""

from __future__ import annotations

import time
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from dq_flower.baselines.config import FedAvgConfig
from dq_flower.config import read
from dq_flower.model_ops import LossFn, resolve_loss, state_arrays, targets_tensor
from dq_flower.seeding import Purpose, round_rng

__all__ = ["fedavg_train", "local_epochs", "ARRAYS_KEY"]

#: Key of the model record, as Flower's FedAvg names it (``arrayrecord_key``).
ARRAYS_KEY = "arrays"


def local_epochs(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, cfg: FedAvgConfig,
                 rng: np.random.Generator, loss_fn: LossFn | None = None) -> float:
    """Train ``model`` in place for ``cfg.local_epochs`` epochs; return the mean batch loss."""
    opt = torch.optim.SGD(model.parameters(), lr=cfg.client_lr, momentum=cfg.client_momentum)
    dev = next(model.parameters()).device
    fn = resolve_loss(loss_fn)
    xt = torch.as_tensor(x, dtype=torch.float32).to(dev)
    yt = targets_tensor(y, dev)
    model.train()
    losses = []
    for _ in range(cfg.local_epochs):
        order = torch.as_tensor(rng.permutation(x.shape[0])).to(dev)
        for start in range(0, x.shape[0], cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            opt.zero_grad(set_to_none=True)
            loss = fn(model(xt[idx]), yt[idx]).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss.detach()))
    return float(np.mean(losses)) if losses else float("nan")


def fedavg_train(msg: Message, context: Context, x: np.ndarray, y: np.ndarray,
                 model: torch.nn.Module, seed: int, node: int,
                 loss_fn: LossFn | None = None) -> Message:
    """Handle one FedAvg round: load the weights, train locally, reply weights and metrics."""
    del context  # FedAvg's client keeps no state
    t0 = time.process_time()
    config: dict[str, Any] = dict(msg.content["config"].items())
    cfg = read(FedAvgConfig, config)
    server_round = int(config["server-round"])
    if x.shape[0] == 0:
        raise ValueError("this node has no training data")
    model.load_state_dict(cast(ArrayRecord, msg.content[ARRAYS_KEY]).to_torch_state_dict())
    loss = local_epochs(model, x, y, cfg, round_rng(seed, server_round, node, Purpose.SHUFFLE),
                        loss_fn)
    metrics = MetricRecord({"num-examples": int(x.shape[0]), "train-loss": loss,
                            "client-time-s": time.process_time() - t0})
    content = RecordDict({ARRAYS_KEY: state_arrays(model), "metrics": metrics})
    return Message(content=content, reply_to=msg)
