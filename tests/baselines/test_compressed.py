"""Tests of the compressed-gradient strategy, its client handler and its config."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Message, MetricRecord, RecordDict

from dq_flower.accounting import content_bytes
from dq_flower.baselines.client import (
    EF_KEY,
    MODEL_STATE_KEY,
    STATE_PREFIX,
    batch_indices,
    local_update,
)
from dq_flower.baselines.config import GradientConfig
from dq_flower.baselines.strategy import GradientStrategy, majority_vote
from dq_flower.client_state import load_state_dict, save_state_dict
from dq_flower.codecs import Payload, make
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
from dq_flower.harness.methods import client_task_config, get_method, method_names
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.server_app import run_server, validate_run_config
from dq_flower.harness.simulate import build_run_config
from dq_flower.harness.task_config import TaskConfig
from dq_flower.harness.tasks.data import load_partition
from dq_flower.model_ops import get_flat, set_flat, weighted_loss_grad

from .helpers import size_recording_app

BASELINES = ["sgd", "fp16", "qsgd", "terngrad", "signsgd", "ef-signsgd", "topk", "powersgd",
             "bingrad", "orq"]


# ---------------------------------------------------------------------------- helpers
def make_strategy(num_partitions=3, seed=0, task_kw=None, **knobs):
    task = TaskConfig(num_partitions=num_partitions, seed=seed, **(task_kw or {}))
    info = task_info(task)
    model = build_model(task, info)
    cfg = GradientConfig(**knobs)
    strategy = GradientStrategy(model, seed=task.seed, min_available_nodes=task.min_available,
                                config=cfg, method="test")
    strategy.test_config = client_task_config(task, "sgd")  # what the harness would send
    return strategy, task, info


def reply_content(payload: Payload, examples: int, loss: float = 1.0) -> RecordDict:
    return RecordDict({
        "update": payload.to_record(),
        "metrics": MetricRecord({"num-examples": examples, "train-loss": loss}),
    })


def exchange(strategy, contents, server_round=1, failing=None):
    """Send the strategy's round messages to fake clients that answer ``contents[node]``."""

    def fake_client(msg, _context):
        return Message(contents[msg.metadata.dst_node_id], reply_to=msg)

    grid = InProcessGrid(fake_client, len(contents), failing=failing)
    msgs = list(strategy.configure_train(server_round, ArrayRecord(), _config(strategy), grid))
    return grid.send_and_receive(msgs)


def _config(strategy):
    return strategy.test_config


def node(i: int) -> int:
    return NODE_ID_BASE + i


# ---------------------------------------------------------------------------- registry
def test_every_baseline_is_registered_with_its_family():
    # Prepare / Execute
    names = set(method_names())
    # Assert
    assert set(BASELINES) | {"fedavg"} <= names
    for name in BASELINES:
        assert get_method(name).family == "gradient"
        assert "codec" in get_method(name).defaults
    assert get_method("fedavg").family == "fedavg"
    assert get_method("qsgd").defaults == {"codec": "qsgd"}


@pytest.mark.parametrize("name", BASELINES)
def test_method_defaults_build_a_valid_codec(name):
    # Execute
    _, cfg = validate_run_config(build_run_config(name, rounds=1))
    codec = make(cfg.codec, **cfg.codec_kwargs)
    # Assert
    assert codec.name == get_method(name).defaults["codec"]


# ---------------------------------------------------------------------------- config
@pytest.mark.parametrize(("kwargs", "key"), [
    ({"local_steps": 0}, "local-steps"),
    ({"batch_size": 0}, "batch-size"),
    ({"lr": 0.0}, "lr"),
    ({"momentum": 1.0}, "momentum"),
    ({"weight_decay": -1.0}, "weight-decay"),
    ({"downlink": "int8"}, "downlink"),
    ({"downlink": "sign"}, "downlink"),  # needs majority vote
    ({"aggregation": "mode"}, "aggregation"),
    ({"error_feedback": "maybe"}, "error-feedback"),
    ({"codec": "nope"}, "codec"),
    ({"codec": "qsgd", "codec_params": "levels=0"}, "codec-params"),
    ({"codec": "qsgd", "codec_params": "levels"}, "codec-params"),
    ({"aggregation": "majority", "codec": "sign", "optimizer": "adam"}, "optimizer"),
    ({"codec": "sign", "optimizer": "adam"}, "optimizer"),  # auto: majority for sign
    ({"per_tensor": "yes"}, "per-tensor"),
    ({"levels": -1}, "levels"),
    ({"ratio": 1.5}, "ratio"),
])
def test_gradient_config_rejects_bad_values_naming_the_key(kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}"):
        GradientConfig(**kwargs)


def test_codec_params_layer_over_the_baseline_defaults_and_zero_means_unset():
    assert GradientConfig(codec="qsgd").codec_kwargs == {"levels": 4, "bucket": 512}
    assert GradientConfig(codec="qsgd", codec_params="bucket=64").codec_kwargs == \
        {"levels": 4, "bucket": 64}
    cfg = GradientConfig(codec="qsgd", codec_params="levels=2", levels=8, bucket=0)
    assert cfg.codec_kwargs == {"levels": 8, "bucket": 512}
    assert GradientConfig(codec="topk", ratio=0.1).codec_kwargs == {"ratio": 0.1}


def test_auto_knobs_resolve_from_the_codec():
    sign = GradientConfig(codec="sign")
    assert sign.majority and sign.downlink_mode == "sign" and not sign.segmented
    qsgd = GradientConfig(codec="qsgd")
    assert not qsgd.majority and qsgd.downlink_mode == "float32"
    assert GradientConfig(codec="powersgd").segmented
    assert not GradientConfig(codec="powersgd", per_tensor="off").segmented
    assert GradientConfig(codec="sign", aggregation="mean").downlink_mode == "float32"


def test_neutral_values_in_a_shared_run_config_keep_the_method_defaults():
    # what pyproject.toml may list for every method: neutral values only
    neutral = {"codec-params": "", "levels": 0, "bucket": 0, "ratio": 0.0, "rank": 0,
               "aggregation": "auto", "downlink": "auto", "error-feedback": "auto",
               "per-tensor": "auto"}
    _, cfg = validate_run_config({"method": "orq", **neutral})
    assert cfg.codec == "orq" and cfg.codec_kwargs == {"levels": 3, "bucket": 512}
    _, cfg = validate_run_config({"method": "signsgd", **neutral})
    assert cfg.majority and cfg.downlink_mode == "sign" and cfg.lr == 0.005


def test_run_config_keys_reach_the_config():
    run_config = build_run_config("qsgd", rounds=1, local_steps=3, bucket=128)
    _, cfg = validate_run_config(run_config)
    assert cfg.local_steps == 3
    assert cfg.codec == "qsgd" and cfg.codec_kwargs == {"levels": 4, "bucket": 128}


# ---------------------------------------------------------------------------- aggregation
def test_weighted_mean_of_mock_replies_gives_the_hand_computed_step():
    # Prepare
    # the plain weighted mean: no clip to the median norm, no weight cap
    strategy, task, info = make_strategy(codec="identity", lr=0.5, momentum=0.0,
                                         clip_factor=0, weight_cap=0,
                                         min_cosine=-1)
    w0 = get_flat(strategy.model)
    rng = np.random.default_rng(1)
    grads = [rng.normal(size=w0.size).astype(np.float32) for _ in range(3)]
    weights = [1, 2, 5]
    codec = make("identity")
    contents = {node(i): reply_content(codec.encode(g), n)
                for i, (g, n) in enumerate(zip(grads, weights, strict=True))}
    # Execute
    arrays, metrics = strategy.aggregate_train(1, exchange(strategy, contents))
    # Assert
    expected = w0 - 0.5 * (1 * grads[0] + 2 * grads[1] + 5 * grads[2]) / 8
    np.testing.assert_allclose(get_flat(strategy.model), expected, rtol=0, atol=1e-6)
    assert metrics["replies"] == 3 and metrics["rejected"] == 0 and metrics["failed"] == 0
    assert metrics["up-payload-bits"] == 3 * 32 * w0.size
    loaded = build_model(task, info)
    loaded.load_state_dict(arrays.to_torch_state_dict())
    np.testing.assert_array_equal(get_flat(loaded), get_flat(strategy.model))


def test_momentum_and_weight_decay_over_two_rounds_match_the_sgd_rule():
    # Prepare
    lr, mu, wd = 0.1, 0.9, 0.01
    strategy, _, _ = make_strategy(codec="identity", lr=lr, momentum=mu, weight_decay=wd)
    w = get_flat(strategy.model).astype(np.float64)
    rng = np.random.default_rng(2)
    g1, g2 = (rng.normal(size=w.size).astype(np.float32) for _ in range(2))
    codec = make("identity")
    # Execute
    strategy.aggregate_train(1, exchange(strategy, {node(0): reply_content(codec.encode(g1), 4)}))
    strategy.aggregate_train(2, exchange(strategy, {node(0): reply_content(codec.encode(g2), 4)},
                                         server_round=2))
    # Assert: torch SGD: d = g + wd w; buf = mu buf + d; w -= lr buf
    d1 = g1 + wd * w
    buf = d1
    w = w - lr * buf
    d2 = g2 + wd * w
    buf = mu * buf + d2
    w = w - lr * buf
    np.testing.assert_allclose(get_flat(strategy.model), w, rtol=0, atol=1e-5)


def test_qsgd_payloads_are_decoded_and_averaged():
    # Prepare
    strategy, _, _ = make_strategy(codec="qsgd", codec_params="levels=2,bucket=64", lr=1.0,
                                   momentum=0.0)
    w0 = get_flat(strategy.model)
    codec = make("qsgd", levels=2, bucket=64)
    rng = np.random.default_rng(3)
    payloads = [codec.encode(rng.normal(size=w0.size).astype(np.float32), rng)
                for _ in range(2)]
    contents = {node(0): reply_content(payloads[0], 3), node(1): reply_content(payloads[1], 1)}
    # Execute
    _, metrics = strategy.aggregate_train(1, exchange(strategy, contents))
    # Assert
    mean = (3 * codec.decode(payloads[0]) + codec.decode(payloads[1])) / 4
    np.testing.assert_allclose(get_flat(strategy.model), w0 - mean, rtol=0, atol=1e-5)
    assert metrics["up-payload-bits"] == payloads[0].nbits + payloads[1].nbits


def test_majority_vote_of_three_hand_made_sign_vectors():
    # Prepare: columns are coordinates; sums 1, 1, -3, 1, -1 -> vote + + - + -
    a = np.array([1, 1, -1, -1, 1], dtype=np.float32)
    b = np.array([1, -1, -1, 1, -1], dtype=np.float32)
    c = np.array([-1, 1, -1, 1, -1], dtype=np.float32)
    # Execute
    vote = majority_vote([a, b, c], np.random.default_rng(0))
    # Assert
    np.testing.assert_array_equal(vote, [1, 1, -1, 1, -1])


def test_majority_vote_breaks_ties_with_the_seeded_generator():
    a = np.ones(1000, dtype=np.float32)
    vote = majority_vote([a, -a], np.random.default_rng(5))
    again = majority_vote([a, -a], np.random.default_rng(5))
    assert set(np.unique(vote)) == {-1.0, 1.0}
    np.testing.assert_array_equal(vote, again)


def test_strategy_steps_by_the_majority_vote_of_sign_payloads():
    # Prepare
    strategy, _, _ = make_strategy(codec="sign", downlink="float32",
                                   lr=0.01, momentum=0.0)
    w0 = get_flat(strategy.model)
    pattern = np.array([[1, 1, -1, -1, 1], [1, -1, -1, 1, -1], [-1, 1, -1, 1, -1]],
                       dtype=np.float32)
    reps = -(-w0.size // 5)
    vectors = [np.tile(row * np.arange(1, 6, dtype=np.float32), reps)[:w0.size]
               for row in pattern]
    codec = make("sign")
    contents = {node(i): reply_content(codec.encode(v, np.random.default_rng(i)), 10 * (i + 1))
                for i, v in enumerate(vectors)}
    # Execute
    strategy.aggregate_train(1, exchange(strategy, contents))
    # Assert: one vote per client, whatever its weight
    vote = np.tile(np.array([1, 1, -1, 1, -1], dtype=np.float32), reps)[:w0.size]
    np.testing.assert_allclose(get_flat(strategy.model), w0 - np.float32(0.01) * vote,
                               rtol=0, atol=1e-7)


def _nan_identity_payload(size: int) -> Payload:
    values = np.full(size, np.nan, dtype=np.float32)
    return Payload("identity", (size,), {}, {"values": values}, nbits=32 * size)


def test_bad_replies_are_rejected_with_a_reason_and_the_round_goes_on(caplog):
    # Prepare
    strategy, _, _ = make_strategy(num_partitions=6, codec="identity", lr=1.0, momentum=0.0)
    w0 = get_flat(strategy.model)
    good = np.full(w0.size, 0.25, dtype=np.float32)
    ident, half = make("identity"), make("fp16")
    contents = {
        node(0): reply_content(ident.encode(good), 8),
        node(1): reply_content(half.encode(good), 8),  # another codec
        node(2): reply_content(ident.encode(good[:-1]), 8),  # wrong size
        node(3): reply_content(_nan_identity_payload(w0.size), 8),  # non-finite
        node(4): reply_content(ident.encode(good), 0),  # no examples
        node(5): RecordDict({"metrics": MetricRecord({"num-examples": 8, "train-loss": 1.0})}),
    }
    # Execute
    _, metrics = strategy.aggregate_train(1, exchange(strategy, contents))
    # Assert
    assert metrics["replies"] == 1 and metrics["rejected"] == 5
    np.testing.assert_allclose(get_flat(strategy.model), w0 - good, atol=1e-7)
    assert np.isfinite(get_flat(strategy.model)).all()
    assert "rejected reply" in caplog.text


def test_failed_clients_are_counted_and_min_available_gates_the_step():
    # Prepare
    strategy, _, _ = make_strategy(num_partitions=3, task_kw={"min_available": 2},
                                   codec="identity", lr=1.0, momentum=0.0)
    w0 = get_flat(strategy.model)
    g = make("identity").encode(np.ones(w0.size, dtype=np.float32))
    contents = {node(i): reply_content(g, 4) for i in range(3)}
    # Execute
    replies = exchange(strategy, contents, failing=lambda _r, n: n != node(0))
    _, metrics = strategy.aggregate_train(1, replies)
    # Assert
    assert metrics["failed"] == 2 and metrics["replies"] == 1 and metrics["stepped"] == 0
    np.testing.assert_array_equal(get_flat(strategy.model), w0)


# ---------------------------------------------------------------------------- equivalences
def test_identity_tau1_round_equals_one_large_batch_sgd_step():
    # Prepare: unequal partitions (Dirichlet) and a batch larger than some of them, so the
    # num-examples weights matter
    knobs = {"partition": "dirichlet", "dirichlet-alpha": 0.5, "batch-size": 400,
             "lr": 0.3, "momentum": 0.0, "clip-factor": 0.0, "weight-cap": 0.0,
             "min-cosine": -1.0}
    run_config = build_run_config("sgd", num_clients=3, rounds=1, seed=2, **knobs)
    task = TaskConfig(num_partitions=3, seed=2, partition="dirichlet", dirichlet_alpha=0.5,
                      num_server_rounds=1)
    info = task_info(task)
    w0 = get_flat(build_model(task, info))
    xs, ys = [], []
    for pid in range(3):
        x, y, _ = load_partition("digits", pid, 3, "dirichlet", 0.5, 2)
        idx = batch_indices(2, 1, pid, x.shape[0], 400)[0]
        xs.append(x[idx])
        ys.append(y[idx])
    sizes = [len(v) for v in ys]
    assert len(set(sizes)) > 1, "the test needs clients with different batch sizes"
    x_all, y_all = np.concatenate(xs), np.concatenate(ys)
    ref = build_model(task, info)
    _, g = weighted_loss_grad(ref, x_all, y_all, np.full(len(y_all), 1.0 / len(y_all)))
    # Execute
    grid = InProcessGrid(client_app, 3)
    captured = {}
    original = GradientStrategy.aggregate_train

    def spy(self, server_round, replies):
        out = original(self, server_round, replies)
        captured["w"] = get_flat(self.model)
        return out

    with pytest.MonkeyPatch.context() as patch:  # undone whole: the class keeps no copy
        patch.setattr(GradientStrategy, "aggregate_train", spy)
        run_server(grid, run_config)
    # Assert
    np.testing.assert_allclose(captured["w"], w0 - np.float32(0.3) * g, rtol=0, atol=2e-6)


def test_local_steps_send_the_mean_trajectory_gradient():
    # Prepare: one client, tau = 3; a server step of 3 * client_lr recovers local SGD exactly
    task = TaskConfig(num_partitions=1, seed=2)
    info = task_info(task)
    x, y, _ = load_partition("digits", 0, 1, "iid", 0.5, 2)
    batches = batch_indices(2, 1, 0, x.shape[0], 16, steps=3)
    ref = build_model(task, info)
    w = get_flat(ref)
    for idx in batches:
        _, g = weighted_loss_grad(ref, x[idx], y[idx], np.full(idx.size, 1 / idx.size))
        w = w - np.float32(0.05) * g
        set_flat(ref, w)
    strategy, _, _ = make_strategy(num_partitions=1, seed=2, codec="identity", local_steps=3,
                                   batch_size=16, client_lr=0.05, lr=0.15, momentum=0.0)
    grid = InProcessGrid(client_app, 1)
    # Execute
    msgs = list(strategy.configure_train(1, ArrayRecord(), _config(strategy), grid))
    _, metrics = strategy.aggregate_train(1, grid.send_and_receive(msgs))
    # Assert
    assert metrics["replies"] == 1
    np.testing.assert_allclose(get_flat(strategy.model), w, rtol=0, atol=1e-5)


def test_local_update_with_one_batch_is_the_minibatch_gradient():
    task = TaskConfig(num_partitions=1)
    model = build_model(task, task_info(task))
    x, y, _ = load_partition("digits", 0, 1)
    idx = np.arange(10)
    g, loss, n = local_update(model, x, y, [idx], 0.1)
    _, ref = weighted_loss_grad(model, x[idx], y[idx], np.full(10, 0.1))
    np.testing.assert_array_equal(g, ref)
    assert n == 10 and loss > 0


def test_batch_indices_are_seeded_per_round_and_partition():
    a = batch_indices(0, 1, 0, 100, 10)[0]
    assert np.array_equal(a, batch_indices(0, 1, 0, 100, 10)[0])
    assert not np.array_equal(a, batch_indices(0, 2, 0, 100, 10)[0])
    assert not np.array_equal(a, batch_indices(0, 1, 1, 100, 10)[0])
    assert len(np.unique(a)) == 10
    assert batch_indices(0, 1, 0, 5, 10)[0].size == 5


# ---------------------------------------------------------------------------- client state
def _client_update(task, pid, server_round, w, batch_size):
    x, y, _ = load_partition(task.dataset, pid, task.num_partitions, task.partition,
                             task.dirichlet_alpha, task.seed)
    model = build_model(task, task_info(task))
    set_flat(model, w)
    idx = batch_indices(task.seed, server_round, pid, x.shape[0], batch_size)[0]
    _, g = weighted_loss_grad(model, x[idx], y[idx], np.full(idx.size, 1 / idx.size))
    return g


def _residual(context, cfg, sizes):
    """The client's concatenated error-feedback residual (zeros where none is stored)."""
    keys = [f"{EF_KEY}-{i}" for i in range(len(sizes))] if cfg.segmented else [EF_KEY]
    sizes = sizes if cfg.segmented else [sum(sizes)]
    parts = []
    for key, size in zip(keys, sizes, strict=True):
        state = load_state_dict(context, key)
        parts.append(np.zeros(size, np.float32) if state is None or "residual" not in state
                     else np.asarray(state["residual"], np.float32).reshape(-1))
    return np.concatenate(parts)


@pytest.mark.parametrize(("codec", "params"),
                         [("topk", "ratio=0.05"), ("ef-sign", ""), ("powersgd", "rank=1")])
def test_error_feedback_state_survives_rounds_and_keeps_its_invariant(codec, params):
    # Prepare
    strategy, task, _ = make_strategy(num_partitions=2, codec=codec, codec_params=params,
                                      lr=0.05, batch_size=16)
    cfg = strategy.cfg
    grid = InProcessGrid(client_app, 2)
    dec = cfg.make_codec()  # entropy-coded where that shrinks the payload (the default zlib)
    residual_norms = []
    for rnd in (1, 2, 3):
        w = get_flat(strategy.model)
        before = {n: _residual(grid.contexts[n], cfg, strategy.sizes) for n in grid.contexts}
        # Execute
        msgs = list(strategy.configure_train(rnd, ArrayRecord(), _config(strategy), grid))
        replies = grid.send_and_receive(msgs)
        # Assert: x + e_old == decode(payload) + e_new, for every client
        for msg in replies:
            n = msg.metadata.src_node_id
            x = _client_update(task, n - NODE_ID_BASE, rnd, w, 16)
            e_new = _residual(grid.contexts[n], cfg, strategy.sizes)
            sent = np.concatenate([dec.decode(Payload.from_record(rec)).reshape(-1)
                                   for _, rec in sorted(msg.content.array_records.items(),
                                                        key=lambda kv: _order(kv[0]))])
            np.testing.assert_allclose(x + before[n], sent + e_new, rtol=0, atol=1e-5)
            residual_norms.append(float(np.linalg.norm(e_new)))
        _, metrics = strategy.aggregate_train(rnd, replies)
        assert metrics["replies"] == 2 and metrics["rejected"] == 0
    assert all(r > 0 for r in residual_norms)
    if codec == "powersgd":  # the warm start travels in the same state
        state = load_state_dict(grid.contexts[node(0)], f"{EF_KEY}-0")
        assert any(k.startswith("codec/q/") for k in state)


def _order(key: str) -> int:
    return int(key.rsplit("-", 1)[1]) if "-" in key else 0


def test_ef_signsgd_uplink_is_d_over_8_bytes_plus_a_constant_envelope():
    # Prepare: record every reply's serialized size, per (round, node)
    sizes: dict[tuple[int, int], int] = {}
    measured_app = size_recording_app(sizes)

    # Execute
    result = run_server(InProcessGrid(measured_app, 2),  # fixed-length bits: no coder
                        build_run_config("ef-signsgd", num_clients=2, rounds=3,
                                         entropy_coder="none"))
    # Assert
    d = result.num_params
    payload = -(-d // 8) + 4  # sign bits, packed, plus the float32 scale
    for i in range(2):
        envelopes = {sizes[(rnd, node(i))] - payload for rnd in (1, 2, 3)}
        assert len(envelopes) == 1, envelopes  # constant across rounds
        assert 0 < envelopes.pop() < 1024
    assert result.history[1]["up_payload_bits"] == 2 * (d + 32)


def test_unbiased_codecs_keep_no_error_feedback_state():
    result, grid = None, InProcessGrid(client_app, 2)
    result = run_server(grid, build_run_config("qsgd", num_clients=2, rounds=2))
    assert result.history[-1]["replies"] == 2
    for ctx in grid.contexts.values():
        assert EF_KEY not in ctx.state.array_records


# ---------------------------------------------------------------------------- sign downlink
def test_sign_downlink_reproduces_the_float32_downlink_run_at_a_fraction_of_the_bytes():
    # Prepare: half the clients per round, so clients fall several votes behind
    common = {"num_clients": 4, "rounds": 6, "seed": 3, "fraction_train": 0.5,
              "entropy_coder": "none"}  # round 1's float32 models at their raw size
    # Execute
    grid = InProcessGrid(client_app, 4)
    signed = run_server(grid, build_run_config("signsgd", downlink="sign", **common))
    full = run_server(InProcessGrid(client_app, 4),
                      build_run_config("signsgd", downlink="float32", **common))
    # Assert: the same trajectory (every client rebuilt the server's model bit for bit)
    assert [r["accuracy"] for r in signed.history] == [r["accuracy"] for r in full.history]
    assert all(r["failed"] == 0 and r["rejected"] == 0 for r in signed.history[1:])
    d = signed.num_params
    assert signed.history[1]["down_bytes"] > 2 * 4 * d  # round 1: float32 models
    later = sum(r["down_bytes"] for r in signed.history[3:])
    full_later = sum(r["down_bytes"] for r in full.history[3:])
    assert later < full_later / 3
    versions = [load_state_dict(c, MODEL_STATE_KEY) for c in grid.contexts.values()]
    assert any(v is not None and v["version"] >= 4 for v in versions)


def test_sign_downlink_resyncs_a_client_that_failed():
    # Prepare: node 2 fails in round 2, so its copy is stale
    failing = lambda rnd, n: rnd == 2 and n == node(1)  # noqa: E731
    # Execute
    grid = InProcessGrid(client_app, 2, failing=failing)
    result = run_server(grid, build_run_config("signsgd", num_clients=2, rounds=4, seed=1))
    # Assert
    assert result.history[2]["failed"] == 1
    assert all(r["failed"] == 0 and r["rejected"] == 0 for r in result.history[3:])
    states = [load_state_dict(c, MODEL_STATE_KEY) for c in grid.contexts.values()]
    assert [s["version"] for s in states] == [3, 3]
    np.testing.assert_array_equal(states[0]["w"], states[1]["w"])


def test_client_with_a_wrong_model_copy_fails_instead_of_training_on_it():
    # Prepare
    grid = InProcessGrid(client_app, 2)
    strategy, _, _ = make_strategy(num_partitions=2, codec="sign", aggregation="majority",
                                   downlink="sign", error_feedback="off", lr=0.01,
                                   momentum=0.0)
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, ArrayRecord(), _config(strategy), grid))
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
    ctx = grid.contexts[node(0)]
    state = load_state_dict(ctx, MODEL_STATE_KEY)
    save_state_dict(ctx, MODEL_STATE_KEY, {"w": state["w"] + 1e-3, "version": state["version"]})
    for key in (MODEL_STATE_KEY, MODEL_STATE_KEY + "-meta"):  # the state round 3 starts from
        ctx.state[f"{STATE_PREFIX}after@2/{key}"] = ctx.state[key]
    # Execute
    msgs = list(strategy.configure_train(3, ArrayRecord(), _config(strategy), grid))
    _, metrics = strategy.aggregate_train(3, grid.send_and_receive(msgs))
    msgs = list(strategy.configure_train(4, ArrayRecord(), _config(strategy), grid))
    _, metrics4 = strategy.aggregate_train(4, grid.send_and_receive(msgs))
    # Assert: round 3 fails (CRC), round 4 re-sends the float32 model and works
    assert metrics["failed"] == 1 and metrics4["failed"] == 0
    assert "model" in msgs[0].content.array_records
    assert torch.isfinite(torch.as_tensor(get_flat(strategy.model))).all()


def test_fp16_downlink_halves_the_model_broadcast():
    # Execute
    half = run_server(InProcessGrid(client_app, 2),  # fixed-length bits: no coder
                      build_run_config("qsgd", num_clients=2, rounds=10, downlink="fp16",
                                       entropy_coder="none"))
    full = run_server(InProcessGrid(client_app, 2),
                      build_run_config("qsgd", num_clients=2, rounds=10, entropy_coder="none"))
    # Assert
    d = half.num_params
    assert half.history[1]["down_payload_bits"] == 2 * 16 * d
    assert full.history[1]["down_payload_bits"] == 2 * 32 * d
    saved = full.history[1]["down_bytes"] - half.history[1]["down_bytes"]
    assert 2 * 2 * d - 64 <= saved <= 2 * 2 * d + 64
    assert half.history[-1]["accuracy"] > half.history[0]["accuracy"] + 0.3
    assert abs(half.history[-1]["accuracy"] - full.history[-1]["accuracy"]) < 0.1


def test_a_client_too_many_votes_behind_gets_the_float32_model():
    # Prepare
    strategy, _, _ = make_strategy(num_partitions=2, codec="sign", lr=0.01, momentum=0.0)
    grid = InProcessGrid(client_app, 2)
    for rnd in (1, 2):
        msgs = list(strategy.configure_train(rnd, ArrayRecord(), _config(strategy), grid))
        strategy.aggregate_train(rnd, grid.send_and_receive(msgs))
    strategy.downlink.node_version[node(0)] = strategy.version - 40  # pretend it missed 40 votes
    # Execute
    msgs = list(strategy.configure_train(3, ArrayRecord(), _config(strategy), grid))
    # Assert
    by_node = {m.metadata.dst_node_id: m.content for m in msgs}
    assert "model" in by_node[node(0)].array_records
    assert list(by_node[node(1)].array_records) == [f"vote-{strategy.version}"]


# ---------------------------------------------------------------------------- checkpoints
@pytest.mark.parametrize("method", ["qsgd", "signsgd", "fedavg-ef-sign"])
def test_a_resumed_run_ends_where_an_uninterrupted_one_does(method, tmp_path):
    # Prepare: unbiased codec, and majority vote with its 1-bit downlink, and Flower's FedAvg
    # in CompressedUpdates with error feedback in compression_mod; the clients keep their
    # Context state (as long-running SuperNodes do), the server restarts
    common = {"num_clients": 2, "seed": 5}
    straight = run_server(InProcessGrid(client_app, 2),
                          build_run_config(method, rounds=6, **common))
    grid = InProcessGrid(client_app, 2)
    ckpt = str(tmp_path / "ckpt")
    # Execute
    run_server(grid, build_run_config(method, rounds=3, checkpoint_dir=ckpt, **common))
    resumed = run_server(grid, build_run_config(method, rounds=6, checkpoint_dir=ckpt,
                                                **common))
    # Assert
    assert [r["accuracy"] for r in resumed.history] == [r["accuracy"] for r in straight.history]
    assert all(r["failed"] == 0 for r in resumed.history[1:])
    if method == "signsgd":  # the restored server kept sending votes, not models
        assert resumed.history[5]["down_bytes"] < straight.history[1]["down_bytes"] / 4


# ---------------------------------------------------------------------------- replays
def _strategy_for(run_config):
    """The strategy and train config ``run_server`` builds from ``run_config``."""
    method = get_method(run_config["method"])
    run_config = {**method.defaults, **run_config}
    task, _ = validate_run_config(run_config)
    info = task_info(task)
    return method.build(task, run_config, build_model(task, info), info)


@pytest.mark.parametrize("method", ["ef-signsgd", "signsgd", "powersgd"])
def test_a_repeated_round_gets_the_same_reply_and_leaves_the_same_state(method):
    # Prepare: EF residual (ef-signsgd), momentum and the 1-bit model copy (signsgd),
    # EF plus PowerSGD's warm start (powersgd)
    run_config = build_run_config(method, rounds=3, num_clients=2, seed=3)
    once, twice = InProcessGrid(client_app, 2), InProcessGrid(client_app, 2)
    s_once, train_config = _strategy_for(run_config)
    s_twice, _ = _strategy_for(run_config)
    for rnd in (1, 2, 3):
        # Execute: the second grid receives every round's messages twice
        m_once = list(s_once.configure_train(rnd, ArrayRecord(), train_config, once))
        m_twice = list(s_twice.configure_train(rnd, ArrayRecord(), train_config, twice))
        r_once = once.send_and_receive(m_once)
        first = twice.send_and_receive(m_twice)
        again = twice.send_and_receive(m_twice)
        # Assert: identical replies, and the runs stay identical afterwards
        for a, b, c in zip(r_once, first, again, strict=True):
            assert content_bytes(a.content) == content_bytes(b.content) == content_bytes(c.content)
            for key, rec in a.content.array_records.items():
                for name, arr in rec.items():
                    assert arr.data == b.content.array_records[key][name].data
                    assert arr.data == c.content.array_records[key][name].data
        s_once.aggregate_train(rnd, r_once)
        s_twice.aggregate_train(rnd, again)
    np.testing.assert_array_equal(get_flat(s_once.model), get_flat(s_twice.model))
