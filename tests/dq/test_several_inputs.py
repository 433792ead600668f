"""A model of two inputs, ``model(x_num, x_cat)``, on ``TensorDataset(x_num, x_cat, y)``.

The device sends both inputs side by side in one flat row and their layouts in its data
spec (``input-parts``); DQ's server and the node's scoring model are handed the inputs
split (:mod:`dq_flower.model_inputs`), the categories as int64 for the embeddings. Before,
the dataset's second tensor went up as float targets and every reply was rejected.
"""

from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord
from torch import nn
from torch.utils.data import TensorDataset

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.wire.dq_batch import INPUT_PARTS_KEY, DataSpec, spec_from_record, spec_record
from tests.apps.runner import run_app

CARDINALITIES = (6, 4, 9)


def _app() -> types.ModuleType:
    """5 nodes of a table: 4 measured numbers and 3 label-encoded categories (int64)."""
    rng = np.random.default_rng(0)
    n = 4000
    cat = np.stack([rng.integers(0, c, n) for c in CARDINALITIES], 1)
    num = np.stack([rng.normal(40, 12, n), rng.normal(0, 1, n), rng.uniform(0, 60, n),
                    rng.normal(0, 1, n)], 1).astype(np.float32)
    effects = [rng.normal(0, 2.0, c) for c in CARDINALITIES]
    logit = sum(effects[i][cat[:, i]] for i in range(3)) + 0.8 * num[:, 1]
    y = (logit + rng.logistic(size=n) > 0).astype(np.int64)
    app = types.ModuleType("two_inputs")
    app.NAME, app.NUM_NODES, app.ROUNDS, app.DQ_CLIENT_MODEL = "two-inputs", 4, 4, True

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.embs = nn.ModuleList([nn.Embedding(c, 3) for c in CARDINALITIES])
            self.bn = nn.BatchNorm1d(4)
            self.mlp = nn.Sequential(nn.Linear(13, 16), nn.ReLU(), nn.Linear(16, 2))

        def forward(self, x_num, x_cat):
            parts = [emb(x_cat[:, i]) for i, emb in enumerate(self.embs)]
            return self.mlp(torch.cat([self.bn(x_num), *parts], 1))

    def load_local_data(pid):
        idx = np.arange(pid, 3200, app.NUM_NODES)
        return TensorDataset(torch.from_numpy(num[idx]), torch.from_numpy(cat[idx]),
                             torch.from_numpy(y[idx]))

    def score(model, xs, ys):
        with torch.no_grad():
            pred = model(torch.from_numpy(xs[0]), torch.from_numpy(xs[1])).argmax(1).numpy()
        return float((pred == ys).mean())

    app.Net, app.load_local_data, app.score = Net, load_local_data, score
    app.test_set = lambda: ((num[3200:], cat[3200:]), y[3200:])
    app.local_train = None
    return app


def test_dq_trains_a_model_of_two_inputs_at_its_defaults():
    app = _app()
    run = run_app(app, "dq")
    # measured: 0.814 (the noise-free logit's sign gets 0.820 of the test rows right);
    # before, every reply was rejected and the model stayed at its start (0.411)
    assert run.final > 0.78, run.scores
    assert run.final > run.scores[0] + 0.3


def test_input_parts_travel_in_the_spec_and_bad_ones_are_refused():
    spec = DataSpec((7,), "class", inputs=("f4", "i3"))
    assert spec_from_record(spec_record(spec)) == spec
    lengths = DataSpec((41,), "class", inputs=("f20x2", "i"))  # a sequence and its length
    assert spec_from_record(spec_record(lengths)) == lengths
    assert INPUT_PARTS_KEY not in spec_record(DataSpec((7,)))
    for bad in (["f4", "i2"], ["f4"], ["x4", "i3"], "f4i3", [4, 3], ["f0", "i7"]):
        record = spec_record(DataSpec((7,)))
        record[INPUT_PARTS_KEY] = bad
        with pytest.raises(PayloadError, match="input-parts"):
            spec_from_record(ConfigRecord(dict(record)))


def test_a_node_of_other_layouts_is_refused_by_the_agreed_spec(caplog):
    """A node whose rows hold the same 7 values split 3 + 4: its spec is not the round's."""
    app = _app()
    honest = app.load_local_data

    def load_local_data(pid):
        if pid < 3:
            return honest(pid)
        num, cat, y = honest(pid).tensors
        rows = torch.cat([num, cat.float()], 1)
        return TensorDataset(rows[:, :3], rows[:, 3:].long(), y)

    app.load_local_data, app.ROUNDS = load_local_data, 2
    with caplog.at_level("WARNING"):
        run = run_app(app, "dq")
    assert "its data (samples (7,) as f3 + i4, class targets) is not the round's, agreed on " \
           "(samples (7,) as f4 + i3, class targets)" in caplog.text
    assert run.final > run.scores[0] + 0.2, run.scores


def test_a_resumed_server_splits_the_rows_as_its_checkpoint_says():
    """A fresh model on resume has no split until the spec, loaded, sets it."""
    app = _app()
    model = app.Net()
    strategy = dq_flower.DQStrategy(model, seed=0)
    strategy.intake.fix_spec(DataSpec((7,), "class", inputs=("f4", "i3")), 2)
    state = strategy.state_dict()
    fresh_model = app.Net()
    resumed = dq_flower.DQStrategy(fresh_model, seed=0)
    resumed.load_state_dict(state)
    rows = torch.cat([torch.randn(3, 4), torch.tensor([[1.0, 2.0, 3.0]] * 3)], 1)
    fresh_model.eval()
    assert fresh_model(rows).shape == (3, 2)  # before: the model was called with one tensor


def test_federated_evaluation_hands_a_model_of_two_inputs_its_inputs():
    from flwr.app import ArrayRecord, Context, Message, MessageType, RecordDict

    from dq_flower.harness.inprocess import InProcessGrid

    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    app = _app()
    model = app.Net()
    model.eval()
    content = RecordDict({"arrays": ArrayRecord(model.state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    msg = Message(content, dst_node_id=5, message_type=MessageType.EVALUATE)
    msg.metadata.__dict__["_message_id"] = "e2"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    data = app.load_local_data(0)
    reply = dq_flower.client.evaluate(msg, ctx, data, model=model)
    num, cat, y = data.tensors
    with torch.no_grad():
        expected = float((model(num, cat).argmax(1) == y).float().mean())
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == len(y) and metrics["eval-acc"] == pytest.approx(expected)
