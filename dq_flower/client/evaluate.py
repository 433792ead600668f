"""Federated evaluation on a device's own held-out data (this needs the model: PyTorch)."""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import Context, Message, MetricRecord, MetricRecordValues, RecordDict

from dq_flower.data_input import Keys, as_inputs, forward_keys, ids_below, target_parts
from dq_flower.torch_support import require_torch
from dq_flower.wire.partition import names_partition
from dq_flower.wire.targets import LABEL_BASE_KEY, binary_targets, model_targets

if TYPE_CHECKING:
    import torch

    from dq_flower.model_ops import LossFn

__all__ = ["evaluate"]


@names_partition
def evaluate(msg: Message, context: Context, data: Any, *, model: torch.nn.Module,
             loss_fn: LossFn | None = None, keys: Keys | None = None) -> Message:
    """Evaluate the global model the message carries on ``data``; reply its metrics.

    The message holds the model's state dict under ``arrays`` (as Flower's ``FedAvg`` and
    this package's strategies send it), or as its only ``ArrayRecord`` (a strategy's
    ``arrayrecord_key``). The reply's ``MetricRecord`` has ``eval-loss``, ``eval-acc``
    (class targets only) and ``num-examples`` (the server's weight). ``data`` is any form
    of :mod:`dq_flower.data_input`; ``keys`` names a dict sample's input and target. An
    error raised here ends with the node's ``[partition-id K]``.
    """
    del context  # evaluation keeps no state
    require_torch("federated evaluation (fraction-evaluate > 0)")
    from dq_flower.losses import TargetLoss, binary_loss, per_sample  # PyTorch, checked above
    from dq_flower.model_ops import embedding_vocab, output_width  # PyTorch, checked above
    from dq_flower.model_ops import evaluate as evaluate_model  # PyTorch, checked above

    records = msg.content.array_records  # a strategy's arrayrecord_key: its only record
    arrays = records.get("arrays", next(iter(records.values())) if len(records) == 1 else None)
    if arrays is None:
        raise ValueError("the evaluate message carries no 'arrays' record (nor one other)")
    model.load_state_dict(arrays.to_torch_state_dict())
    from dq_flower.model_inputs import forward_names, positional_inputs, split_inputs  # PyTorch

    if keys is None and (names := forward_names(model)):  # dict samples: inputs by name
        keys = forward_keys(data, names)
    x, y, inputs = as_inputs(data, keys, one_input=positional_inputs(model) == 1)
    if inputs:  # several inputs side by side: the model is handed them split

        split_inputs(model, inputs)
    if x.shape[0] == 0:  # a node with no rows yet: weighs nothing in the server's average
        metrics_none: dict[str, MetricRecordValues] = {"eval-loss": 0.0, "num-examples": 0}
        return Message(content=RecordDict({"metrics": MetricRecord(metrics_none)}),
                       reply_to=msg)
    config = next(iter(msg.content.config_records.values()), None)  # labels counted from 1?
    base = config.get(LABEL_BASE_KEY, 0) if config is not None else 0
    y = model_targets(y, output_width(model) or 0,  # e.g. a CSV's labels read as floats
                      base if isinstance(base, int) else 0)
    if ids_below(x, embedding_vocab(model)):  # word ids, as the model reads them
        x = x.astype(np.int64)
    if loss_fn is None and binary_targets(y):  # 0/1 float targets: the model gives logits
        loss_fn = binary_loss
    if loss_fn is not None and (parts := target_parts(data)):  # dict targets: as on the server
        loss_fn = TargetLoss(per_sample(loss_fn))
        loss_fn.follow(SimpleNamespace(target="float", target_parts=parts))
    loss, acc = evaluate_model(model, x, y, loss_fn=loss_fn)
    metrics: dict[str, MetricRecordValues] = {"eval-loss": float(loss),
                                               "num-examples": int(x.shape[0])}
    if not math.isnan(acc):
        metrics["eval-acc"] = float(acc)
    return Message(content=RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)
