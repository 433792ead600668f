"""FedAvg with a compressed update: ``local-epochs`` on the gradient strategy, the
``fedavg-*`` methods, and their exact equivalence with Flower's FedAvg when lossless."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict

from dq_flower.baselines.client import epoch_batches
from dq_flower.baselines.config import FedAvgConfig, GradientConfig
from dq_flower.codecs import make
from dq_flower.config import read
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import get_method, method_names
from dq_flower.harness.server_app import run_server, validate_run_config
from dq_flower.harness.simulate import build_run_config
from dq_flower.model_ops import get_flat
from dq_flower.seeding import Purpose, round_rng
from dq_flower.wire.gradient import epoch_steps
from tests.baselines.test_compressed import make_strategy

FEDAVG_STAR = ["fedavg-qsgd2", "fedavg-qsgd4", "fedavg-ef-sign", "fedavg-topk", "fedavg-fp16",
               "fedavg-fp32"]


def _run(method: str, **knobs):
    common = {"num_clients": 3, "rounds": 3, "seed": 2, "partition": "dirichlet"}
    grid = InProcessGrid(client_app, 3)
    result = run_server(grid, build_run_config(method, **common, **knobs))
    return result, [r["accuracy"] for r in result.history]


def test_lossless_local_epochs_reproduce_flowers_fedavg_round_after_round():
    # Prepare: unequal Dirichlet partitions (so clients take different numbers of steps),
    # the identity codec (lossless, zlib-coded where that shrinks it), server lr 1, no
    # momentum: FedAvg's own update, through GradientStrategy and gradient_train; and the
    # registered fedavg-fp32: Flower's FedAvg in CompressedUpdates with compression_mod
    fedavg, fedavg_acc = _run("fedavg", local_epochs=1, client_lr=0.1)
    ours, ours_acc = _run("sgd", local_epochs=1, client_lr=0.1, lr=1.0, momentum=0.0,
                          entropy_coder="zlib", clip_factor=0.0, weight_cap=0.0,
                          min_cosine=-1.0)
    registered, registered_acc = _run("fedavg-fp32", client_lr=0.1, entropy_coder="zlib")
    # Assert: the same test accuracy and loss after every round
    assert ours_acc == fedavg_acc == registered_acc and len(ours_acc) == 4
    for run in (ours, registered):
        np.testing.assert_allclose([r["loss"] for r in run.history],
                                   [r["loss"] for r in fedavg.history], rtol=1e-5)
        assert run.history[1]["up_bytes"] < fedavg.history[1]["up_bytes"]  # zlib on float32
    assert ours.history[1]["down_bytes"] < fedavg.history[1]["down_bytes"]  # zlib-coded model
    # the wrapper sends the inner FedAvg's float32 broadcast as it is (plus its config keys)
    assert 0 <= registered.history[1]["down_bytes"] - fedavg.history[1]["down_bytes"] \
        < 0.01 * fedavg.history[1]["down_bytes"]
    assert all(r["coded_replies"] == 3 and r["up_payload_bits"] <= 32 * 3 * run.num_params
               for r in registered.history[1:])


def test_one_lossless_round_lands_on_fedavgs_weighted_mean_of_local_models():
    # Prepare: the clients' local epochs computed by hand, with FedAvg's own shuffles
    from dq_flower.harness.fedavg_client import local_epochs
    from dq_flower.harness.runtime import build_model
    from dq_flower.harness.tasks.data import load_partition

    strategy, task, info = make_strategy(num_partitions=3, seed=2,
                                         task_kw={"partition": "dirichlet"}, codec="identity",
                                         local_epochs=1, lr=1.0, momentum=0.0, client_lr=0.1,
                                         clip_factor=0.0, weight_cap=0.0,
                                         min_cosine=-1.0)
    w0 = get_flat(strategy.model)
    expected, total = np.zeros(w0.size), 0
    for pid in range(3):
        x, y, _ = load_partition("digits", pid, 3, "dirichlet", 0.5, 2)
        local = build_model(task, info)
        local_epochs(local, x, y, FedAvgConfig(), round_rng(2, 1, pid, Purpose.SHUFFLE))
        expected += x.shape[0] * get_flat(local).astype(np.float64)
        total += x.shape[0]
    expected /= total
    grid = InProcessGrid(client_app, 3)
    # Execute
    msgs = list(strategy.configure_train(1, ArrayRecord(), strategy.test_config, grid))
    _, metrics = strategy.aggregate_train(1, grid.send_and_receive(msgs))
    # Assert
    assert metrics["replies"] == 3 and metrics["stepped"] == 1
    np.testing.assert_allclose(get_flat(strategy.model), expected, rtol=0, atol=2e-6)


def test_epoch_batches_visit_every_row_once_per_epoch_in_fedavgs_order():
    batches = epoch_batches(seed=4, server_round=2, partition_id=1, n=70, batch_size=32,
                            epochs=2)
    assert [b.size for b in batches] == [32, 32, 6, 32, 32, 6]
    for epoch in (batches[:3], batches[3:]):
        assert sorted(np.concatenate(epoch).tolist()) == list(range(70))
    rng = round_rng(4, 2, 1, Purpose.SHUFFLE)
    np.testing.assert_array_equal(np.concatenate(batches[:3]), rng.permutation(70))
    assert epoch_steps(140, 32, 2) == 6


@pytest.mark.parametrize("name", FEDAVG_STAR)
def test_fedavg_star_methods_are_registered_with_one_local_epoch(name):
    method = get_method(name)
    assert name in method_names() and method.family == "compressed"
    run_config = build_run_config(name, rounds=1)
    _, cfg = validate_run_config(run_config)
    client = read(FedAvgConfig, run_config)
    assert client.local_epochs == 1 and cfg.clip_factor == 0.0 and cfg.weight_cap == 0.0
    assert cfg.entropy_coder == "zlib"  # the plugin's default, as for DQ; every preset sets it


def test_fedavg_star_builds_flowers_fedavg_inside_the_wrapper():
    from flwr.serverapp.strategy import FedAvg

    from dq_flower import CompressedUpdates
    from dq_flower.harness.runtime import build_model, task_info

    run_config = build_run_config("fedavg-qsgd2", rounds=1)
    task, _ = validate_run_config(run_config)
    info = task_info(task)
    strategy, config = get_method("fedavg-qsgd2").build(
        task, run_config, build_model(task, info), info)
    assert isinstance(strategy, CompressedUpdates) and type(strategy.strategy) is FedAvg
    assert config["method"] == "fedavg-qsgd2" and strategy.cfg.codec == "qsgd"


def test_method_codecs_and_bits():
    cfgs = {m: validate_run_config(build_run_config(m, rounds=1))[1]
            for m in FEDAVG_STAR}
    downlinks = {m: validate_run_config(build_run_config(m, rounds=1))[1].downlink
                 for m in FEDAVG_STAR}
    x = np.random.default_rng(0).standard_normal(512 * 100).astype(np.float32)
    for name, bits in (("fedavg-qsgd2", 2), ("fedavg-qsgd4", 4)):
        codec = make("qsgd", **cfgs[name].codec_kwargs)  # the fixed-length code
        assert codec.encode(x, np.random.default_rng(0)).nbits == x.size * bits + 32 * 100
    assert cfgs["fedavg-ef-sign"].codec == "ef-sign"
    assert cfgs["fedavg-topk"].codec_kwargs["ratio"] == 0.01
    assert cfgs["fedavg-fp16"].codec == "fp16" and downlinks["fedavg-fp16"] == "fp16"
    assert cfgs["fedavg-fp32"].codec == "identity" and make("identity").lossless
    assert {downlinks[m] for m in FEDAVG_STAR if m != "fedavg-fp16"} == {"float32"}


def test_neutral_run_config_values_keep_each_methods_own_choices():
    # what pyproject.toml lists for every method (flwr run)
    listed = {"levels": 0, "bucket": 0, "ratio": 0.0, "codec-params": "", "local-epochs": 0,
              "downlink": "auto", "clip-factor": 1.0, "weight-cap": 2.0}
    _, q2 = validate_run_config({**listed, "method": "fedavg-qsgd2"})
    _, fp = validate_run_config({**listed, "method": "fedavg-fp16"})
    _, qs = validate_run_config({**listed, "method": "qsgd"})
    _, fa = validate_run_config({**listed, "method": "fedavg"})
    q2_client = read(FedAvgConfig, {**listed, "method": "fedavg-qsgd2"})
    assert q2.codec_kwargs["levels"] == 1 and q2_client.local_epochs == 1
    assert q2.clip_factor == 0.0 and q2.weight_cap == 0.0 and q2.downlink == "float32"
    assert fp.downlink == "fp16"
    assert qs.local_epochs is None and qs.codec_kwargs["levels"] == 4
    assert fa.local_epochs == 1
    _, explicit = validate_run_config({"method": "fedavg-qsgd2", "levels": 3})
    assert explicit.codec_kwargs["levels"] == 3


def test_a_bad_client_knob_of_a_fedavg_star_method_fails_naming_its_key():
    with pytest.raises(ValueError, match="client-lr"):
        validate_run_config({"method": "fedavg-qsgd2", "client-lr": -1.0})


def test_local_epochs_knob_is_validated():
    with pytest.raises(ValueError, match="^local-epochs"):
        GradientConfig(local_epochs=1, local_steps=5)
    with pytest.raises(ValueError, match="^local-epochs"):
        GradientConfig(local_epochs=-1)
    with pytest.raises(ValueError, match="^entropy-coder"):
        GradientConfig(entropy_coder="gzip")


def _reply(strategy, examples):
    payload = strategy.codec.encode(np.zeros(strategy.dim, np.float32))
    return RecordDict({"update": payload.to_record(),
                       "metrics": MetricRecord({"num-examples": examples, "train-loss": 1.0})})


@pytest.mark.parametrize(("examples", "ok"), [(2 * 359, True), (359, False), (0, False),
                                              (2 * (1 << 24) + 2, False)])
def test_server_checks_num_examples_against_the_epochs(examples, ok):
    # Prepare: 2 epochs: num-examples must be twice a row count, at most 2 x 2**24
    strategy, _, _ = make_strategy(num_partitions=1, codec="identity", local_epochs=2,
                                   lr=1.0, momentum=0.0)

    def fake(msg, _ctx):
        return Message(_reply(strategy, examples), reply_to=msg)

    grid = InProcessGrid(fake, 1)
    msgs = list(strategy.configure_train(1, ArrayRecord(), ConfigRecord({}), grid))
    # Execute
    _, metrics = strategy.aggregate_train(1, grid.send_and_receive(msgs))
    # Assert
    assert metrics["replies"] == int(ok) and metrics["rejected"] == int(not ok)


@pytest.mark.parametrize(("name", "least"), [("fedavg-qsgd2", 0.75), ("fedavg-qsgd4", 0.75),
                                             ("fedavg-ef-sign", 0.6), ("fedavg-topk", 0.4),
                                             ("fedavg-fp16", 0.75), ("fedavg-fp32", 0.75)])
def test_each_fedavg_star_method_trains_with_fewer_uplink_bytes_than_float32(name, least):
    result = run_server(InProcessGrid(client_app, 4),
                        build_run_config(name, rounds=5, entropy_coder="zlib"))
    h = result.history
    assert h[-1]["accuracy"] >= least
    assert all(8 * r["up_bytes"] >= r["up_payload_bits"] for r in h[1:])
    raw_bits_per_coord = 32 if name == "fedavg-fp32" else 16
    assert h[1]["up_payload_bits"] <= h[1]["up_raw_payload_bits"] \
        <= 4 * raw_bits_per_coord * result.num_params
    float32_up = 4 * 32 * result.num_params / 8
    least_saving = {"fedavg-fp16": 0.5, "fedavg-fp32": 1.0}.get(name, 0.1)
    assert h[1]["up_bytes"] < least_saving * float32_up


def test_fp16_both_ways_matches_fedavg_to_half_precision():
    fedavg = run_server(InProcessGrid(client_app, 4), build_run_config("fedavg", rounds=3))
    fp16 = run_server(InProcessGrid(client_app, 4),
                      build_run_config("fedavg-fp16", rounds=3, entropy_coder="zlib"))
    for a, b in zip(fedavg.history, fp16.history, strict=True):
        assert abs(a["accuracy"] - b["accuracy"]) <= 0.01
    assert fp16.history[1]["down_bytes"] < 0.55 * fedavg.history[1]["down_bytes"]


def test_codec_of_a_method_decodes_its_replies():
    cfg = validate_run_config(build_run_config("fedavg-qsgd2", rounds=1))[1]
    x = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    p = cfg.make_codec().encode(x, np.random.default_rng(1))
    np.testing.assert_array_equal(cfg.make_codec().decode(p),
                                  make("qsgd", levels=1, bucket=512).decode(
                                      make("qsgd", levels=1, bucket=512).encode(
                                          x, np.random.default_rng(1))))


def test_the_wrapper_checkpoints_its_norm_screen_reference():
    from flwr.serverapp.strategy import FedAvg

    from dq_flower import CompressedUpdates

    wrapper = CompressedUpdates(FedAvg(), codec="qsgd")
    wrapper.norms.keep([1.0, 2.0, 3.0])  # a round of three sets the reference
    resumed = CompressedUpdates(FedAvg(), codec="qsgd")
    resumed.load_state_dict(wrapper.state_dict())
    # a round of two cannot set its own reference: only the restored one rejects 1000x
    assert resumed.norms.keep([2.0, 2000.0]) == wrapper.norms.keep([2.0, 2000.0]) == \
        [True, False]
    assert CompressedUpdates(FedAvg(), codec="qsgd").norms.keep([2.0, 2000.0]) == [True, True]


def test_context_coding_of_qsgd_updates_through_the_wrapper_is_never_larger_than_zlib():
    zlib, _ = _run("fedavg-qsgd2", client_lr=0.1, entropy_coder="zlib")
    context, _ = _run("fedavg-qsgd2", client_lr=0.1, entropy_coder="context")
    assert [r["accuracy"] for r in context.history] == [r["accuracy"] for r in zlib.history]
    for a, b in zip(context.history[1:], zlib.history[1:], strict=True):
        assert a["coded_replies"] == 3 and a["up_payload_bits"] <= b["up_payload_bits"]
    assert context.history[-1]["cum_up_bytes"] < zlib.history[-1]["cum_up_bytes"]


def test_a_batch_norm_model_keeps_its_integer_buffers_round_after_round():
    # Flower's FedAvg averages BatchNorm's int64 num_batches_tracked into a float; the
    # wrapper puts it back in its dtype, so every round's replies match the broadcast
    # layout (before, every reply of round 2 was refused: "is int64 (), received float64")
    result, acc = _run("fedavg-qsgd2", model="resnet20", client_lr=0.1)
    assert [r["coded_replies"] for r in result.history[1:]] == [3, 3, 3]
    assert acc[-1] > acc[0]


def test_layout_with_dtypes_rounds_averaged_integer_arrays_back():
    from flwr.app import Array

    from dq_flower.wire.compressed_update import Layout

    sent = ArrayRecord({"w": Array(np.ones(3, np.float32)),
                        "n": Array(np.array(4, dtype=np.int64))})
    layout = Layout.of("arrays", sent)
    averaged = ArrayRecord({"w": Array(np.full(3, 0.5, np.float32)),
                            "n": Array(np.array([4.6], dtype=np.float64))})
    back = layout.with_dtypes(averaged)
    assert str(back["n"].dtype) == "int64" and back["n"].shape == () and int(back["n"].numpy()) == 5
    np.testing.assert_array_equal(back["w"].numpy(), averaged["w"].numpy())
