"""Class labels of several values a sample (a segmentation mask): wire, checks, store, app."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from torch import nn

from dq_flower.codecs import PayloadError, make
from dq_flower.codecs.bitpack import packed_nbytes
from dq_flower.dq.client.scoring import score_candidates
from dq_flower.dq.client.sent import spec_of
from dq_flower.dq.server.disk_store import DiskSampleStore
from dq_flower.dq.server.store import SampleStore, StoredRows
from dq_flower.model_check import check_model
from dq_flower.model_ops import per_sample_results
from dq_flower.wire.dq_batch import (
    INFO_KEY,
    SPEC_KEY,
    DataSpec,
    read_reply,
    spec_from_record,
    spec_record,
)
from dq_flower.wire.dq_upload import encode_batch
from tests.apps import segment_masks
from tests.apps.runner import run_app

N, H, W, CLASSES = 6, 4, 5, 3
SPEC = DataSpec((1, H, W), "class", H * W, target_shape=(H, W))


def _reply(masks: np.ndarray, spec: DataSpec = SPEC, classes: int = CLASSES):
    """A reply of ``N`` rows of 2-bit samples with ``masks`` and its payload bits."""
    rng = np.random.default_rng(0)
    samples = make("uniform", bits=2).encode(rng.random((N, H * W)).astype(np.float32), rng)
    content, bits = encode_batch(samples, masks, np.arange(N), np.ones(N, np.float32),
                                 classes, N)
    content[SPEC_KEY] = spec_record(spec)
    return content, bits, samples


def _masks(seed: int = 0, shape: tuple[int, ...] = (H, W)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, CLASSES, (N, *shape))


def test_mask_labels_travel_at_two_bits_each_and_arrive_in_their_shape():
    masks = _masks()
    content, bits, samples = _reply(masks)
    sent = content.array_records[INFO_KEY]["labels"]
    assert len(sent.data) == packed_nbytes(N * H * W, 2) == N * H * W * 2 // 8  # 3 classes
    assert bits == samples.nbits + 8 * len(sent.data) + 8 * packed_nbytes(N, 3) + 32
    assert spec_from_record(spec_record(SPEC)) == SPEC
    wire = read_reply(content, SPEC, "sample", 2, CLASSES, N, N)
    assert wire.batch is not None and wire.batch.labels.shape == (N, H, W)
    assert (wire.batch.labels == masks).all() and wire.batch.payload_bits == bits
    assert wire.batch.label_bits == 2
    one = DataSpec((1, H, W))  # a label a row: its spec and labels travel as before
    assert "target-shape" not in spec_record(one) and spec_from_record(spec_record(one)) == one


def test_a_node_reads_its_masks_into_the_spec():
    x, y = np.zeros((N, 1, H, W), np.float32), _masks()
    assert spec_of(x, y) == SPEC
    assert spec_of(x, y[:, 0, 0]) == DataSpec((1, H, W))


@pytest.mark.parametrize(("masks", "spec", "reason"), [
    (np.full((N, H, W), 3), SPEC, "label 3 is out of range (num_classes=3)"),
    (_masks(shape=(H, W - 1)), SPEC, f"sample-info 'labels' carries 24 bytes; {N * H * W} "
     "labels of 2 bits take 30"),
])
def test_a_malformed_mask_is_refused_with_its_reason(masks, spec, reason):
    content, _, _ = _reply(masks, classes=4)  # 2 bits a label either way
    with pytest.raises(PayloadError) as refused:
        read_reply(content, spec, "sample", 2, CLASSES, N, N)
    assert str(refused.value) == reason


def test_a_spec_whose_mask_shape_is_not_its_labels_is_refused():
    record = spec_record(SPEC)
    record["target-dim"] = H * W + 1
    with pytest.raises(PayloadError, match=r"data-spec: target_shape \(4, 5\): not 21 class"):
        spec_from_record(record)
    record["target-dim"], record["target"] = H * W, "float"
    with pytest.raises(PayloadError, match="target_shape"):
        spec_from_record(record)


class _Segmenter(nn.Module):
    def __init__(self, out: int = CLASSES) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(1, out, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x)


def test_the_model_check_counts_classes_per_pixel_and_refuses_outputs_of_another_shape():
    x, y = np.random.default_rng(1).random((N, H * W)).astype(np.float32), _masks()
    assert check_model(_Segmenter(), SPEC, x, y, None) == CLASSES
    flat = nn.Sequential(nn.Flatten(), nn.Linear(H * W, CLASSES))  # one output row a sample
    with pytest.raises(PayloadError, match=r"outputs \(4, 3\) do not score each of a row's"):
        check_model(flat, SPEC, x, y, None)


def test_held_out_masks_are_scored_by_their_mean_pixel_loss():
    model, x, y = _Segmenter(), np.random.default_rng(2).random((N, 1, H, W)), _masks()
    loss, correct = per_sample_results(model, x.astype(np.float32), y)
    with torch.no_grad():
        pixels = nn.functional.cross_entropy(model(torch.from_numpy(x).float()),
                                             torch.from_numpy(y), reduction="none")
    assert correct is None and loss.shape == (N,)
    np.testing.assert_allclose(loss, pixels.mean(dim=(1, 2)).numpy(), rtol=1e-6)


def test_a_nodes_entropy_of_a_mask_is_its_pixels_mean():
    model, x, y = _Segmenter(), np.random.default_rng(3).random((N, 1, H, W)), _masks()
    got = score_candidates("entropy", model, x.astype(np.float32), y)
    with torch.no_grad():
        p = torch.softmax(model(torch.from_numpy(x).float()).double(), dim=1)
    np.testing.assert_allclose(got, (-(p * p.log()).sum(1)).mean(dim=(1, 2)).numpy())
    assert score_candidates("margin", model, x.astype(np.float32), y).shape == (N,)


@pytest.mark.parametrize("on_disk", [False, True])
def test_both_stores_keep_and_give_back_masks(on_disk, tmp_path):
    def decode(codes, side, dither):
        return codes.astype(np.float32)

    store = (DiskSampleStore(decode, tmp_path) if on_disk else SampleStore(decode))
    masks, ids = _masks(4), np.arange(N)
    store.add(StoredRows(codes=ids[:, None].astype(np.uint8), side=np.zeros((N, 0), np.float32),
                         labels=masks, weights=np.ones(N, np.float32),
                         node=np.full(N, 7, np.uint64), ids=ids, dither=np.zeros((N, 0))))
    x, y, _ = store.draw(4, np.random.default_rng(0))
    assert y.shape == (4, H, W) and y.dtype == np.int64
    for row, mask in zip(x[:, 0].astype(int), y, strict=True):
        assert (mask == masks[row]).all()


def test_dq_trains_a_segmentation_app_well_past_its_start():
    logging.getLogger("flwr").setLevel(logging.WARNING)
    try:
        run = run_app(segment_masks, "dq")
    finally:
        logging.getLogger("flwr").setLevel(logging.INFO)
    assert run.scores[-1] > run.scores[0] + 0.05, run.scores  # measured: 0.501 -> 0.578
