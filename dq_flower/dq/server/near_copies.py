"""Near-copies: rows within a few codes of a row the same client sent before.

An exact hash misses a copy with a code or two moved by one level. Here a row is a
**near-copy** where at most :func:`near_codes` of its codes (one in 16) differ from a row of
the same client: one of a seeded sample of up to :data:`REFERENCE_ROWS` of its earlier rows
(a reservoir, so memory and time per upload stay bounded), or an earlier row of the same
upload. Honest digits rows are at least 3 codes of 64 from their client's nearest other
row (5 or more for 99%), so a client's share of near-copies is judged against the median
client's as exact copies are (:class:`~dq_flower.dq.server.node_screen.CopyScreen`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.codecs.bitpack import unpack

__all__ = ["NearCopies", "near_codes", "code_distance", "REFERENCE_ROWS"]

#: Earlier rows per client a new row is compared with at most (a seeded reservoir).
REFERENCE_ROWS = 2048
#: New rows compared at once (bounds the temporary ``chunk x reference x codes`` array).
_CHUNK = 16
#: New rows compared at once on packed words.
_WORD_CHUNK = 4
#: Per byte, the lowest bit of each code (MSB-first packing) for bits that divide 8.
_LOW_BITS = {1: 0xFF, 2: 0x55, 4: 0x11, 8: 0x01}


def near_codes(codes: int) -> int:
    """Differing codes (of ``codes``) up to which two rows are near-copies: one in 16, >= 1."""
    return max(1, int(codes) // 16)


def code_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(len(a), len(b))`` counts of differing codes between unpacked rows."""
    out = np.empty((len(a), len(b)), dtype=np.int64)
    for start in range(0, len(a), _CHUNK):
        part = a[start:start + _CHUNK, None, :]
        out[start:start + _CHUNK] = (part != b[None, :, :]).sum(axis=2)
    return out


def _words(packed: np.ndarray) -> np.ndarray:  # rows as uint64 words (zero padded)
    pad = -packed.shape[1] % 8
    rows = np.pad(packed, ((0, 0), (0, pad))) if pad else packed
    return np.ascontiguousarray(rows).view(np.uint64)


def packed_distance(a: np.ndarray, b: np.ndarray, bits: int) -> np.ndarray:
    """:func:`code_distance` of packed rows of 1, 2, 4 or 8-bit codes (none straddles a byte).

    XOR, each code's bits folded onto its lowest, counted (``np.bitwise_count``).
    """
    low = np.uint64(int.from_bytes(bytes([_LOW_BITS[bits]]) * 8, "little"))
    wa, wb = _words(a), _words(b)
    out = np.empty((len(a), len(b)), dtype=np.int64)
    for start in range(0, len(a), _WORD_CHUNK):  # small chunks: the XORs stay in cache
        diff = wa[start:start + _WORD_CHUNK, None, :] ^ wb[None, :, :]
        shift = 1
        while shift < bits:
            diff |= diff >> np.uint64(shift)
            shift *= 2
        diff &= low
        out[start:start + _WORD_CHUNK] = np.bitwise_count(diff).sum(axis=2)
    return out


@dataclass
class NearCopies:
    """Per client, a reservoir of earlier rows (packed codes) to compare new rows with.

    ``bits``: bits per code of the packed rows.
    """

    bits: int
    reference: dict[int, np.ndarray] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)

    def _unpack(self, packed: np.ndarray) -> np.ndarray:
        n, width = packed.shape
        count = width * 8 // self.bits
        return unpack(np.ascontiguousarray(packed).reshape(-1), self.bits,
                      n * count).reshape(n, count)

    def distance(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """Differing codes between packed rows ``a`` and ``b`` (all pairs)."""
        if self.bits in _LOW_BITS:
            return packed_distance(a, b, self.bits)
        return code_distance(self._unpack(a), self._unpack(b))

    def mask(self, node: int, packed: np.ndarray) -> np.ndarray:
        """Which rows of one upload (packed codes) are near-copies; they join the reservoir."""
        packed = np.ascontiguousarray(packed, dtype=np.uint8)
        n = len(packed)
        if n == 0:
            return np.zeros(0, dtype=bool)
        limit = near_codes(packed.shape[1] * 8 // self.bits)
        near = np.zeros(n, dtype=bool)
        old = self.reference.get(int(node))
        if old is not None and len(old):
            near |= self.distance(packed, old).min(axis=1) <= limit
        within = self.distance(packed, packed)
        within[np.triu_indices(n)] = limit + 1  # only earlier rows of the upload count
        near |= within.min(axis=1) <= limit
        self._remember(int(node), packed)
        return near

    def _remember(self, node: int, packed: np.ndarray) -> None:
        """Reservoir sampling of the client's rows (seeded by the client and its count)."""
        ref = self.reference.get(node, np.zeros((0, packed.shape[1]), dtype=np.uint8))
        seen = self.seen.get(node, 0)
        rng = np.random.default_rng([node % (1 << 63), seen])
        room = max(REFERENCE_ROWS - len(ref), 0)
        ref = np.concatenate([ref, packed[:room]])
        rest = packed[room:]
        if len(rest):  # row i replaces a uniform slot of the first i + 1 (Algorithm R)
            slots = rng.integers(0, np.arange(seen + room, seen + len(packed)) + 1)
            taken = np.flatnonzero(slots < REFERENCE_ROWS)
            # a slot drawn twice keeps the later row, as the row-by-row rule does
            last = len(taken) - 1 - np.unique(slots[taken][::-1], return_index=True)[1]
            ref[slots[taken[last]]] = rest[taken[last]]
        self.reference[node], self.seen[node] = ref, seen + len(packed)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps."""
        return {"reference": {n: r.copy() for n, r in self.reference.items()},
                "seen": dict(self.seen)}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (``None``: an older checkpoint, nothing remembered)."""
        state = state or {}
        self.reference = {int(n): np.asarray(r, dtype=np.uint8)
                          for n, r in state.get("reference", {}).items()}
        self.seen = {int(n): int(v) for n, v in state.get("seen", {}).items()}
