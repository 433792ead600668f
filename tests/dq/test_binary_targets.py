"""Float targets that are all 0 or 1 (``BCEWithLogitsLoss``'s labels) are ``binary`` targets.

A node's spec says ``binary``; the server then scores the model's outputs as logits with
binary cross-entropy (:class:`~dq_flower.losses.TargetLoss`), where the mean squared error
would pull every negative's logit to 0, the decision boundary.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord

import dq_flower
from dq_flower.baselines import client as baseline_client
from dq_flower.codecs import PayloadError, make
from dq_flower.dq.client.sent import spec_of
from dq_flower.dq.server.validation import History, Rules, check_upload
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.losses import TargetLoss, binary_loss, default_loss
from dq_flower.wire.dq_batch import SPEC_KEY, DataSpec, spec_record
from dq_flower.wire.dq_upload import encode_batch
from tests.apps import cancer_binary
from tests.apps.test_zoo import runs


def test_zero_one_float_targets_are_binary_others_stay_float():
    x = np.zeros((4, 3), np.float32)
    assert spec_of(x, np.array([0.0, 1.0, 1.0, 0.0], np.float32)) == DataSpec((3,), "binary")
    assert spec_of(x, np.zeros(4, np.float32)).target == "binary"  # one node's negatives
    assert spec_of(x, np.eye(4, 2, dtype=np.float32)) == DataSpec((3,), "binary", 2)
    assert spec_of(x, np.array([0.0, 0.5, 1.0, 1.0], np.float32)).target == "float"
    assert spec_of(x, np.array([0, 1, 1, 0])).target == "class"


def test_the_binary_loss_is_bce_on_logits_per_sample():
    logits = torch.tensor([[2.0, -1.0], [0.5, 0.0]])
    targets = torch.tensor([[1.0, 0.0], [0.0, 1.0]])
    expected = torch.nn.functional.binary_cross_entropy_with_logits(
        logits, targets, reduction="none").mean(dim=1)
    assert torch.allclose(binary_loss(logits, targets), expected)
    one = torch.tensor([3.0, -2.0])  # one logit a sample, shape (n,)
    assert binary_loss(one, torch.tensor([1.0, 0.0])).shape == (2,)


def test_the_servers_default_loss_follows_the_spec():
    loss = TargetLoss()
    out, y = torch.tensor([0.0, 0.0]), torch.tensor([1.0, 0.0])
    assert torch.equal(loss(out, y), default_loss(out, y))  # float: squared error
    loss.binary = True
    assert torch.allclose(loss(out, y), torch.full((2,), float(np.log(2.0))))


def test_a_binary_reply_with_a_target_outside_zero_and_one_is_refused():
    spec = DataSpec((3,), "binary")
    rules = Rules(bits=2, dither=False, selection_rule="topk", ranges="sample", spec=spec)
    x = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    samples = make("uniform", bits=2).encode(x, np.random.default_rng(1))
    for targets, ok in ((np.array([0, 1, 1, 0], np.float32), True),
                        (np.array([0, 1, 0.5, 0], np.float32), False)):
        content, _ = encode_batch(samples, targets, np.arange(4), np.full(4, 2.0), 0, 8)
        content[SPEC_KEY] = spec_record(spec)
        content["metrics"] = MetricRecord({"num-examples": 8, "candidates": 8})
        if ok:
            assert check_upload(content, 0, rules, History(), 8).spec == spec
        else:
            with pytest.raises(PayloadError, match="binary targets must be 0 or 1"):
                check_upload(content, 0, rules, History(), 8)


def test_a_one_logit_classifier_trains_through_dq_at_its_defaults():
    pytest.importorskip("sklearn")
    fedavg, dq = runs("cancer_binary")["fedavg"], runs("cancer_binary")["dq"]
    assert dq.final > 0.93, dq.scores  # squared error on the logit ended at 0.776
    page = (Path(__file__).parents[2] / "docs" / "plugin.md").read_text()
    quoted = (f"and ends at {dq.final:.1%} (FedAvg {fedavg.final:.1%}) with "
              f"{fedavg.up_bytes / dq.up_bytes:.1f}x less uplink now")
    assert quoted in " ".join(page.split()), quoted


def test_the_gradient_baselines_devices_score_binary_targets_on_logits_too(monkeypatch):
    pytest.importorskip("sklearn")
    calls = []

    def counted(outputs, targets):
        calls.append(len(targets))
        return binary_loss(outputs, targets)

    monkeypatch.setattr(baseline_client, "binary_loss", counted)

    def train(msg, context):
        data = cancer_binary.load_local_data(int(context.node_config["partition-id"]))
        return dq_flower.client.gradient_train(msg, context, data, model=cancer_binary.Net())

    model = cancer_binary.Net()
    strategy = dq_flower.GradientStrategy(model, codec="qsgd", lr=0.1, seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=20,
                            initial_arrays=ArrayRecord(model.state_dict()))
    trained = cancer_binary.Net()
    trained.load_state_dict(result.arrays.to_torch_state_dict())
    assert calls and cancer_binary.score(trained, *cancer_binary.test_set()) > 0.9


def test_a_binary_spec_switches_the_servers_default_loss_and_a_given_loss_stays():
    strategy = dq_flower.DQStrategy(torch.nn.Linear(3, 1), seed=0)
    assert isinstance(strategy.trainer.loss_fn, TargetLoss)
    strategy.intake.fix_spec(DataSpec((3,), "binary"))  # as a resumed run adopts it
    assert strategy.trainer.loss_fn.binary and strategy.intake.loss_fn is strategy.trainer.loss_fn
    mine = dq_flower.DQStrategy(torch.nn.Linear(3, 1), seed=0, loss_fn=default_loss)
    mine.intake.fix_spec(DataSpec((3,), "binary"))
    assert mine.trainer.loss_fn.user is default_loss  # the user's, called as it is
    out, y = torch.tensor([[0.3], [-1.0]]), torch.tensor([1.0, 0.0])
    assert torch.equal(mine.trainer.loss_fn(out, y), default_loss(out, y))


def test_binary_targets_travel_at_one_bit_each_and_float_specs_refuse_bits():
    from dq_flower.wire.dq_batch import decode_batch

    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    samples = make("uniform", bits=2).encode(x, rng)
    tags = (rng.random((40, 6)) > 0.7).astype(np.float32)  # six 0/1 labels a sample
    ids, weights = np.arange(40), np.ones(40)
    packed, bits = encode_batch(samples, tags, ids, weights, 2, 64, binary=True)
    plain, plain_bits = encode_batch(samples, tags, ids, weights, 2, 64)
    assert plain_bits - bits == 40 * 6 * 16 - 40 * 6  # float16 before: 16 bits a value
    back = decode_batch(packed, None, 3, 2, 64, 64, target_dim=6, float_targets=True,
                        binary=True)
    assert np.array_equal(back.labels, tags) and back.info_nbits < 40 * 6 * 2 + 400
    same = decode_batch(plain, None, 3, 2, 64, 64, target_dim=6, float_targets=True,
                        binary=True)  # a node sending float16 0/1 targets is read as before
    assert np.array_equal(same.labels, tags)
    with pytest.raises(PayloadError, match="targets are uint8"):  # bits for a float spec
        decode_batch(packed, None, 3, 2, 64, 64, target_dim=6, float_targets=True)
    with pytest.raises(PayloadError, match="0/1 targets"):  # bits for fewer targets
        decode_batch(packed, None, 3, 2, 64, 64, target_dim=7, float_targets=True,
                     binary=True)
