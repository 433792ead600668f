"""Message layout of a DQ token upload: windows of token ids, coded losslessly.

The ``samples`` record is a ``tokens`` payload of shape ``(n, length)``: meta ``vocab``,
one buffer ``stream`` (:mod:`dq_flower.codecs.tokens`), ``nbits`` 8 x its bytes. The
``sample-info`` record is a data upload's (:mod:`.dq_batch`): ids, weights and ``counts``
``[n, 0, id width, weights]``; no labels travel, the windows are their own targets. The
data spec of a token federation is ``DataSpec((length,), "tokens", vocab)``.

:func:`decode_token_batch` checks the declared shape, vocabulary and counts against the
server's before the stream is decoded (whose own count bound comes first too), then the
ids; a failed check raises :class:`~dq_flower.codecs.PayloadError` with the reason.
"""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from dq_flower.codecs import Payload, PayloadError
from dq_flower.codecs import tokens as token_coder
from dq_flower.codecs.bitpack import pack_wide, packed_nbytes
from dq_flower.codecs.payload import raw_array, read_raw
from dq_flower.wire.dq_batch import (
    INFO_KEY,
    SAMPLES_KEY,
    SampleBatch,
    _ids,
    expect_rows,
    width_for,
)

__all__ = ["TOKENS_CODEC", "STREAM", "tokens_payload", "encode_token_batch",
           "decode_token_batch", "decode_windows"]

#: The samples payload's codec name.
TOKENS_CODEC = "tokens"
#: Its one buffer.
STREAM = "stream"


def tokens_payload(windows: np.ndarray, vocab: int) -> Payload:
    """Windows ``(n, length)`` of ids below ``vocab`` as a ``tokens`` payload."""
    stream = token_coder.encode(windows, vocab)
    return Payload(TOKENS_CODEC, tuple(int(s) for s in windows.shape), {"vocab": int(vocab)},
                   {STREAM: stream}, nbits=8 * int(stream.size))


def encode_token_batch(windows: np.ndarray, ids: np.ndarray, weights: np.ndarray,
                       vocab: int, id_upper: int) -> tuple[RecordDict, int]:
    """Records of one token upload and its exact payload bits (equal weights: one float)."""
    n = int(windows.shape[0])
    iw = width_for(max(id_upper, 1))
    w = np.asarray(weights, dtype=np.float32)
    if n and np.all(w == w[0]):
        w = w[:1]
    samples = tokens_payload(windows, vocab)
    info = ArrayRecord({"ids": raw_array(pack_wide(np.asarray(ids), iw)),
                        "weights": raw_array(w),
                        "counts": raw_array(np.array([n, 0, iw, w.size], dtype=np.int64))})
    info_bits = 8 * packed_nbytes(n, iw) + 32 * w.size
    return (RecordDict({SAMPLES_KEY: samples.to_record(), INFO_KEY: info}),
            int(samples.nbits + info_bits))


def decode_windows(samples: Payload, vocab: int, length: int, max_samples: int) -> np.ndarray:
    """The int64 windows ``(n, length)`` of a ``tokens`` payload, checked before decoding."""
    n = expect_rows(samples, TOKENS_CODEC, length, max_samples, "token windows")
    if samples.meta.get("vocab") != vocab:
        raise PayloadError(f"token windows of a vocabulary of {samples.meta.get('vocab')!r}; "
                           f"the federation's has {vocab}")
    if set(samples.buffers) != {STREAM}:
        raise PayloadError(f"a tokens payload carries exactly {STREAM!r}")
    stream = samples.buffers[STREAM]
    if stream.dtype != np.uint8 or stream.ndim != 1 or samples.nbits != 8 * stream.size:
        raise PayloadError(f"the token stream must be flat uint8 of nbits 8 x its "
                           f"{stream.size} bytes")
    return token_coder.decode(stream, vocab, n, length)


def decode_token_batch(content: RecordDict, vocab: int, length: int, max_samples: int,
                       id_upper: int | None = None) -> SampleBatch:
    """Parse and validate one token upload; its ``labels`` are the windows ``(n, length)``."""
    if SAMPLES_KEY not in content.array_records or INFO_KEY not in content.array_records:
        raise PayloadError(f"reply misses {SAMPLES_KEY!r} or {INFO_KEY!r}")
    samples = Payload.from_record(content.array_records[SAMPLES_KEY])
    n = int(samples.shape[0]) if samples.shape else 0
    info = content.array_records[INFO_KEY]
    counts = read_raw(info, "counts", "int64", 32)
    if counts.size != 4:
        raise PayloadError("sample-info 'counts' must hold 4 values")
    count, lw, iw, wn = (int(v) for v in counts)
    if count != n or lw != 0 or not 1 <= iw <= 32 or wn not in {1, n}:
        raise PayloadError(f"sample-info counts {counts.tolist()} do not fit {n} token "
                           "windows (no labels, ids of 1 to 32 bits, 1 or n weights)")
    if "labels" in info or "targets" in info:
        raise PayloadError("token windows are their own targets: no labels travel")
    windows = decode_windows(samples, vocab, length, max_samples)
    ids_raw = read_raw(info, "ids", "uint8", packed_nbytes(n, iw))
    ids = _ids(ids_raw, iw, n, id_upper)
    weights = read_raw(info, "weights", "float32", 4 * max(n, 1))
    if weights.size != wn or not np.isfinite(weights).all() or (weights <= 0).any():
        raise PayloadError("sample weights must be finite and positive")
    weights = np.broadcast_to(weights, (n,)).astype(np.float32)
    return SampleBatch(samples, windows, ids, weights, None, 8 * ids_raw.size + 32 * wn)
