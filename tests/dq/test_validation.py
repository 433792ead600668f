"""The round's agreement on a data spec, a value bound and the nodes' claims (dq.validation).

Uploads are built directly (their payloads play no part in the agreement), so each rule is
checked on its own: the majority spec and its model check, the median bound, the example
screen and the weight clip, and the history a node's counts must agree with.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import MetricRecord, RecordDict
from torch import nn

from dq_flower.codecs import PayloadError
from dq_flower.dq.server.validation import (
    EXAMPLES_FACTOR,
    SHARE_FACTOR,
    VALUE_FACTOR,
    History,
    Rules,
    Upload,
    agree,
    check_upload,
    read_counts,
)
from dq_flower.model_check import check_model
from dq_flower.wire.dq_batch import SPEC_KEY, DataSpec, SampleBatch, spec_record

FLAT, WIDE = DataSpec((64,)), DataSpec((1, 64))
RULES = Rules(bits=2, dither=False, selection_rule="topk")


def _upload(node, examples=300, candidates=None, rows=4, spec=FLAT, scale=1.0,
            partition=None):
    candidates = examples if candidates is None else candidates
    batch = SampleBatch(None, np.zeros(rows, dtype=np.int64), np.arange(rows),  # type: ignore[arg-type]
                        np.full(rows, candidates / rows, dtype=np.float32))
    return Upload(batch, np.zeros((rows, spec.dim), np.float32), candidates, None, node,
                  node if partition is None else partition, examples, spec=spec,
                  scale=scale)


def _passes(spec, upload):
    return 10


def _only(good):
    def check(spec, upload):
        if spec != good:
            raise PayloadError(f"the model cannot train on samples of shape {spec}")
        return 10
    return check


def test_the_majority_spec_is_agreed_and_the_others_are_refused_with_a_reason():
    uploads = [_upload(1, spec=WIDE), _upload(2), _upload(3), _upload(4)]
    verdict = agree(uploads, RULES, {}, _passes)
    assert verdict.spec == FLAT
    assert [u.node for u in verdict.accepted] == [2, 3, 4]
    [(refused, reason)] = verdict.refused
    assert refused.node == 1 and "is not the" in reason


def test_a_tie_goes_to_the_lowest_partition_id_and_a_spec_the_model_refuses_gives_way():
    assert agree([_upload(1, spec=WIDE), _upload(2)], RULES, {}, _passes).spec == WIDE
    verdict = agree([_upload(1, spec=WIDE), _upload(2, spec=WIDE), _upload(3)], RULES, {},
                    _only(FLAT))
    assert verdict.spec == FLAT and [u.node for u in verdict.accepted] == [3]
    assert all("cannot train" in reason for _, reason in verdict.refused)


def test_a_hostile_majority_in_the_first_round_sets_the_spec():
    """The documented limit: a majority the model can train on wins."""
    verdict = agree([_upload(1), _upload(2, spec=WIDE), _upload(3, spec=WIDE)], RULES, {},
                    _passes)
    assert verdict.spec == WIDE


def test_the_value_bound_is_the_median_scale_times_the_factor():
    uploads = [_upload(1, scale=1.0), _upload(2, scale=1.2), _upload(3, scale=0.9),
               _upload(4, scale=500.0)]
    verdict = agree(uploads, RULES, {}, _passes)
    assert verdict.value_bound == pytest.approx(VALUE_FACTOR * 1.1)
    assert [u.node for u, _ in verdict.refused] == [4]
    # one reply cannot be cross-checked: its own scale sets the bound
    assert agree([_upload(1, scale=7.0)], RULES, {}, _passes).value_bound == 7.0 * VALUE_FACTOR
    # a known bound is kept (check_upload enforces it)
    known = Rules(2, False, "topk", spec=FLAT, value_bound=3.0)
    assert agree(uploads[:1], known, {}, _passes).value_bound is None


def test_implausible_example_counts_are_counted_down_against_the_other_nodes():
    """A count over 100x the lower median is taken as that bound, its rows kept: it was
    refused, and one honest large site beside small ones was refused every round."""
    uploads = [_upload(n) for n in (1, 2, 3, 4)] + [_upload(5, examples=2**31 - 1)]
    low = uploads[0].examples
    verdict = agree(uploads, RULES, {}, _passes)
    assert not verdict.refused and len(verdict.accepted) == 5
    [(counted, reason)] = verdict.counted
    assert counted.node == 5 and f"over {EXAMPLES_FACTOR:g} times" in reason
    [large] = [u for u in verdict.accepted if u.node == 5]
    assert large.examples == int(EXAMPLES_FACTOR * low) and large.weight_scale < 1.0
    # alone in its round, it is still compared with the nodes accepted before
    alone = agree([_upload(5, examples=2**31 - 1)], RULES, {1: 300, 2: 300, 3: 300}, _passes)
    assert alone.accepted[0].examples == int(EXAMPLES_FACTOR * 300) and len(alone.counted) == 1
    # two nodes: the lower median is the honest one's
    two = agree([_upload(1), _upload(5, examples=10**6)], RULES, {}, _passes)
    assert [u.examples for u in two.accepted] == [low, int(EXAMPLES_FACTOR * low)]
    # within the bound, a count stands as claimed
    assert not agree(uploads[:4] + [_upload(5, examples=99 * low)], RULES, {}, _passes).counted


def test_an_over_large_weight_is_clipped_to_the_factor_times_the_median_node():
    uploads = [_upload(n) for n in (1, 2, 3, 4)] + [_upload(5, examples=20 * 300)]
    verdict = agree(uploads, RULES, {}, _passes)
    assert not verdict.refused
    heavy = verdict.accepted[-1]
    assert heavy.candidates == SHARE_FACTOR * 300
    assert heavy.batch.weights.sum() == pytest.approx(SHARE_FACTOR * 300)
    assert heavy.weight_scale == pytest.approx(SHARE_FACTOR / 20)
    assert uploads[-1].candidates == 20 * 300  # the input is not changed
    assert all(u.weight_scale == 1.0 for u in verdict.accepted[:-1])


def test_measured_dirichlet_partition_sizes_are_not_clipped():
    sizes = [954, 1051, 1093, 3803, 4041, 5441, 6502, 7912, 12924, 16279]  # FMNIST, 0.1
    uploads = [_upload(n, examples=s) for n, s in enumerate(sizes)]
    verdict = agree(uploads, RULES, {}, _passes)
    assert len(verdict.accepted) == 10 and all(u.weight_scale == 1.0 for u in verdict.accepted)


def test_counts_must_agree_with_the_node_history():
    metrics = MetricRecord({"num-examples": 300, "candidates": 300, "partition-id": 0})
    assert read_counts(metrics, 64, History(), resend=False) == (300, 300, 0)
    # 128 rows held: at most 300 - 128 + 64 candidates (a late reply's own rows may be held)
    with pytest.raises(PayloadError, match="does not hold"):
        read_counts(metrics, 64, History(examples=300, stored=128), resend=False)
    assert read_counts(metrics, 64, History(examples=300, stored=64), resend=False)[0] == 300
    assert read_counts(metrics, 64, History(examples=300, stored=64), resend=True)[0] == 300
    # a node's data may grow between rounds (a stream): its new count is taken
    grown = MetricRecord({"num-examples": 300, "candidates": 100, "partition-id": 0})
    assert read_counts(grown, 64, History(examples=200, stored=200), resend=False) == (
        100, 300, 0)
    with pytest.raises(PayloadError, match="does not hold"):  # no more candidates than grew
        read_counts(grown, 64, History(examples=200, stored=280), resend=False)


def test_the_model_check_runs_the_training_loss_and_changes_nothing():
    torch.manual_seed(0)
    readme = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))  # no flattening
    x, y = np.random.default_rng(0).random((8, 64), dtype=np.float32), np.arange(8) % 10
    readme(torch.zeros(1, 1, 64))  # the model alone accepts (1, 64) samples ...
    with pytest.raises(PayloadError, match=r"cannot train on samples of shape \(1, 64\)"):
        check_model(readme, WIDE, x, y, None)  # ... the training loss does not
    with pytest.raises(PayloadError, match="out of range"):
        check_model(readme, FLAT, x, y + 5, None)
    model = nn.Sequential(nn.Linear(64, 16), nn.BatchNorm1d(16), nn.Linear(16, 10))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    assert check_model(model, FLAT, x, y, None) == 10
    assert model.training  # its mode restored, its parameters and statistics untouched
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


def _reply_without_rows(candidates: int) -> RecordDict:
    """What a node with every row sent answers: its counts and data spec, no samples."""
    return RecordDict({SPEC_KEY: spec_record(FLAT), "metrics": MetricRecord({
        "num-examples": 300, "candidates": candidates, "selected": 0, "partition-id": 2})})


def test_a_reply_without_rows_is_its_counts_only():
    upload = check_upload(_reply_without_rows(0), 7, RULES, History(examples=250, stored=250),
                          max_rows=64, source=11)
    assert len(upload.batch) == 0 and upload.x.shape == (0, FLAT.dim)
    assert (upload.examples, upload.candidates, upload.partition) == (300, 0, 2)
    assert (upload.node, upload.source, upload.spec) == (7, 11, FLAT)
    with pytest.raises(PayloadError, match="without samples claims 5 candidates"):
        check_upload(_reply_without_rows(5), 7, RULES, History(examples=250, stored=250), 64)
    other = RecordDict({SPEC_KEY: spec_record(DataSpec((8,))),
                        "metrics": _reply_without_rows(0)["metrics"]})
    with pytest.raises(PayloadError, match="differs from the federation"):
        check_upload(other, 7, Rules(bits=2, dither=False, selection_rule="topk", spec=FLAT),
                     History(), 64)
