"""Dict targets and a model of two heads: DQ hands the user's loss both dicts, as FedAvg does.

A user's app trains a class head and a regression head on a summed loss, its items
``(x, {"label": 3, "ink": 0.2})`` and its model returning ``{"logits": ..., "ink": ...}``:
every reply was refused on the device ("DQ carries one target a sample"). The targets now
travel side by side as float targets (the data spec names each part), and the server cuts
them back into the dict, the labels int64, and hands the user's loss the model's whole dict.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_digits
from torch import nn
from torch.utils.data import DataLoader, Dataset

import dq_flower
from dq_flower.data_input import as_inputs
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.losses import TargetLoss, model_output
from dq_flower.wire.dq_batch import DataSpec, spec_from_record, spec_record

X, Y = load_digits(return_X_y=True)
X = (X / 16).astype(np.float32)
INK = (X > 0.5).mean(1).astype(np.float32)


class TwoHeads(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Linear(64, 32), nn.ReLU())
        self.cls, self.reg = nn.Linear(32, 10), nn.Linear(32, 1)

    def forward(self, x):
        h = self.body(x)
        return {"logits": self.cls(h), "ink": self.reg(h).squeeze(-1)}


def summed(out, target):  # a mean over the batch, as users write it
    return (nn.functional.cross_entropy(out["logits"], target["label"])
            + nn.functional.mse_loss(out["ink"], target["ink"]))


class Rows(Dataset):
    def __init__(self, idx) -> None:
        self.idx = idx

    def __len__(self) -> int:
        return len(self.idx)

    def __getitem__(self, i):
        j = self.idx[i]
        return torch.from_numpy(X[j]), {"label": int(Y[j]), "ink": float(INK[j])}


def test_dict_targets_travel_side_by_side_named_in_the_spec():
    from dq_flower.data_input import target_parts

    rows = Rows(np.arange(6))
    assert target_parts(rows) == ("label=i", "ink=f")
    x, y, _ = as_inputs(rows)
    assert y.shape == (6, 2) and y[:, 0].tolist() == Y[:6].tolist()
    _, batched, _ = as_inputs(DataLoader(rows, batch_size=4))  # collated dicts of tensors
    assert np.array_equal(batched, y)
    spec = DataSpec((64,), "float", 2, target_parts=("label=i", "ink=f"))
    assert spec_from_record(spec_record(spec)) == spec
    with pytest.raises(ValueError, match="target parts"):
        DataSpec((64,), "float", 3, target_parts=("label=i", "ink=f"))


def test_the_users_loss_reads_the_dict_output_and_dict_targets_one_loss_a_row():
    loss = TargetLoss(summed)
    loss.follow(DataSpec((64,), "float", 2, target_parts=("label=i", "ink=f")))
    model = TwoHeads()
    out = model_output(model(torch.from_numpy(X[:5])))
    targets = torch.from_numpy(np.stack([Y[:5], INK[:5]], 1).astype(np.float32))
    rows = loss(out, targets)
    assert rows.shape == (5,)
    whole = summed(model(torch.from_numpy(X[:5])), {"label": torch.from_numpy(Y[:5]),
                                                     "ink": torch.from_numpy(INK[:5])})
    assert float(rows.mean().detach()) == pytest.approx(float(whole.detach()), rel=1e-5)


def test_dq_trains_a_two_head_model_on_dict_targets():
    def train(msg, context):
        k = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, Rows(np.arange(k, 1200, 3)))

    model = TwoHeads()
    strategy = dq_flower.DQStrategy(model, seed=0, loss_fn=summed)
    result = strategy.start(grid=InProcessGrid(train, 3), num_rounds=2,
                            initial_arrays=ArrayRecord(model.state_dict()))
    metrics = result.evaluate_metrics_serverapp[2]
    assert metrics["rejected"] == 0 and metrics["failed"] == 0 and metrics["stored"] > 0
    model.load_state_dict(result.arrays.to_torch_state_dict())
    out = model(torch.from_numpy(X[1200:]))
    assert (out["logits"].argmax(1).numpy() == Y[1200:]).mean() > 0.8  # was refused: 10%
    assert float((out["ink"] - torch.from_numpy(INK[1200:])).abs().mean()) < 0.1


def test_federated_evaluation_reads_dict_targets_with_the_users_loss():
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    model = TwoHeads()
    msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                              "config": ConfigRecord({"server-round": 1})}),
                  dst_node_id=1, message_type=MessageType.EVALUATE)
    ctx = Context(run_id=1, node_id=1, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    reply = dq_flower.client.evaluate(msg, ctx, Rows(np.arange(40)), model=model,
                                      loss_fn=summed)
    assert reply.content["metrics"]["num-examples"] == 40
    assert np.isfinite(reply.content["metrics"]["eval-loss"])
