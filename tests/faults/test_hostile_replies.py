"""Each hostile reply that once crashed or poisoned the server, now rejected or undone.

Honest replies come from the package's ClientApp through the in-process grid; each test
corrupts a copy the way an attacker would and hands it to ``aggregate_train`` with the
honest ones. Before these fixes each case either raised out of ``aggregate_train``
(nested header, unconfigured dither seed, huge size claims) or was accepted (extreme finite
values, lying example counts).
"""

from __future__ import annotations

import json

import numpy as np
import torch
from flwr.app import Array, Message, MetricRecord
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from dq_flower.codecs import Payload
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config, get_method
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.server_app import run_server, validate_run_config
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.task_config import TaskConfig
from dq_flower.model_ops import get_flat
from dq_flower.wire.dq_batch import GRADIENT_KEY
from tests.faults.ranges_edit import sample_ranges, set_sample_ranges

TASK = TaskConfig(num_partitions=4, model="logreg", seed=7)


def _dq(**knobs):
    knobs.setdefault("min_holdout_rows", 0)  # a first ask of ``budget`` (64) per client
    return DQStrategy(build_model(TASK, task_info(TASK)), seed=TASK.seed, **knobs)


def _round(strategy, server_round=1, grid=None):
    grid = grid or InProcessGrid(client_app, TASK.num_partitions)
    messages = strategy.configure_train(server_round, None, client_task_config(TASK, "dq"),
                                        grid)
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return replies


def _copy(reply: Message) -> Message:
    content = recorddict_from_proto(recorddict_to_proto(reply.content))
    request = Message(reply.content, dst_node_id=reply.metadata.src_node_id,
                      message_type="train")
    # the copy answers the message the original answered (its id and round)
    request.metadata.__dict__["_message_id"] = reply.metadata.reply_to_message_id
    request.metadata.group_id = reply.metadata.group_id
    return Message(content, reply_to=request)


def _raw(data: bytes, dtype: str) -> Array:
    return Array(dtype=dtype, shape=(len(data) // np.dtype(dtype).itemsize,), stype="raw",
                 data=data)


def _edit_header(reply, key, edit):
    header = json.loads(bytes(reply.content[key]["header"].data))
    edit(header)
    reply.content[key]["header"] = _raw(json.dumps(header).encode(), "uint8")


def _scale(reply, key, name, factor):
    arr = reply.content[key][name]
    values = np.frombuffer(arr.data, dtype=arr.dtype).astype(np.float64) * factor
    reply.content[key][name] = _raw(values.astype(arr.dtype).tobytes(), arr.dtype)


def _aggregate(strategy, honest, bad):
    before = get_flat(strategy.model)
    _, metrics = strategy.aggregate_train(1, [*honest[1:], bad])
    assert np.isfinite(get_flat(strategy.model)).all()
    assert not np.array_equal(before, get_flat(strategy.model))  # the round went on
    return metrics


def test_a_deeply_nested_header_is_rejected():
    strategy = _dq()
    honest = _round(strategy)
    bad = _copy(honest[0])
    bad.content["samples"]["header"] = _raw(b"[" * 1100 + b"]" * 1100, "uint8")
    metrics = _aggregate(strategy, honest, bad)
    assert metrics["rejected"] == 1 and metrics["replies"] == 3


def test_a_dither_seed_the_server_did_not_configure_is_rejected():
    strategy = _dq()
    honest = _round(strategy)
    bad = _copy(honest[0])
    _edit_header(bad, "samples", lambda h: h["meta"].__setitem__("dither_seed", 12345))
    metrics = _aggregate(strategy, honest, bad)
    assert metrics["rejected"] == 1 and metrics["stored"] == 3 * 64


def test_compensation_claiming_two_to_the_31_elements_is_rejected_before_decoding():
    for codec, params in (("topk", "ratio=0.05"), ("powersgd", "rank=1")):
        strategy = _dq(compensation=codec, compensation_params=params)
        honest = _round(strategy)
        bad = _copy(honest[0])
        _edit_header(bad, "compensation", lambda h: h.__setitem__(
            "shape", [2**31] if len(h["shape"]) == 1 else [2**16, 2**15]))
        metrics = _aggregate(strategy, honest, bad)
        assert metrics["rejected"] == 1, codec


def test_extreme_sample_weights_and_ranges_are_rejected():
    strategy = _dq()
    grid = InProcessGrid(client_app, TASK.num_partitions)
    strategy.aggregate_train(1, _round(strategy, 1, grid))  # sets the value bound
    replies = _round(strategy, 2, grid)
    heavy, wide = _copy(replies[0]), _copy(replies[1])
    _scale(heavy, "sample-info", "weights", 1e20)
    mins, scales = sample_ranges(wide.content)  # coded or raw, as the reply carries them
    set_sample_ranges(wide.content, mins, scales * np.float32(1e30))
    _, metrics = strategy.aggregate_train(2, [*replies[2:], heavy, wide])
    assert metrics["rejected"] == 2 and metrics["replies"] == 2
    assert np.isfinite(get_flat(strategy.model)).all()


def test_a_compensation_scaled_by_1e30_is_rejected_against_the_others():
    strategy = _dq(compensation="identity", entropy_coder="none")  # raw values to scale
    honest = _round(strategy)
    bad = _copy(honest[0])
    _scale(bad, "compensation", "values", 1e30)
    metrics = _aggregate(strategy, honest, bad)
    assert metrics["rejected"] == 1 and metrics["replies"] == 3


def test_gradient_rounds_count_an_example_count_far_over_the_others_down():
    """As data rounds do: counted as 100x the others' lower median (it was refused, and an
    honest large site with it); the weighted mean caps its weight at 2x the median's."""
    strategy = _dq(upload_mode="gradient", gradient_codec="identity", gradient_codec_params="")
    grid = InProcessGrid(client_app, TASK.num_partitions)
    strategy.aggregate_train(1, _round(strategy, 1, grid))
    replies = _round(strategy, 2, grid)
    liar = _copy(replies[0])
    metrics = dict(liar.content["metrics"].items())
    metrics["num-examples"] = 2**31 - 1
    liar.content["metrics"] = MetricRecord(metrics)
    _, out = strategy.aggregate_train(2, [*replies[1:], liar])
    assert out["rejected"] == 0 and out["replies"] == 4
    counts = sorted(count for count, _ in strategy.data.sent.values())
    assert counts[-1] == 100 * counts[1]  # the other three's lower median


def test_a_step_that_makes_the_model_non_finite_is_rolled_back():
    strategy = _dq(upload_mode="gradient", gradient_codec="identity", gradient_codec_params="",
                   norm_bound_factor=0.0, server_steps=1, lr=10.0, entropy_coder="none")
    honest = _round(strategy)
    bad = _copy(honest[0])
    arr = bad.content[GRADIENT_KEY]["values"]  # finite, but lr * gradient overflows
    huge = np.full(len(arr.data) // 4, 3e38, dtype=np.float32)
    bad.content[GRADIENT_KEY]["values"] = _raw(huge.tobytes(), "float32")
    before = [p.detach().clone() for p in strategy.model.parameters()]
    _, metrics = strategy.aggregate_train(1, [bad])
    assert metrics["rolled-back"] == 1
    for a, b in zip(before, strategy.model.parameters(), strict=True):
        assert torch.equal(a, b)


def test_a_gradient_baseline_rejects_an_update_scaled_by_1e30():
    # the fixed-length payload (no lossless coding): its norms are scaled in place
    run_config = {**build_run_config("qsgd", model="logreg", num_clients=4, seed=7),
                  "entropy-coder": "none"}
    method = get_method("qsgd")
    task, _ = validate_run_config({**method.defaults, **run_config})
    info = task_info(task)
    strategy, train_config = method.build(task, {**method.defaults, **run_config},
                                          build_model(task, info), info)
    grid = InProcessGrid(client_app, 4)
    replies = grid.send_and_receive(strategy.configure_train(1, None, train_config, grid))
    bad = _copy(replies[0])
    norms = [n for n in bad.content["update"] if n != "header"]
    for name in norms:
        if bad.content["update"][name].dtype == "float32":
            _scale(bad, "update", name, 1e30)
    _, metrics = strategy.aggregate_train(1, [*replies[1:], bad])
    assert metrics["rejected"] == 1 and metrics["replies"] == 3 and metrics["stepped"] == 1
    assert np.isfinite(get_flat(strategy.model)).all()
    # the rejected update went over the wire: its bits count, as in every update round
    assert metrics["coded-replies"] == 4
    assert metrics["up-payload-bits"] == sum(
        Payload.from_record(r.content["update"]).nbits for r in replies)


def test_server_paths_never_travel_to_the_clients(tmp_path):
    downs = []
    for name in ("c", "a-much-longer-checkpoint-folder-name" * 3):
        grid = InProcessGrid(client_app, 2)
        run_config = build_run_config("dq", rounds=2, num_clients=2,
                                      checkpoint_dir=str(tmp_path / name))
        result = run_server(grid, run_config)
        downs.append([r["down_bytes"] for r in result.history])
        for msg in grid.sent:
            assert str(tmp_path) not in json.dumps(
                {k: str(v) for k, v in msg.content["config"].items()})
    assert downs[0] == downs[1]
