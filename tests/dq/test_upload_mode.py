"""DQ's upload-mode: data, gradient and auto rounds (Prepare / Execute / Assert)."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Message, MetricRecord, RecordDict

from dq_flower.codecs import Payload, make
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.federation import FederationData
from dq_flower.dq.server.planner import UploadPlanner, first_estimates, gradient_estimate
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.model_ops import get_flat
from dq_flower.wire.dq_batch import GRADIENT_KEY

from .helpers import run_inprocess


# ---------------------------------------------------------------------------- planner
def test_planner_projects_both_modes_over_the_remaining_rounds():
    # Prepare: 100 bits per sample, 7 per data reply besides, 1,000 per gradient reply
    planner = UploadPlanner("auto", budget=10, resend=False, sample_bits=100.0,
                            reply_bits=7.0, gradient_bits=1000.0)
    # Execute / Assert: unknown clients upload the budget in every remaining round
    plan = planner.plan([1, 2], rounds_left=5)
    assert plan.data_bits == 2 * (50 * 100 + 5 * 7)
    assert plan.gradient_bits == 5 * 2 * 1000
    assert plan.mode == "gradient"  # 10,070 data bits against 10,000
    # each has 12 samples, 10 of them uploaded: 2 left, in one round
    planner.data.record_sent(1, examples=12, rows=10)
    planner.data.record_sent(2, examples=12, rows=10)
    plan = planner.plan([1, 2], rounds_left=5)
    assert plan.data_bits == 2 * (2 * 100 + 7) and plan.mode == "data"
    # a gradient reply leaves the uploaded count alone; nothing left: nothing to pay
    planner.data.record_sent(1, 12, 0)
    assert planner.samples_left(1, 5) == 2
    planner.data.record_sent(1, examples=12, rows=2)
    assert planner.samples_left(1, 5) == 0
    assert planner.plan([1], rounds_left=5).data_bits == 0


def test_planner_prefers_gradients_when_they_cost_less_and_honours_fixed_modes():
    cheap_gradients = dict(budget=64, resend=False, sample_bits=200.0, reply_bits=0.0,
                           gradient_bits=500.0)
    assert UploadPlanner("auto", **cheap_gradients).plan([1], 10).mode == "gradient"
    assert UploadPlanner("data", **cheap_gradients).plan([1], 10).mode == "data"
    expensive = dict(cheap_gradients, gradient_bits=1e9)
    assert UploadPlanner("auto", **expensive).plan([1], 10).mode == "data"
    assert UploadPlanner("gradient", **expensive).plan([1], 10).mode == "gradient"
    # resend: the data never runs out
    planner = UploadPlanner("auto", **dict(cheap_gradients, resend=True))
    planner.data.record_sent(1, examples=64, rows=64)
    assert planner.samples_left(1, 3) == 3 * 64


def test_planner_uses_the_measured_bits_and_keeps_them_in_its_state():
    planner = UploadPlanner("auto", budget=4, resend=False, sample_bits=100.0,
                            reply_bits=50.0, gradient_bits=1000.0)
    planner.measured(sample_bits=80.0)
    planner.measured(gradient_bits=float("nan"))  # nothing measured: keep the estimate
    planner.data.record_sent(7, 40, 4)
    data = FederationData()  # the counts are the federation's, in its checkpoint state
    data.load_state(planner.data.state(), lambda spec: None)
    restored = UploadPlanner("auto", budget=4, resend=False, sample_bits=0.0,
                             reply_bits=0.0, gradient_bits=0.0, data=data)
    restored.load_state(planner.state())
    assert (restored.sample_bits, restored.reply_bits, restored.gradient_bits) == (80, 50, 1000)
    assert restored.samples_left(7, 100) == 36
    older = FederationData()  # a checkpoint from when the planner kept the counts
    older.load_state({"planner": {**planner.state(), "clients": {"7": [40, 4]}}}, lambda spec: None)
    assert older.sent == {7: [40, 4]}
    with pytest.raises(ValueError, match="unknown estimate"):
        planner.measured(bytes_per_sample=1.0)


def test_first_estimates_are_the_sizes_of_synthetic_replies():
    # Prepare: 2-bit rows of d = 64 without entropy coding, sign gradients of D = 650
    task = TaskConfig(seed=0, model="logreg")
    info = task_info(task)
    cfg = DQConfig(bits=2, budget=16, entropy_coder="none")
    # Execute
    est = first_estimates(cfg, "sample", info.dim, 0, info.num_classes, None, 650, seed=0)
    gradient_bits = gradient_estimate(make("sign"), 650, seed=0)
    # Assert: per sample 2 bits per coordinate, two float32 range values, a 4-bit label, a
    # 16-bit id and a share of the one float32 weight; the envelope is a few hundred bytes
    assert est["sample_bits"] == pytest.approx(2 * 64 + 64 + 4 + 16 + 32 / 16)
    assert 8 * 100 < est["reply_bits"] < 8 * 1500
    assert 650 < gradient_bits < 650 + 8 * 1500


# ---------------------------------------------------------------------------- rounds
TASK = TaskConfig(num_partitions=2, seed=3, model="logreg")


def _strategy(**knobs):
    task = TASK
    info = task_info(task)
    return DQStrategy(build_model(task, info), seed=task.seed, config=DQConfig(**knobs)), info


def _reply(node, grad_payload, examples=100, record=GRADIENT_KEY, sent=None):
    """Node ``node``'s reply, answering the message ``sent`` to it (or a stand-in)."""
    content = RecordDict({record: grad_payload.to_record()})
    content["metrics"] = MetricRecord({"num-examples": examples, "partition-id": node})
    request = (sent or {}).get(NODE_ID_BASE + node)
    if request is None:
        request = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}),
                          dst_node_id=NODE_ID_BASE + node, message_type="train")
        request.metadata.__dict__["_message_id"] = f"req-{node}"
    return Message(content, reply_to=request)


def _sent(messages):
    """The round's messages by destination, with the ids a grid gives them when sent."""
    for i, msg in enumerate(messages):
        msg.metadata.__dict__["_message_id"] = f"sent-{i}"
    return {m.metadata.dst_node_id: m for m in messages}


def test_a_gradient_round_steps_by_the_example_weighted_mean_gradient():
    # Prepare: lossless codec, one server step, plain SGD
    strategy, _ = _strategy(upload_mode="gradient", gradient_codec="identity",
                            gradient_codec_params="", server_steps=1, momentum=0.0,
                            weight_decay=0.0, lr=0.5)
    grid = InProcessGrid(client_app, 2)
    msgs = list(strategy.configure_train(1, None, client_task_config(TASK, "dq"), grid))
    assert msgs[0].content["config"]["round-mode"] == "gradient"
    assert "model" in msgs[0].content.array_records
    dim = strategy.num_params
    g0, g1 = np.full(dim, 1.0, np.float32), np.full(dim, 4.0, np.float32)
    codec = make("identity")
    w0 = get_flat(strategy.model)
    # Execute
    sent = _sent(msgs)
    _, metrics = strategy.aggregate_train(1, [_reply(0, codec.encode(g0), 100, sent=sent),
                                              _reply(1, codec.encode(g1), 300, sent=sent)])
    # Assert: w1 = w0 - lr * (0.25 * g0 + 0.75 * g1)
    np.testing.assert_allclose(get_flat(strategy.model), w0 - 0.5 * 3.25, rtol=0, atol=1e-6)
    assert metrics["gradient-round"] == 1 and metrics["replies"] == 2
    assert metrics["up-payload-bits"] == 2 * 32 * dim


@pytest.mark.parametrize(("reply", "reason"), [
    (lambda d: _reply(0, make("sign").encode(np.ones(d, np.float32))), "encoded by 'sign'"),
    (lambda d: _reply(0, make("identity").encode(np.ones(d + 1, np.float32))),
     "gradient declares shape (651,)"),
    (lambda d: _reply(0, Payload("identity", (d,), {}, {"values": np.full(d, np.nan, np.float32)},
                                 nbits=32 * d)), "NaN or inf"),
    (lambda d: _reply(0, make("identity").encode(np.ones(d, np.float32)), examples=0),
     "num-examples"),
    (lambda d: _reply(0, make("identity").encode(np.ones(d, np.float32)), record="samples"),
     "misses its 'gradient'"),
])
def test_bad_gradient_replies_are_rejected_and_the_round_goes_on(reply, reason, caplog):
    # Prepare
    strategy, _ = _strategy(upload_mode="gradient", gradient_codec="identity",
                            gradient_codec_params="", server_steps=1)
    sent = _sent(list(strategy.configure_train(1, None, client_task_config(TASK, "dq"),
                                               InProcessGrid(client_app, 2))))
    good = _reply(1, make("identity").encode(np.ones(strategy.num_params, np.float32)),
                  sent=sent)
    bad = reply(strategy.num_params)
    bad.metadata.__dict__["_reply_to_message_id"] = sent[NODE_ID_BASE].metadata.message_id
    bad.metadata.group_id = "1"
    w0 = get_flat(strategy.model)
    # Execute
    _, metrics = strategy.aggregate_train(1, [bad, good])
    # Assert
    assert metrics["rejected"] == 1 and metrics["replies"] == 1
    assert reason in caplog.text
    assert np.isfinite(get_flat(strategy.model)).all()
    assert not np.array_equal(get_flat(strategy.model), w0)


# ---------------------------------------------------------------------------- end to end
def _uplink_to(history, target):
    for row in history:
        if row["accuracy"] >= target:
            return row["cum_up_bytes"]
    return None


def test_auto_on_the_mlp_is_the_data_run_since_gradients_cost_more():
    # Prepare / Execute: D = 9,610, so a qsgd gradient (about 39 kbit without the lossless
    # stage) costs more than a client's whole share of the data at 2 bits
    raw = {"entropy-coder": "none", "upload-schedule": "fixed"}
    data, _ = run_inprocess(rounds=8, model="mlp", seed=1, **{"upload-mode": "data"}, **raw)
    auto, _ = run_inprocess(rounds=8, model="mlp", seed=1, **{"upload-mode": "auto"}, **raw)
    # Assert
    assert all(r["gradient_round"] == 0 for r in auto.history[1:])
    assert [r["accuracy"] for r in auto.history] == [r["accuracy"] for r in data.history]


def test_auto_on_logreg_costs_no_more_than_the_cheaper_mode_plus_a_small_margin():
    # Prepare: D = 650: per round a gradient is cheaper than a batch of samples, but the
    # data is paid once; auto starts with a gradient round (client sizes unknown yet)
    # (without the lossless stage, which makes logreg's qsgd gradient the cheaper mode
    # throughout)
    runs = {mode: run_inprocess(rounds=20, model="logreg", seed=1,
                                **{"upload-mode": mode, "entropy-coder": "none",
                                   "upload-schedule": "fixed"})[0]
            for mode in ("data", "gradient", "auto")}
    # Execute
    total = {m: r.history[-1]["cum_up_bytes"] for m, r in runs.items()}
    # Assert: besides its first round (a gradient round: client sizes are not known yet),
    # auto's uplink is within 2% of the cheaper fixed mode's, and it trains like it
    first = runs["auto"].history[1]["up_bytes"]
    assert total["auto"] - first <= 1.02 * min(total["data"], total["gradient"])
    assert runs["auto"].history[1]["gradient_round"] == 1
    assert runs["auto"].history[-1]["gradient_round"] == 0
    assert runs["auto"].history[-1]["accuracy"] >= runs["data"].history[-1]["accuracy"] - 0.03
    assert _uplink_to(runs["auto"].history, 0.9) is not None


def test_a_replayed_gradient_round_gets_the_same_error_fed_reply():
    # Prepare: a biased gradient codec, so the client keeps an error-feedback residual
    strategy, _ = _strategy(upload_mode="gradient", gradient_codec="sign",
                            gradient_codec_params="", server_steps=1)
    grid = InProcessGrid(client_app, 2)
    config = client_task_config(TASK, "dq")
    replies = {}
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, None, config, grid))
        replies[rnd] = grid.send_and_receive(msgs)
        strategy.aggregate_train(rnd, replies[rnd])
    # Execute: round 2 is sent again (a server resumed from its round-1 checkpoint)
    again = grid.send_and_receive(msgs)
    # Assert: the same payload as the first time, from the same residual
    for first, second in zip(replies[2], again, strict=True):
        a = Payload.from_record(first.content.array_records[GRADIENT_KEY])
        b = Payload.from_record(second.content.array_records[GRADIENT_KEY])
        for name, buf in a.buffers.items():
            np.testing.assert_array_equal(buf, b.buffers[name])
    state = grid.contexts[NODE_ID_BASE].state
    assert any(k.startswith("dq-ef-gradient") for k in state.array_records)
    assert "dq-ef-after@2/dq-ef-gradient" in state.array_records


def test_a_gradient_rejected_by_the_norm_screen_is_counted_like_a_baselines_update():
    # Prepare: round 1 sets the norm screen's reference; in round 2 node 0 sends 1e6 x
    strategy, _ = _strategy(upload_mode="gradient", gradient_codec="identity",
                            gradient_codec_params="", server_steps=1)
    grid = InProcessGrid(client_app, 2)
    config = client_task_config(TASK, "dq")
    dim = strategy.num_params
    codec = make("identity")
    ones = np.ones(dim, np.float32)
    sent = _sent(list(strategy.configure_train(1, None, config, grid)))
    strategy.aggregate_train(1, [_reply(0, codec.encode(ones), sent=sent),
                                 _reply(1, codec.encode(ones), sent=sent)])
    sent = _sent(list(strategy.configure_train(2, None, config, grid)))
    # Execute
    _, metrics = strategy.aggregate_train(2, [_reply(0, codec.encode(ones * 1e6), sent=sent),
                                              _reply(1, codec.encode(ones), sent=sent)])
    # Assert: rejected, yet its bits went over the wire and count (one meaning per key)
    assert metrics["rejected"] == 1 and metrics["replies"] == 1
    assert metrics["coded-replies"] == 2
    assert metrics["up-payload-bits"] == metrics["up-raw-payload-bits"] == 2 * 32 * dim
