"""CompressedUpdates + compression_mod: coded updates for any Flower strategy.

The user's ``train()`` (``digits_app``: Flower's quickstart loop, SGD with momentum) runs
unchanged inside the mod; the wrapper decodes every reply into weights before the inner
Flower strategy aggregates them. Replies travel through the in-process grid.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.serverapp.strategy import FedAdam, FedAvg, FedProx

import dq_flower
from dq_flower.codecs import Payload, make, names
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.wire.compressed_update import MODEL_KEY, RAW_KEY, UPDATE_KEY
from tests.compression import digits_app
from tests.compression.digits_app import Net, make_app

QSGD2 = {"codec": "qsgd", "codec_params": {"levels": 1, "bucket": 64}}  # 2-bit codes


@pytest.fixture(autouse=True)
def _quiet():
    logging.getLogger("flwr").setLevel(logging.WARNING)
    yield
    logging.getLogger("flwr").setLevel(logging.INFO)


def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    model = Net()
    model.load_state_dict(arrays.to_torch_state_dict())
    loss, acc = digits_app.test(model)
    return MetricRecord({"accuracy": acc, "loss": loss})


def run(inner, wrap: dict | None, rounds: int, lr: float = 0.05, nodes: int = 4,
        hostile_scale: float | None = None):
    """One run of the digits app: (uplink bytes, downlink bytes, Result)."""
    torch.manual_seed(0)
    model = Net()
    strategy = dq_flower.CompressedUpdates(inner, **wrap) if wrap is not None else inner
    mods = [dq_flower.compression_mod] if wrap is not None else []
    grid = dq_flower.MeasuredGrid(InProcessGrid(make_app(mods, hostile_scale), nodes))
    result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                            num_rounds=rounds, train_config=ConfigRecord({"lr": lr}),
                            evaluate_fn=central)
    return grid.up_bytes, grid.down_bytes, result


def accuracy(result, server_round: int) -> float:
    return float(result.evaluate_metrics_serverapp[server_round]["accuracy"])


# ---------------------------------------------------------------------- end to end
def test_qsgd2_cuts_fedavg_uplink_8x_and_learns():
    # Execute
    up_plain, down_plain, plain = run(FedAvg(fraction_evaluate=0.0), None, rounds=3)
    up, down, coded = run(FedAvg(fraction_evaluate=0.0), QSGD2, rounds=3)
    # Assert: measured message bytes, the model learns, the broadcast is FedAvg's
    assert up_plain >= 8 * up, (up_plain, up)
    assert accuracy(coded, 3) > accuracy(coded, 0) + 0.1
    assert abs(down - down_plain) < 0.01 * down_plain
    # the wrapper's figures are ServerApp-side, beside evaluate_fn's own
    figures = coded.evaluate_metrics_serverapp[3]
    assert figures["replies"] == 4 and figures["rejected"] == 0
    assert 0 < figures["up-payload-bits"] <= 8 * up
    assert "up-payload-bits" not in coded.train_metrics_clientapp[3]
    assert "train_loss" in coded.train_metrics_clientapp[3]


def test_a_reversed_four_times_update_is_left_out_by_the_direction_screen():
    """One node of five sends -4x its update (a fault as much as an attack): at the
    defaults FedAvg inside the wrapper ends within 5 points of the honest control; with
    the direction screen and the clip off (``min_cosine=-1``, ``clip_factor=0``) the same
    node wrecks the model."""
    wrapped = {**QSGD2}
    _, _, control = run(FedAvg(fraction_evaluate=0.0), wrapped, rounds=20, nodes=5)
    _, _, attacked = run(FedAvg(fraction_evaluate=0.0), wrapped, rounds=20, nodes=5,
                         hostile_scale=-4.0)
    _, _, unscreened = run(FedAvg(fraction_evaluate=0.0),
                           {**QSGD2, "min_cosine": -1.0, "clip_factor": 0.0},
                           rounds=20, nodes=5, hostile_scale=-4.0)
    assert accuracy(attacked, 20) >= accuracy(control, 20) - 0.05, (
        accuracy(attacked, 20), accuracy(control, 20))
    assert accuracy(unscreened, 20) < accuracy(control, 20) - 0.3
    # from its third round on the node is left out (or, at times, rejected for its norm);
    # no honest node is: directions are compared at the median norm
    figures = [attacked.evaluate_metrics_serverapp[r] for r in range(1, 21)]
    screened = [int(f["misaligned"]) + int(f["rejected"]) for f in figures]
    assert screened[:2] == [0, 0] and all(n == 1 for n in screened[2:]), screened
    assert sum(int(f["misaligned"]) for f in figures) >= 12, screened


@pytest.mark.slow
def test_qsgd2_under_fedavg_matches_plain_fedavg_within_2_points():
    # Execute (20 rounds each, about 8 s each)
    up_plain, _, plain = run(FedAvg(fraction_evaluate=0.0), None, rounds=20)
    up, _, coded = run(FedAvg(fraction_evaluate=0.0), QSGD2, rounds=20)
    # Assert
    assert up_plain >= 8 * up, (up_plain, up)
    assert accuracy(coded, 20) >= accuracy(plain, 20) - 0.02, (accuracy(coded, 20),
                                                               accuracy(plain, 20))
    assert accuracy(plain, 20) > 0.9


@pytest.mark.slow
@pytest.mark.parametrize("inner", [
    lambda: FedProx(fraction_evaluate=0.0, proximal_mu=0.1),
    lambda: FedAdam(fraction_evaluate=0.0, eta=0.03),
], ids=["fedprox", "fedadam"])
def test_qsgd2_under_fedprox_and_fedadam_within_2_points(inner):
    # measured: FedProx 0.933 plain / 0.936 coded, FedAdam 0.928 / 0.939 (20 rounds)
    up_plain, _, plain = run(inner(), None, rounds=20)
    up, _, coded = run(inner(), QSGD2, rounds=20)
    assert up_plain >= 8 * up
    assert accuracy(coded, 20) >= accuracy(plain, 20) - 0.02
    assert accuracy(plain, 20) > 0.85


def test_fedprox_and_fedadam_run_wrapped():
    for inner in (FedProx(fraction_evaluate=0.0, proximal_mu=0.1),
                  FedAdam(fraction_evaluate=0.0, eta=0.01)):
        _, _, result = run(inner, QSGD2, rounds=2)
        assert result.evaluate_metrics_serverapp[2]["replies"] == 4
        assert accuracy(result, 2) > accuracy(result, 0)


def test_a_lossless_codec_gives_fedavg_exactly():
    _, _, plain = run(FedAvg(fraction_evaluate=0.0), None, rounds=2)
    _, _, coded = run(FedAvg(fraction_evaluate=0.0), {"codec": "identity"}, rounds=2)
    a, b = plain.arrays.to_numpy_ndarrays(), coded.arrays.to_numpy_ndarrays()
    for x, y in zip(a, b, strict=True):
        np.testing.assert_allclose(x, y, rtol=0, atol=2e-6)


@pytest.mark.parametrize("codec", [c for c in names() if c != "sign"])
def test_every_codec_codes_and_decodes_a_round(codec):
    _, _, result = run(FedAvg(fraction_evaluate=0.0), {"codec": codec}, rounds=1, nodes=2)
    figures = result.evaluate_metrics_serverapp[1]
    assert figures["replies"] == 2 and figures["rejected"] == 0, figures
    assert all(np.isfinite(a).all() for a in result.arrays.to_numpy_ndarrays())


def test_sign_is_refused_with_a_reason():
    with pytest.raises(ValueError, match="codec.*ef-sign"):
        dq_flower.CompressedUpdates(FedAvg(), codec="sign")


def test_fp16_downlink_halves_the_broadcast_and_clients_train_from_it():
    _, down32, _ = run(FedAvg(fraction_evaluate=0.0), QSGD2, rounds=2)
    _, down16, result = run(FedAvg(fraction_evaluate=0.0), {**QSGD2, "downlink": "fp16"},
                            rounds=2)
    assert 0.4 * down32 < down16 < 0.6 * down32
    assert accuracy(result, 2) > accuracy(result, 0)


# ---------------------------------------------------------------------- one round by hand
def _round(wrapper, app=None, nodes=4, server_round=1):
    torch.manual_seed(0)
    grid = InProcessGrid(app or make_app([dq_flower.compression_mod]), nodes)
    arrays = ArrayRecord(Net().state_dict())
    messages = list(wrapper.configure_train(server_round, arrays,
                                            ConfigRecord({"lr": 0.05}), grid))
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies), [r.error for r in replies
                                                      if r.has_error()]
    return arrays, replies


def _reply(node: int, content: RecordDict, like: Message) -> Message:
    """A reply from ``node`` to the message ``like`` answers (its id and round)."""
    request = Message(RecordDict(), dst_node_id=node, message_type=MessageType.TRAIN)
    request.metadata.__dict__["_message_id"] = like.metadata.reply_to_message_id
    request.metadata.group_id = like.metadata.group_id
    return Message(content, reply_to=request)


def _copy(reply: Message, node: int | None = None) -> Message:
    content = recorddict_from_proto(recorddict_to_proto(reply.content))
    return _reply(reply.metadata.src_node_id if node is None else node, content, reply)


def _wrapper(**knobs):
    return dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), **{**QSGD2, **knobs})


def _dim() -> int:
    return sum(p.numel() for p in Net().parameters())


def _payload(vec: np.ndarray) -> ArrayRecord:
    return make("qsgd", levels=1, bucket=64, entropy="zlib").encode(
        vec, np.random.default_rng(0)).to_record()


def _nan_norms(reply: Message) -> RecordDict:
    payload = make("qsgd", levels=1, bucket=64).encode(np.ones(_dim(), np.float32),
                                                       np.random.default_rng(0))
    buffers = {**payload.buffers, "norms": np.full_like(payload.buffers["norms"], np.nan)}
    bad = Payload(payload.codec, payload.shape, payload.meta, buffers, payload.nbits)
    return RecordDict({UPDATE_KEY: bad.to_record(),
                       "metrics": reply.content.metric_records["metrics"]})


def _edit_metrics(reply: Message, **values) -> RecordDict:
    content = recorddict_from_proto(recorddict_to_proto(reply.content))
    metrics = content.metric_records["metrics"]
    for key, value in values.items():
        metrics[key.replace("_", "-") if key == "num_examples" else key] = value
    return content


HOSTILE = [
    ("raw weights (no mod)", lambda r: RecordDict({
        "arrays": ArrayRecord(Net().state_dict()),
        "metrics": MetricRecord({"train_loss": 1.0, "num-examples": 10})}),
     "is compression_mod in the ClientApp's mods"),
    ("another codec", lambda r: RecordDict({
        UPDATE_KEY: make("fp16").encode(np.zeros(_dim(), np.float32)).to_record(),
        "metrics": r.content.metric_records["metrics"]}), "encoded by 'fp16'"),
    ("wrong size", lambda r: RecordDict({
        UPDATE_KEY: _payload(np.ones(_dim() - 1, np.float32)),
        "metrics": r.content.metric_records["metrics"]}), "declares shape"),
    ("non-finite scales", _nan_norms, "holds NaN or inf"),
    ("zero examples", lambda r: _edit_metrics(r, num_examples=0), "num-examples=0"),
    ("huge example count", lambda r: _edit_metrics(r, num_examples=float(2 ** 40)),
     "num-examples"),
    ("listed examples", lambda r: _edit_metrics(r, num_examples=[1, 2]), "num-examples"),
    ("NaN metric", lambda r: _edit_metrics(r, train_loss=float("nan")),
     "not finite numbers"),
    ("other metric keys", lambda r: _edit_metrics(r, extra=1.0), "differ from the other"),
    ("a metric key flood", lambda r: _edit_metrics(r, **{f"m{i}": 1.0 for i in range(300)}),
     "302 metrics; at most 256"),
    ("huge update", lambda r: RecordDict({
        UPDATE_KEY: _payload(np.full(_dim(), 1e4, np.float32)),
        "metrics": r.content.metric_records["metrics"]}), "norm is implausibly large"),
]


@pytest.mark.parametrize(("case", "edit", "reason"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_hostile_replies_are_rejected_with_a_reason(case, edit, reason, caplog):
    # Prepare
    wrapper = _wrapper()
    _, replies = _round(wrapper)
    bad = _reply(replies[0].metadata.src_node_id, edit(replies[0]), replies[0])
    # Execute
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = wrapper.aggregate_train(1, [bad, *replies[1:]])
    # Assert: the round goes on with the honest replies
    figures = wrapper.round_figures(1)
    assert figures["rejected"] == 1 and figures["replies"] == 3, (case, figures)
    assert reason in caplog.text, caplog.text
    assert arrays is not None
    assert all(np.isfinite(a).all() for a in arrays.to_numpy_ndarrays())


def test_replies_from_unknown_or_repeated_nodes_are_rejected(caplog):
    wrapper = _wrapper()
    _, replies = _round(wrapper)
    stranger = _copy(replies[0], node=NODE_ID_BASE + 50)
    again = _copy(replies[1])
    with caplog.at_level(logging.WARNING, logger="flwr"):
        arrays, _ = wrapper.aggregate_train(1, [*replies, stranger, again])
    assert wrapper.round_figures(1)["rejected"] == 2
    assert "no train message was sent to this node" in caplog.text
    assert "a second reply" in caplog.text
    assert arrays is not None


def test_the_inner_strategy_gets_the_weights_each_client_returned():
    # identity codec, no lossless coding: decoded weights = sent + (returned - sent)
    returned: dict[int, ArrayRecord] = {}

    def spy(msg, context, call_next):  # sits between the mod and the user's train()
        out = call_next(msg, context)
        returned[int(context.node_id)] = out.content["arrays"]
        return out

    seen: list[Message] = []

    class Spy(FedAvg):
        def aggregate_train(self, server_round, replies):
            replies = list(replies)
            seen.extend(replies)
            return super().aggregate_train(server_round, replies)

    wrapper = dq_flower.CompressedUpdates(Spy(fraction_evaluate=0.0), codec="identity",
                                          entropy_coder="none")
    sent, replies = _round(wrapper, app=make_app([dq_flower.compression_mod, spy]), nodes=2)
    assert all(UPDATE_KEY in r.content and "arrays" not in r.content for r in replies)
    wrapper.aggregate_train(1, replies)
    assert len(seen) == 2
    for msg in seen:
        assert list(msg.content.array_records) == ["arrays"]
        got, want = msg.content["arrays"], returned[int(msg.metadata.src_node_id)]
        assert list(got.keys()) == list(want.keys())
        for key in want:
            np.testing.assert_allclose(got[key].numpy(), want[key].numpy(), rtol=0,
                                       atol=1e-6)
        assert not np.array_equal(got["fc2.bias"].numpy(), sent["fc2.bias"].numpy())


# ---------------------------------------------------------------------- the mod
def _train_message(wrapper, node: int = NODE_ID_BASE, server_round: int = 1) -> Message:
    grid = InProcessGrid(make_app(), 2)
    torch.manual_seed(0)
    arrays = ArrayRecord(Net().state_dict())
    msg = list(wrapper.configure_train(server_round, arrays, ConfigRecord({"lr": 0.05}),
                                       grid))[0]
    msg.metadata.__dict__["_message_id"] = f"m{server_round}"
    return msg


def _context() -> Context:
    return Context(run_id=1, node_id=NODE_ID_BASE, node_config={"partition-id": 0,
                                                                "num-partitions": 4},
                   state=RecordDict(), run_config={})


def _payload_bytes(reply: Message) -> bytes:
    return b"".join(a.data for key in sorted(reply.content.array_records)
                    for a in reply.content.array_records[key].values())


def test_the_mod_is_idempotent_per_round_and_keeps_error_feedback_in_the_context():
    # Prepare: top-k is biased, so error feedback is on
    wrapper = _wrapper(codec="topk", codec_params="")
    app = make_app([dq_flower.compression_mod])
    ctx = _context()
    # Execute
    first = app(_train_message(wrapper), ctx)
    again = app(_train_message(wrapper), ctx)  # round 1 sent again
    second = app(_train_message(wrapper, server_round=2), ctx)
    fresh = app(_train_message(wrapper, server_round=2), _context())
    # Assert
    assert not first.has_error()
    assert _payload_bytes(first) == _payload_bytes(again)
    assert "compression-ef" in ctx.state.array_records
    assert _payload_bytes(second) != _payload_bytes(fresh)  # the residual was sent on


def test_the_mod_passes_other_messages_through_and_refuses_unwrapped_train():
    calls = []
    app = ClientApp(mods=[dq_flower.compression_mod])

    @app.train()
    def train(msg, context):
        calls.append("train")
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    @app.evaluate()
    def evaluate(msg, context):
        calls.append("evaluate")
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1})}),
                       reply_to=msg)

    content = RecordDict({"arrays": ArrayRecord(Net().state_dict()),
                          "config": ConfigRecord({"server-round": 1})})
    evaluate_msg = Message(content, dst_node_id=NODE_ID_BASE,
                           message_type=MessageType.EVALUATE)
    evaluate_msg.metadata.__dict__["_message_id"] = "e1"
    assert not app(evaluate_msg, _context()).has_error()
    train_msg = Message(content, dst_node_id=NODE_ID_BASE, message_type=MessageType.TRAIN)
    train_msg.metadata.__dict__["_message_id"] = "t1"
    reply = app(train_msg, _context())
    assert reply.has_error() and "CompressedUpdates" in reply.error.reason
    assert calls == ["evaluate"]


def test_arrays_that_are_not_floating_point_travel_as_returned():
    # a BatchNorm layer: num_batches_tracked is int64 and is not coded
    def net():
        torch.manual_seed(0)
        return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))

    app = ClientApp(mods=[dq_flower.compression_mod])

    @app.train()
    def train(msg, context):
        model = net()
        model.load_state_dict(msg.content["arrays"].to_torch_state_dict())
        model.train()
        model(torch.randn(8, 4))
        model(torch.randn(8, 4))
        return Message(RecordDict({"arrays": ArrayRecord(model.state_dict()),
                                   "metrics": MetricRecord({"num-examples": 8})}),
                       reply_to=msg)

    wrapper = dq_flower.CompressedUpdates(FedAvg(fraction_evaluate=0.0), codec="identity",
                                          downlink="fp16")
    grid = InProcessGrid(app, 2)
    messages = list(wrapper.configure_train(1, ArrayRecord(net().state_dict()),
                                            ConfigRecord(), grid))
    assert MODEL_KEY in messages[0].content and RAW_KEY in messages[0].content
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    assert RAW_KEY in replies[0].content
    arrays, _ = wrapper.aggregate_train(1, replies)
    assert arrays is not None
    assert int(arrays["1.num_batches_tracked"].numpy()) == 2
    assert arrays["1.running_mean"].numpy().dtype == np.float32
