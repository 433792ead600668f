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
from flwr.app import MetricRecord

from dq_flower.codecs import PayloadError, make
from dq_flower.dq.server.validation import History, Rules, check_upload
from dq_flower.losses import TargetLoss, binary_loss, default_loss
from dq_flower.wire.dq_batch import SPEC_KEY, DataSpec, encode_batch, spec_of, spec_record
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
