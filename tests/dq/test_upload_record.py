"""A checked upload is a frozen record: each stage returns a new one, none edits it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.validation import Compensations, Upload


def _upload(node: int, delta: np.ndarray | None) -> Upload:
    return Upload(batch=None, x=np.zeros((0, 2), np.float32), candidates=0,  # type: ignore[arg-type]
                  delta=delta, node=node)


def test_an_upload_cannot_be_edited():
    upload = _upload(1, None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        upload.node = 2  # type: ignore[misc]


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
