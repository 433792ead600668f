"""Reference rows: a few of a node's rows at 8 bits, for the server to compare its model on.

A node not given the model cannot compare the model's loss on its raw rows with that on
their codes (:mod:`dq_flower.wire.raw_fit`). Asked once (round config ``reference-rows``:
how many rows), it sends a seeded sample of its rows coded at :data:`REFERENCE_BITS`, the
finest width the codecs give, in two reply records laid out as an upload's: the samples'
``uniform`` payload (``reference-rows``, bit-packed) and their ``sample-info``
(``reference-rows-info``: targets, ids, one weight); the bytes of their arrays count in the
reply's uplink. The server keeps them and compares its model on them against the same rows
recoded at the run's width (:mod:`dq_flower.dq.server.reference_rows`).
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from dq_flower.codecs import Payload, PayloadError
from dq_flower.wire.dq_batch import (
    INFO_KEY,
    REFERENCE_INFO_KEY,
    REFERENCE_KEY,
    SAMPLES_KEY,
    DataSpec,
    decode_batch,
    payload_quantizer,
)
from dq_flower.wire.dq_upload import encode_batch

__all__ = ["REFERENCE_KEY", "REFERENCE_INFO_KEY", "REFERENCE_BITS", "MAX_ROWS", "MIN_ROWS",
           "reference_records", "read_reference"]

#: The width of reference rows: the finest the ``uniform`` codec gives
REFERENCE_BITS = 8
#: Rows a node sends (fewer where it holds fewer); below :data:`MIN_ROWS` it sends none,
#: and the server refuses more than :data:`MAX_ROWS` (one node cannot outweigh the others)
MAX_ROWS, MIN_ROWS = 16, 8


def reference_records(samples: Payload, targets: np.ndarray | None,
                      num_classes: int, binary: bool) -> dict[str, ArrayRecord]:
    """The two records of reference rows coded as ``samples`` (their bytes are what counts)."""
    n = int(samples.shape[0])
    content = encode_batch(samples, targets, np.arange(n), np.ones(n, np.float32),
                           num_classes, max(n, 1), None, binary)[0]
    return {REFERENCE_KEY: content.array_records[SAMPLES_KEY],
            REFERENCE_INFO_KEY: content.array_records[INFO_KEY]}


def read_reference(content: RecordDict, spec: DataSpec, num_classes: int | None,
                   per_channel: int) -> tuple[np.ndarray, np.ndarray] | None:
    """A reply's reference rows decoded and their targets (``None``: it carries none).

    ``spec``: the federation's data spec; ``per_channel``: the channels its rows are coded
    by (0: by sample). Malformed rows raise :class:`PayloadError` with the reason: one record
    without the other, a width other than :data:`REFERENCE_BITS`, rows of another shape,
    fewer than :data:`MIN_ROWS` or more than :data:`MAX_ROWS`, targets unlike the spec's,
    values that are not finite.
    """
    found = {REFERENCE_KEY, REFERENCE_INFO_KEY} & set(content.array_records)
    if not found:
        return None
    if len(found) < 2:
        raise PayloadError(f"reference rows: {min(found)!r} without its other record")
    batch = decode_batch(RecordDict({SAMPLES_KEY: content.array_records[REFERENCE_KEY],
                                     INFO_KEY: content.array_records[REFERENCE_INFO_KEY]}),
                         num_classes, spec.dim, REFERENCE_BITS, MAX_ROWS, MAX_ROWS,
                         spec.target_dim, spec.target != "class", 0, spec.target == "binary",
                         spec.target == "inputs", spec.target_shape)
    if len(batch) < MIN_ROWS:
        raise PayloadError(f"reference rows: {len(batch)} rows, fewer than {MIN_ROWS}")
    try:
        rows = payload_quantizer(batch.samples, REFERENCE_BITS, per_channel, False,
                                 per_channel > 1 and spec.channels_last).decode(batch.samples)
    except ValueError as exc:  # a stream that does not decode to its rows
        raise PayloadError(f"reference rows do not decode: {exc}") from None
    if rows.shape != (len(batch), spec.dim):
        raise PayloadError(f"reference rows of shape {rows.shape}, not ({len(batch)}, {spec.dim})")
    if not np.isfinite(rows).all():
        raise PayloadError("reference rows: values that are not finite")
    return np.asarray(rows, np.float32), batch.labels
