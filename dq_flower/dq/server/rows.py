"""Row-wise packed layout of quantized samples, for the server's store.

A ``uniform`` payload packs a whole batch as one bit stream (possibly entropy-coded). The
store needs random access to single rows, so each payload is re-laid as byte-aligned
packed rows plus per-row side information, without ever keeping float rows:

- ``codes``: uint8 ``(n, row_bytes)``, the row's ``bits``-bit codes packed MSB first;
- ``side``: float32 ``(n, 2 * groups)``, the per-group minimums then scales (``(n, 0)``
  for fixed-range rows, whose range is ``[0, 1]``);
- ``dither``: int64 ``(n, 2)`` ``(seed, flat start)`` of each row's subtractive dither, or
  ``(n, 0)`` without dither.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import cast

import numpy as np

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.bitpack import pack, packed_nbytes, unpack
from dq_flower.codecs.uniform import Uniform, dither_offsets, expand_ranges, packed_codes
from dq_flower.wire.dq_batch import SampleBatch, payload_quantizer

__all__ = ["RowLayout", "plain_payload", "decode_samples", "keep_rows",
           "kept_rows"]


@dataclass
class _KeptBatch(SampleBatch):
    """A validated batch of which only the payload rows ``kept`` are used."""

    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


def keep_rows(batch: SampleBatch, keep: np.ndarray) -> SampleBatch:
    """``batch`` restricted to the rows where ``keep`` is true.

    Labels, ids and weights are cut; the payload stays as sent (its sizes are what the
    client sent), and :func:`kept_rows` names the payload rows still used.
    """
    idx = np.flatnonzero(np.asarray(keep, dtype=bool))
    base = kept_rows(batch)
    values = {f.name: getattr(batch, f.name) for f in fields(SampleBatch)}
    values.update(labels=batch.labels[idx], ids=batch.ids[idx], weights=batch.weights[idx])
    return _KeptBatch(**values, kept=idx if base is None else base[idx])


def kept_rows(batch: SampleBatch) -> np.ndarray | None:
    """The payload rows a batch uses (``None``: all of them)."""
    return batch.kept if isinstance(batch, _KeptBatch) else None


def plain_payload(p: Payload, bits: int) -> Payload:
    """``p`` with its lossless coder undone, so that its stream is decoded once.

    The ``uniform`` decoder and :meth:`RowLayout.rows` each undo the coder of the payload
    they are given; given this one, neither decodes the stream again (nor its coded ranges,
    which it carries as ``mins`` and ``scales``). Every check of the
    coded payload holds for this one exactly where it holds for ``p``: ``nbits`` moves by
    the difference between the coded and the packed sizes, the context shape goes with the
    context coder, and the padding bits (which no check of a coded stream reads) are
    cleared. ``p`` itself is returned where it names no coder (or none validly).
    """
    if len(p.shape) != 2:
        return p
    p = _plain_ranges(p)
    method = p.meta.get("entropy")
    stream = p.buffers.get("codes")
    if not isinstance(method, str) or method == "none" or stream is None:
        return p
    n, d = p.shape
    packed = packed_codes(p, bits)
    spare = 8 * packed.size - n * d * bits
    if 0 < spare < 8:
        packed = packed.copy()
        packed[-1] &= np.uint8((0xFF << spare) & 0xFF)
    meta = {k: v for k, v in p.meta.items() if k != "context_shape" or method != "context"}
    meta["entropy"] = "none"
    return dataclasses.replace(p, meta=meta, buffers={**p.buffers, "codes": packed},
                               nbits=p.nbits - 8 * int(stream.size) + n * d * bits)


def _plain_ranges(p: Payload) -> Payload:
    """``p`` with coded ranges undone (:func:`~dq_flower.codecs.uniform.expand_ranges`)."""
    groups = p.meta.get("per_channel", 0)
    if "ranges" not in p.meta or isinstance(groups, bool) or not isinstance(groups, int):
        return p  # nothing to undo, or a malformed payload the decoder refuses
    return expand_ranges(p, p.shape[0] * max(groups, 1))


def decode_samples(p: Payload, bits: int, per_channel: int, fixed_range: bool = False
                   ) -> tuple[np.ndarray, Payload]:
    """Float rows ``(n, d)`` of a ``uniform`` samples payload, and ``p`` decoded once.

    ``p``'s settings are checked
    (:func:`~dq_flower.wire.dq_batch.payload_quantizer`), its stream is decoded once
    (:func:`plain_payload`), and the rows are decoded from the plain payload, which the
    store's :meth:`RowLayout.rows` then re-lays without decoding the stream again.
    """
    quantizer = payload_quantizer(p, bits, per_channel, fixed_range)
    plain = plain_payload(p, bits)
    return quantizer.decode(plain), plain


@dataclass(frozen=True)
class RowLayout:
    """Byte-aligned row layout for data of dimension ``dim`` at ``bits`` bits."""

    dim: int
    bits: int
    groups: int = 1
    fixed: bool = False

    @property
    def padded_dim(self) -> int:
        """Codes per row including padding to a whole byte."""
        per_byte = 8 // np.gcd(8, self.bits)
        return -(-self.dim // per_byte) * per_byte

    @property
    def row_bytes(self) -> int:
        """Bytes per packed row."""
        return packed_nbytes(self.padded_dim, self.bits)

    def rows(self, p: Payload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(codes, side, dither)`` of a validated ``uniform`` payload, re-laid by row."""
        n, d = p.shape
        if d != self.dim:
            raise PayloadError(f"samples have dimension {d}, expected {self.dim}")
        p = expand_ranges(p, n * self.groups) if not self.fixed else p
        packed = packed_codes(p, self.bits)
        codes = unpack(packed, self.bits, n * d).reshape(n, d)
        if self.padded_dim != d:
            codes = np.pad(codes, ((0, 0), (0, self.padded_dim - d)))
        rows = pack(codes.reshape(-1), self.bits).reshape(n, self.row_bytes)
        if self.fixed:
            side = np.zeros((n, 0), dtype=np.float32)
        else:
            mins = p.buffers["mins"].reshape(n, self.groups)
            scales = p.buffers["scales"].reshape(n, self.groups)
            side = np.concatenate([mins, scales], axis=1).astype(np.float32)
        seed = p.meta.get("dither_seed")
        if seed is None:
            dither = np.zeros((n, 0), dtype=np.int64)
        else:
            dither = np.stack([np.full(n, int(seed)), np.arange(n) * d], axis=1).astype(np.int64)
        return rows, side, dither

    def dequantize(self, codes: np.ndarray, side: np.ndarray, dither: np.ndarray) -> np.ndarray:
        """Float32 ``(n, dim)`` rows from the row layout."""
        n = codes.shape[0]
        if self.fixed:
            return self._dequantize_fixed(codes, dither)
        g, width = self.groups, self.dim // self.groups
        values = unpack(np.ascontiguousarray(codes).reshape(-1), self.bits, n * self.padded_dim)
        values = values.reshape(n, self.padded_dim)[:, : self.dim].astype(np.float32)
        mins, scales = side[:, :g], side[:, g:]
        out = values.reshape(n, g, width) * scales[:, :, None]
        if dither.shape[1]:
            u = np.stack([dither_offsets(int(s), int(o), self.dim) for s, o in dither])
            out -= (u.reshape(n, g, width) - np.float32(0.5)) * scales[:, :, None]
        out += mins[:, :, None]
        return out.reshape(n, self.dim)

    def _dequantize_fixed(self, codes: np.ndarray, dither: np.ndarray) -> np.ndarray:
        """Fixed-range rows, with the ``uniform`` decoder's own arithmetic (bit-identical)."""
        n = codes.shape[0]
        top = (1 << self.bits) - 1
        ramp = (np.arange(top + 1) / top).astype(np.float32)
        values = unpack(np.ascontiguousarray(codes).reshape(-1), self.bits, n * self.padded_dim)
        out = ramp[values.reshape(n, self.padded_dim)[:, : self.dim]]
        if dither.shape[1]:
            step = cast(Uniform, make("uniform", bits=self.bits, fixed_range=True)).fixed_step
            for i, (s, o) in enumerate(dither):
                u = dither_offsets(int(s), int(o), self.dim)
                u -= np.float32(0.5)
                u *= step
                out[i] -= u
        return out
