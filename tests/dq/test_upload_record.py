"""A checked upload (and a decoded gradient) is a frozen record: each stage returns a new one."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.intake import Compensations
from dq_flower.dq.server.validation import Upload
from dq_flower.wire.gradient_reply import GradientUpdate


def _upload(node: int, delta: np.ndarray | None) -> Upload:
    return Upload(batch=None, x=np.zeros((0, 2), np.float32), candidates=0,  # type: ignore[arg-type]
                  delta=delta, node=node)


def test_an_upload_cannot_be_edited():
    upload = _upload(1, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        upload.node = 2  # type: ignore[misc]


def test_a_decoded_gradient_cannot_be_edited():
    # a gradient round keys it by the client's identity in a new record, not in place
    update = GradientUpdate(7, np.zeros(3, np.float32), 1.0, 0.5, 96, 96, 1, 0)
    keyed = dataclasses.replace(update, node=3)
    with pytest.raises(dataclasses.FrozenInstanceError):
        update.node = 3  # type: ignore[misc]
    assert (update.node, keyed.node) == (7, 3) and keyed.vector is update.vector


def test_screening_compensations_returns_new_records_and_leaves_the_inputs():
    rng = np.random.default_rng(0)
    deltas = [rng.normal(0, 1, 50).astype(np.float32) for _ in range(4)]
    deltas.append(deltas[0] * 1e6)  # one implausibly large compensation
    uploads = [_upload(k, d) for k, d in enumerate(deltas)] + [_upload(9, None)]
    before = [u.delta.copy() if u.delta is not None else None for u in uploads]
    comps = Compensations(DQConfig(clip_factor=1.0), 50, data=None)  # type: ignore[arg-type]
    kept, rejected = comps.screen_deltas(uploads)
    assert rejected == 1 and [u.node for u in kept] == [0, 1, 2, 3, 9]
    median = float(np.median([np.linalg.norm(d) for d in deltas[:4]]))
    assert all(np.linalg.norm(u.delta) <= median * (1 + 1e-5) for u in kept[:4])
    assert kept[4] is uploads[5]  # nothing to screen: the same record
    for upload, old in zip(uploads, before, strict=True):  # the inputs are untouched
        assert (upload.delta is None and old is None) or np.array_equal(upload.delta, old)
