"""A device's round of federated LoRA fine-tuning: load the adapters, train, reply them.

As FlowerTune's clients do: the global adapters arrive in the train message, the device
trains them on its own text for a few steps with a fresh AdamW whose learning rate follows
a cosine over the rounds (:func:`dq_flower.harness.lora.adapters.cosine_lr`), and replies
only the adapters with its example count. The reply's metrics also carry the training
compute the round cost the device (``train-flops``: PyTorch's ``FlopCounterMode`` count of
one training step per window, forward and backward through the frozen base, times the
windows trained).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, cast

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from torch import nn

from dq_flower.compare.devices import model_flops
from dq_flower.harness.lora.adapters import adapter_record, cosine_lr, load_adapters
from dq_flower.harness.tasks.pretrain import byte_windows
from dq_flower.model_ops import next_token_loss
from dq_flower.node import node_key
from dq_flower.seeding import Purpose, round_rng

__all__ = ["LocalTraining", "lora_train", "ARRAYS_KEY"]

#: The adapters' record in train messages and replies, as Flower's ``FedAvg`` names it.
ARRAYS_KEY = "arrays"
_PREFIX = "lora-"


@dataclass(frozen=True)
class LocalTraining:
    """A device's local training per round: steps of ``batch_size`` windows, AdamW.

    The learning rate is ``cosine_lr(round, num_rounds, lr_max, lr_min)``; the server sends
    these in the train message's config (:meth:`config`), so every device trains alike.
    """

    steps: int = 10
    batch_size: int = 16
    lr_max: float = 3e-3
    lr_min: float = 3e-4
    num_rounds: int = 10
    seed: int = 0

    def config(self) -> ConfigRecord:
        """The knobs as a config record (``lora-steps``, ``lora-batch-size``, ...)."""
        return ConfigRecord({_PREFIX + k.replace("_", "-"): v for k, v in asdict(self).items()})

    @classmethod
    def from_config(cls, config: Any) -> LocalTraining:
        """Read the knobs back from a train message's config record."""
        values: dict[str, Any] = {}
        for name, default in asdict(cls()).items():
            key = _PREFIX + name.replace("_", "-")
            if key not in config:
                raise ValueError(f"the train message's config has no {key!r}")
            values[name] = type(default)(config[key])
        return cls(**values)


def _train_flops(model: nn.Module, length: int) -> float:
    """FLOPs of one training step per window (cached on the model: its shape never changes)."""
    cached = getattr(model, "_dq_train_flops", None)
    if cached is None or cached[0] != length:
        cached = (length, model_flops(model, (length,), tokens=True).train)
        model.__dict__["_dq_train_flops"] = cached
    return float(cached[1])


def lora_train(msg: Message, context: Context, text: str | torch.Tensor | np.ndarray, *,
               model: nn.Module, window: int = 128) -> Message:
    """One round on the device: the adapters of ``msg`` trained on ``text``, replied alone.

    ``model`` is the device's base model wrapped with adapters
    (:func:`dq_flower.harness.lora.adapters.with_adapters`); ``text`` is a string (read as
    UTF-8 bytes, consecutive windows of ``window``) or windows of token ids ``(n, length)``.
    """
    config = cast(ConfigRecord, msg.content["config"])
    cfg = LocalTraining.from_config(config)
    server_round = int(cast(int, config["server-round"]))
    windows = (byte_windows(text, window) if isinstance(text, str)
               else torch.as_tensor(np.asarray(text), dtype=torch.long))
    if windows.ndim != 2 or windows.shape[0] == 0:
        raise ValueError(f"this device has no windows of text to train on ({tuple(windows.shape)})")
    load_adapters(model, cast(ArrayRecord, msg.content[ARRAYS_KEY]))
    lr = cosine_lr(server_round, cfg.num_rounds, cfg.lr_max, cfg.lr_min)
    trainable = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(trainable, lr=lr)
    rng = round_rng(cfg.seed, server_round, node_key(context), Purpose.SHUFFLE)
    order = rng.permutation(windows.shape[0])
    model.train()  # the adapters act only in train mode (see adapters.py)
    losses = []
    for step in range(cfg.steps):
        idx = np.take(order, np.arange(step * cfg.batch_size, (step + 1) * cfg.batch_size),
                      mode="wrap")
        batch = windows[torch.as_tensor(idx)]
        opt.zero_grad(set_to_none=True)
        loss = next_token_loss(model(batch), batch).mean()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    flops = _train_flops(model, int(windows.shape[1])) * cfg.steps * cfg.batch_size
    metrics = MetricRecord({"num-examples": int(windows.shape[0]),
                            "train-loss": float(np.mean(losses)) if losses else float("nan"),
                            "train-flops": float(flops)})
    return Message(RecordDict({ARRAYS_KEY: adapter_record(model), "metrics": metrics}),
                   reply_to=msg)
