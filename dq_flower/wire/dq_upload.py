"""A DQ upload's records as a node builds them (:func:`encode_batch`); read by :mod:`.dq_batch`."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from dq_flower.codecs import Payload
from dq_flower.codecs.bitpack import pack, pack_wide, packed_nbytes
from dq_flower.codecs.payload import raw_array
from dq_flower.wire.dq_batch import (
    COMPENSATION_KEY,
    IGNORED_KEY,
    INFO_KEY,
    SAMPLES_KEY,
    label_width,
    width_for,
)
from dq_flower.wire.targets import IGNORE_INDEX, travelling_targets

__all__ = ["encode_batch"]


def encode_batch(samples: Payload, targets: np.ndarray | None, ids: np.ndarray,
                 weights: np.ndarray, num_classes: int, id_upper: int,
                 compensation: Payload | None = None, binary: bool = False
                 ) -> tuple[RecordDict, int]:
    """Records of one upload and its exact payload bits.

    Class labels packed at ``ceil(log2 num_classes)`` bits (elements labelled
    :data:`IGNORE_INDEX` as the all-ones code of ``ceil(log2 (num_classes + 1))`` bits, said
    by :data:`IGNORED_KEY`), ``binary`` targets (0 or 1) at
    one bit each, float targets as float16 where that moves none beyond 1% of the spread
    (else float32; ``None``: the samples are the targets), equal weights as one float32.
    """
    n = int(ids.shape[0])
    iw = width_for(max(id_upper, 1))
    w = np.asarray(weights, dtype=np.float32)
    if n and np.all(w == w[0]):
        w = w[:1]
    arrays = {"ids": raw_array(pack_wide(np.asarray(ids), iw)), "weights": raw_array(w)}
    if targets is None:
        lw, target_bits = 0, 0
    elif np.issubdtype(targets.dtype, np.integer):  # (n,), or several a sample: n * k codes
        ignored = targets == IGNORE_INDEX  # elements no loss reads (a tagger's padding)
        lw = label_width(num_classes + bool(ignored.any()))
        if ignored.any():
            targets = np.where(ignored, (1 << lw) - 1, targets)
            arrays[IGNORED_KEY] = raw_array(np.ones(1, np.uint8))
        arrays["labels"] = raw_array(pack(np.asarray(targets, dtype=np.uint8), lw) if lw <= 8
                                     else pack_wide(targets.reshape(-1), lw))
        target_bits = 8 * (packed_nbytes(targets.size, lw) + int(ignored.any()))
    else:
        lw, values = 0, np.asarray(targets, dtype=np.float32)
        sent = (pack(values.reshape(-1).astype(np.uint8), 1) if binary
                and np.isin(values, (0.0, 1.0)).all() else travelling_targets(values))
        arrays["targets"] = raw_array(sent)
        target_bits = 8 * sent.nbytes
    arrays["counts"] = raw_array(np.array([n, lw, iw, w.size], dtype=np.int64))
    info_nbits = target_bits + 8 * packed_nbytes(n, iw) + 32 * w.size
    content = RecordDict({SAMPLES_KEY: samples.to_record(), INFO_KEY: ArrayRecord(arrays)})
    if compensation is not None:
        content[COMPENSATION_KEY] = compensation.to_record()
    return content, int(samples.nbits + info_nbits + (compensation.nbits if compensation else 0))
