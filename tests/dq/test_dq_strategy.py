"""DQ strategy through the in-process grid: Prepare / Execute / Assert."""

import numpy as np
import torch
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from dq_flower.codecs import make
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import Asked
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import TaskInfo, build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_partition
from dq_flower.harness.tasks.models import make_model
from dq_flower.model_ops import weighted_loss_grad
from dq_flower.wire.dq_batch import SPEC_KEY, DataSpec, spec_record
from dq_flower.wire.dq_upload import encode_batch

from .helpers import run_inprocess

TASK = TaskConfig(num_partitions=2, seed=3)


def _strategy(**knobs):
    """A strategy for one round's mechanics: the fixed schedule unless a test says not."""
    knobs.setdefault("upload_schedule", "fixed")
    info = task_info(TASK)
    return DQStrategy(build_model(TASK, info), seed=TASK.seed, **knobs), TASK, info


def _train_config():
    """What the harness sends with every round: the method and the task's client keys."""
    return client_task_config(TASK, "dq")


def _mock_reply(node, x, y, ids, num_classes, bits=2, weights=None, metrics=None,
                shape=(1, 8, 8)):
    q = make("uniform", bits=bits, stochastic=True)
    payload = q.encode(x, np.random.default_rng(0))
    # an honest top-k client: every row stands for candidates / rows samples
    w = np.full(len(y), 100.0 / len(y), dtype=np.float32) if weights is None else weights
    content, _ = encode_batch(payload, y, ids, w, num_classes, 1000)
    content[SPEC_KEY] = spec_record(DataSpec(shape))
    content["metrics"] = MetricRecord(metrics or {"num-examples": 100, "candidates": 100,
                                                  "selected": len(y)})
    request = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}),
                      dst_node_id=node, message_type="train")
    request.metadata.__dict__["_message_id"] = f"req-{node}"
    reply = Message(content, reply_to=request)
    return reply


def test_configure_train_sends_config_and_model_only_when_needed():
    strategy, _, _ = _strategy()
    grid = InProcessGrid(client_app, 2)
    msgs = list(strategy.configure_train(1, None, _train_config(), grid))
    assert [m.metadata.dst_node_id for m in msgs] == [NODE_ID_BASE, NODE_ID_BASE + 1]
    cfg = msgs[0].content["config"]
    assert cfg["method"] == "dq" and cfg["num-partitions"] == 2 and cfg["server-round"] == 1
    assert "budget" not in cfg  # defaults are not sent
    assert "lr" not in cfg and "server-steps" not in cfg  # server-only knobs never travel
    assert "model" not in msgs[0].content.array_records

    strategy, _, _ = _strategy(compensation="identity", lr=0.2)
    msgs = list(strategy.configure_train(1, None, _train_config(), grid))
    assert "lr" not in msgs[0].content["config"]
    assert "model" in msgs[0].content.array_records

    # the adaptive schedule sends each node its own ask; the first round's is sized so
    # that 10 rows per class (10 digits) can be held out at 10%: 1,000 over 2 nodes
    strategy, _, _ = _strategy(upload_schedule="adaptive", budget=10, scorer="loss")
    msgs = list(strategy.configure_train(1, None, _train_config(), grid))
    assert [m.content["config"]["budget"] for m in msgs] == [500, 500]
    assert msgs[0].content["config"]["scorer"] == "uniform"  # nothing trained yet
    assert "model" not in msgs[0].content.array_records
    strategy, _, _ = _strategy(upload_schedule="adaptive", budget=10, min_holdout_rows=0)
    msgs = list(strategy.configure_train(1, None, _train_config(), grid))
    assert [m.content["config"]["budget"] for m in msgs] == [10, 10]  # at least the budget


def test_aggregate_train_stores_valid_replies_and_rejects_bad_ones():
    strategy, _, info = _strategy(server_steps=3, budget=8)
    rng = np.random.default_rng(0)
    x = rng.random((8, info.dim)).astype(np.float32)
    y = rng.integers(0, 10, 8)
    good = _mock_reply(NODE_ID_BASE, x, y, np.arange(8), info.num_classes)
    bad_labels = _mock_reply(NODE_ID_BASE + 1, x, y, np.arange(8), 32)  # 5-bit labels
    too_many = _mock_reply(NODE_ID_BASE + 2, np.vstack([x, x]), np.concatenate([y, y]),
                           np.arange(16), info.num_classes)
    before = [p.detach().clone() for p in strategy.model.parameters()]

    arrays, metrics = strategy.aggregate_train(1, [good, bad_labels, too_many])

    assert metrics["selected"] == 8 and metrics["stored"] == 8
    assert metrics["rejected"] == 2 and metrics["replies"] == 1
    assert arrays is not None
    after = list(strategy.model.parameters())
    moved = any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    assert moved
    # The same samples again from the same node (a replay) are dropped and counted, never
    # stored twice; the reply itself is not rejected (its other rows would be kept).
    again = _mock_reply(NODE_ID_BASE, x, y, np.arange(8), info.num_classes)
    _, metrics = strategy.aggregate_train(2, [again])
    assert metrics["rejected"] == 0 and metrics["duplicate-rows"] == 8
    assert metrics["stored"] == 8 and metrics["selected"] == 0


def test_first_step_gradient_equals_true_gradient_with_lossless_compensation():
    strategy, task, info = _strategy(compensation="identity", bits=1, budget=16)
    grid = InProcessGrid(client_app, 2)
    msgs = list(strategy.configure_train(1, None, _train_config(), grid))
    replies = grid.send_and_receive(msgs)
    budget = strategy.cfg.budget
    fresh, _ = strategy.intake.adopt([strategy.intake.validate_reply(r, 1, Asked(budget=budget))
                                      for r in replies], 0)  # what the round agrees on

    _, grad = strategy.fresh_gradient(fresh)

    total = sum(u.candidates for u in fresh)
    xs, ys, ws = [], [], []
    for pid, batch in enumerate(u.batch for u in fresh):
        x, y, _ = load_partition(task.dataset, pid, 2, task.partition, task.dirichlet_alpha,
                                 task.seed)
        xs.append(x[batch.ids])
        ys.append(y[batch.ids])
        ws.append(batch.weights / total)
    _, true_grad = weighted_loss_grad(strategy.model, np.concatenate(xs), np.concatenate(ys),
                                      np.concatenate(ws))
    _, quant_grad = weighted_loss_grad(strategy.model, np.concatenate([u.x for u in fresh]),
                                       np.concatenate(ys), np.concatenate(ws))
    np.testing.assert_allclose(grad, true_grad, rtol=1e-4, atol=1e-6)
    # and 1-bit data alone is far from it, so the comparison can fail
    assert np.linalg.norm(quant_grad - true_grad) > 10 * np.linalg.norm(grad - true_grad)


def test_uploaded_samples_are_not_resent_until_exhausted():
    result, grid = run_inprocess(num_clients=2, rounds=4, budget=300, server_steps=2,
                                 upload_schedule="fixed")
    selected = [row["selected"] for row in result.history[1:]]
    n_train = sum(len(load_partition("digits", p, 2, "iid", 0.5, 0)[1]) for p in range(2))
    assert sum(selected) == n_train  # every sample exactly once
    assert selected[-1] == 0  # nothing left to send in the last round
    assert result.history[-1]["stored"] == n_train


def test_store_memory_is_close_to_packed_payload_bytes():
    # Fashion-MNIST-shaped rows (d = 784), 2 bits, 5 uploads of 100 samples.
    info = TaskInfo(10, (1, 28, 28), 784)
    model = make_model("logreg", info.input_shape, 10)
    strategy = DQStrategy(model, config=DQConfig(bits=2, budget=100, selection_rule="sample"),
                          data_spec=DataSpec((1, 28, 28)))
    rng = np.random.default_rng(0)
    payload_bytes = 0
    for k in range(5):
        x = (rng.random((100, 784)) * (rng.random((100, 784)) > 0.5)).astype(np.float32)
        reply = _mock_reply(NODE_ID_BASE + k, x, rng.integers(0, 10, 100), np.arange(100), 10,
                            weights=rng.uniform(1, 2, 100).astype(np.float32),
                            shape=(1, 28, 28))
        batch = strategy.intake.validate_reply(reply, 1, Asked(budget=100)).batch
        strategy.store.add(strategy.intake.rows(batch, NODE_ID_BASE + k,
                                                strategy.intake.packed(batch)))
        payload_bytes += batch.payload_bits / 8
    assert strategy.store.nbytes <= 1.2 * payload_bytes
    assert strategy.store.nbytes < 0.1 * 500 * 784 * 4  # far below float32 rows


def test_result_does_not_depend_on_the_order_replies_arrive_in():
    grid = InProcessGrid(client_app, 3)
    strategy, _, _ = _strategy(server_steps=5)
    replies = grid.send_and_receive(strategy.configure_train(1, None, _train_config(), grid))
    models = []
    for order in ([0, 1, 2], [2, 0, 1]):
        fresh_strategy, _, _ = _strategy(server_steps=5)
        fresh_strategy.aggregate_train(1, [replies[i] for i in order])
        models.append([p.detach().clone() for p in fresh_strategy.model.parameters()])
    assert all(torch.equal(a, b) for a, b in zip(*models, strict=True))
