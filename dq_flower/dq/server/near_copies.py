"""The copy screen: rows that copy, or nearly copy, rows the same client sent before.

A row whose packed codes and side information equal a row the same client sent before is
a copy under a new id; so is a near-copy, a row within a few codes of one (with ``bits``).
:class:`CopyScreen`: a client whose share of copies exceeds the median client's by more
than ``copy-margin`` and by more than :data:`Z_ROBUST` robust standard deviations (the
clients' spread, combined with the binomial error of its own rows) is *copying*: its copies
are not stored (counted once in ``duplicate-rows``, their ids remembered as received).
Honest clients of one data set copy alike, so the screen acts on none of them. A row that
repeats one the client sent before where another client sent the same row too (codes, side
information and target) is counted but is no evidence: a small table's common rows repeat
on every client, and the more rows a client sends the more of them it repeats (a credit
table of 5 columns at 4 bits: 3% of a client's first 64 rows, 23% of its 500).

An exact hash misses a copy with a code or two moved by one level. Here a row is a
**near-copy** where at most :func:`near_codes` of its codes (one in 16) differ from a row of
the same client: one of a seeded sample of up to :data:`REFERENCE_ROWS` of its earlier rows
(a reservoir, so memory and time per upload stay bounded), or an earlier row of the same
upload. Honest digits rows are at least 3 codes of 64 from their client's nearest other
row (5 or more for 99%), so a client's share of near-copies is judged against the median
client's as exact copies are. A row as near its own shift by 1 to :data:`MAX_LAG` codes
(:func:`self_distance`: a still sensor window, each channel at one level; a constant or
periodic signal) is near every such row of its client without copying any: it is a copy
only exactly. The screen cannot tell a faulty device from a hostile one.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.codecs.bitpack import unpack
from dq_flower.dq.server.node_screen import Z_ROBUST
from dq_flower.server.common import log_round

__all__ = ["CopyScreen", "NearCopies", "near_codes", "code_distance", "row_keys",
           "REFERENCE_ROWS", "MIN_COPIES", "self_distance"]

#: Earlier rows per client a new row is compared with at most (a seeded reservoir).
REFERENCE_ROWS = 2048
#: Copied rows a client needs before the copy screen may act on it.
MIN_COPIES = 5
#: Bytes of a row's key (a BLAKE2b digest of its codes and side information).
KEY_BYTES = 16
#: New rows compared at once (bounds the temporary ``chunk x reference x codes`` array).
_CHUNK = 16
#: New rows compared at once on packed words.
_WORD_CHUNK = 4
#: Largest shift (in codes) at which a row is compared with itself (:func:`self_distance`).
MAX_LAG = 32
#: Per byte, the lowest bit of each code (MSB-first packing) for bits that divide 8.
_LOW_BITS = {1: 0xFF, 2: 0x55, 4: 0x11, 8: 0x01}


def near_codes(codes: int) -> int:
    """Differing codes (of ``codes``) up to which two rows are near-copies: one in 16.

    0 (no near-copies) below 32 codes: a small table's honest rows often differ in one.
    """
    return int(codes) // 16 if codes >= 32 else 0


def self_distance(codes: np.ndarray) -> np.ndarray:
    """Per unpacked row, the fewest codes that differ from it shifted by 1 to MAX_LAG codes.

    Counted over the positions compared, scaled to the whole row. A row near its own shift
    (a still window: each channel one level; a constant or periodic signal) is near every
    other such row of its client without copying any.
    """
    codes = np.asarray(codes)
    n, width = codes.shape
    best = np.full(n, float(width))
    for lag in range(1, min(MAX_LAG, width // 2) + 1):
        moved = (codes[:, lag:] != codes[:, :-lag]).sum(axis=1)
        best = np.minimum(best, moved * width / (width - lag))
    return best


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
        if limit == 0:  # exact copies only: the screen's keys find them
            return near
        old = self.reference.get(int(node))
        if old is not None and len(old):
            near |= self.distance(packed, old).min(axis=1) <= limit
        within = self.distance(packed, packed)
        within[np.triu_indices(n)] = limit + 1  # only earlier rows of the upload count
        near |= within.min(axis=1) <= limit
        if near.any():  # a row near its own shift is near others by chance: no evidence
            near[near] = self_distance(self._unpack(packed[near])) > limit
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


def row_keys(codes: np.ndarray, side: np.ndarray, targets: np.ndarray | None = None
             ) -> list[bytes]:
    """One digest per row of its packed codes, side information and target (where given)."""
    codes = np.ascontiguousarray(codes, dtype=np.uint8)
    side = np.ascontiguousarray(side).reshape(len(codes), -1)
    ys = (np.zeros((len(codes), 0)) if targets is None
          else np.ascontiguousarray(targets).reshape(len(codes), -1))
    return [hashlib.blake2b(c.tobytes() + s.tobytes() + y.tobytes(), digest_size=KEY_BYTES
                            ).digest() for c, s, y in zip(codes, side, ys, strict=True)]


@dataclass
class CopyScreen:
    """Copied rows per client, and which clients' copies are not stored.

    ``margin``: the share of copied rows above the median client's that makes a client a
    copying one (0: the screen never acts; copies are still counted). ``bits``: bits per
    code of the packed rows, to count near-copies too (0: exact copies only); a store laid
    otherwise says its own in :meth:`copied` (id rows are whole bytes, whatever ``bits``).
    """

    margin: float = 0.1
    bits: int = 0
    keys: dict[int, set[bytes]] = field(default_factory=dict)
    received: dict[int, int] = field(default_factory=dict)
    copies: dict[int, int] = field(default_factory=dict)
    copying: set[int] = field(default_factory=set)
    near: NearCopies | None = None
    #: per client, the keys of its exact copies (one a copy)
    repeats: dict[int, list[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.bits and self.near is None:
            self.near = NearCopies(self.bits)

    def copied(self, node: int, codes: np.ndarray, side: np.ndarray,
               targets: np.ndarray | None = None, layout: Any = None) -> np.ndarray:
        """Mask of the rows of one upload copying (or nearly) a row ``node`` sent; counted.

        A row is an exact copy with its target too (a sale of another price is none).
        ``layout``: the store's row layout, whose ``bits`` per code the rows are read at.
        """
        seen = self.keys.setdefault(int(node), set())
        mask = np.zeros(len(codes), dtype=bool)
        for i, key in enumerate(row_keys(codes, side, targets)):
            if key in seen:
                mask[i] = True
                self.repeats.setdefault(int(node), []).append(key)
            else:
                seen.add(key)
        if self.near is not None:
            self.near.bits = getattr(layout, "bits", 0) or self.near.bits  # one layout a run
            mask |= self.near.mask(int(node), codes)
        self.received[int(node)] = self.received.get(int(node), 0) + len(codes)
        self.copies[int(node)] = self.copies.get(int(node), 0) + int(mask.sum())
        return mask

    def bound(self, share: float, rows: int, mad: float) -> float:
        """The excess share over the median client's beyond which a client is copying.

        ``copy-margin``, or :data:`Z_ROBUST` robust standard deviations where more: ``mad``
        (1.4826 MAD of the clients' shares) combined with the binomial error of the client's
        own ``rows``, as the agreement screen judges held-out errors.
        """
        spread = math.sqrt(max(share * (1 - share), 1.0 / rows) / rows)
        return max(self.margin, Z_ROBUST * math.hypot(mad, spread))

    def evidence(self, node: int) -> int:
        """``node``'s copies less its exact copies of rows another client sent too."""
        others = [k for n, k in self.keys.items() if n != node]
        shared = sum(any(key in k for k in others) for key in self.repeats.get(node, []))
        return self.copies.get(node, 0) - shared

    def review(self, server_round: int) -> set[int]:
        """The copying clients after this round's uploads were counted (logs new ones)."""
        if self.margin <= 0:
            return set()
        copied = {n: self.copies.get(n, 0) for n, r in self.received.items() if r}
        for node in self.repeats.keys() & copied.keys():  # none where no row repeats exactly
            copied[node] = self.evidence(node)
        shares = {n: c / self.received[n] for n, c in copied.items()}
        if len(shares) < 2:
            return set(self.copying)
        values = np.array(list(shares.values()))
        middle = float(np.median(values))
        mad = 1.4826 * float(np.median(np.abs(values - middle)))
        for node, share in shares.items():
            if node in self.copying or copied[node] < MIN_COPIES:
                continue
            bound = self.bound(share, self.received[node], mad)
            if share - middle > bound:
                self.copying.add(node)
                log_round("dq", server_round, f"client {node}: {copied[node]} of its "
                          f"{self.received[node]} rows copy, or nearly, other rows it sent and "
                          f"no other client's ({share:.0%}, the median client {middle:.0%}, "
                          f"excess {share - middle:.0%} > {bound:.0%}): its copies are not "
                          "stored (counted once; honest data can repeat itself too)")
        return set(self.copying)

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (the keys as one byte string per client)."""
        return {"keys": {n: b"".join(sorted(k)) for n, k in self.keys.items()},
                "received": dict(self.received), "copies": dict(self.copies),
                "copying": sorted(self.copying),
                "repeats": {n: b"".join(k) for n, k in self.repeats.items()},
                **({} if self.near is None else {"near": self.near.state()})}

    def load_state(self, state: dict[str, Any] | None) -> None:
        """Inverse of :meth:`state` (an older checkpoint: nothing counted)."""
        state = state or {}
        self.keys = {int(n): {bytes(b[i:i + KEY_BYTES]) for i in range(0, len(b), KEY_BYTES)}
                     for n, b in state.get("keys", {}).items()}
        self.received = {int(n): int(v) for n, v in state.get("received", {}).items()}
        self.copies = {int(n): int(v) for n, v in state.get("copies", {}).items()}
        self.copying = {int(n) for n in state.get("copying", [])}
        self.repeats = {int(n): [bytes(b[i:i + KEY_BYTES]) for i in range(0, len(b), KEY_BYTES)]
                        for n, b in state.get("repeats", {}).items()}
        if self.near is not None:
            self.near.load_state(state.get("near"))
