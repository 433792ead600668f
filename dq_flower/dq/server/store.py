"""The server's sample store: every received sample in packed form, and its held-out rows.

Rows: :class:`RowLayout` codes, label, weight, origin identity, client-local id, held-out
flag (:func:`~.holdout.choose_holdout`), dequantized on the fly; evicted rows' ids kept.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import cast

import numpy as np

from dq_flower.codecs import Payload, PayloadError, make
from dq_flower.codecs.affine import denormalise
from dq_flower.codecs.bitpack import pack, packed_nbytes, unpack
from dq_flower.codecs.uniform import Uniform, dither_offsets, expand_ranges, packed_codes

__all__ = ["RowLayout", "SampleStore", "StoredRows", "EVICTION_POLICIES", "strata_of"]

EVICTION_POLICIES = ("fifo", "random")
#: Decoded float32 bytes of the minibatches :meth:`SampleStore.draw_batches` decodes at once.
DECODE_BYTES = 1 << 24
_FIELDS = ("codes", "side", "labels", "weights", "node", "ids", "dither", "holdout")


@dataclass(frozen=True)
class RowLayout:
    """Byte-aligned rows of ``dim`` codes at ``bits`` bits: how the store keeps samples.

    :meth:`rows` re-lays a ``uniform`` payload's stream as ``codes`` (uint8
    ``(n, row_bytes)``, MSB first), ``side`` (float32 ``(n, 2 * groups)``: minimums then
    scales; ``(n, 0)`` for fixed ranges) and ``dither`` (int64 ``(n, 2)`` or ``(n, 0)``).
    """

    dim: int
    bits: int
    groups: int = 1
    fixed: bool = False
    channels_last: bool = False  # rows (L, C) coded as (C, L) (``groups`` = C)

    @cached_property
    def padded_dim(self) -> int:
        """Codes per row including padding to a whole byte."""
        per_byte = 8 // np.gcd(8, self.bits)
        return -(-self.dim // per_byte) * per_byte

    @cached_property
    def row_bytes(self) -> int:
        """Bytes per packed row."""
        return packed_nbytes(self.padded_dim, self.bits)

    def rows(self, p: Payload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(codes, side, dither)`` of a validated ``uniform`` payload, re-laid by row."""
        n, d = p.shape
        if d != self.dim:
            raise PayloadError(f"samples have dimension {d}, expected {self.dim}")
        p = expand_ranges(p, n * self.groups) if not self.fixed else p
        packed, width = packed_codes(p, self.bits), self.row_bytes
        if self.padded_dim == d and packed.size == n * width:  # rows end on whole bytes:
            rows = np.array(packed, dtype=np.uint8).reshape(n, width)  # laid by row already
        else:
            codes = unpack(packed, self.bits, n * d).reshape(n, d)
            codes = np.pad(codes, ((0, 0), (0, self.padded_dim - d)))
            rows = pack(codes.reshape(-1), self.bits).reshape(n, width)
        side = (np.zeros((n, 0), dtype=np.float32) if self.fixed else np.concatenate(
            [p.buffers[k].reshape(n, self.groups) for k in ("mins", "scales")], axis=1
        ).astype(np.float32))
        seed = p.meta.get("dither_seed")
        dither = (np.zeros((n, 0), dtype=np.int64) if seed is None
                  else np.stack([np.full(n, int(seed)), np.arange(n) * d], axis=1).astype(np.int64))
        return rows, side, dither

    def dequantize(self, codes: np.ndarray, side: np.ndarray, dither: np.ndarray) -> np.ndarray:
        """Float32 ``(n, dim)`` rows from the row layout.

        Fixed ranges: with the ``uniform`` decoder's own arithmetic (bit-identical).
        """
        n = codes.shape[0]
        values = unpack(np.ascontiguousarray(codes).reshape(-1), self.bits, n * self.padded_dim)
        values = values.reshape(n, self.padded_dim)[:, : self.dim]
        if self.fixed:
            top = (1 << self.bits) - 1
            out = (np.arange(top + 1) / top).astype(np.float32)[values]
            if dither.shape[1]:
                step = cast(Uniform, make("uniform", bits=self.bits, fixed_range=True)).fixed_step
                for i, (s, o) in enumerate(dither):
                    u = dither_offsets(int(s), int(o), self.dim)
                    u -= np.float32(0.5)
                    u *= step
                    out[i] -= u
            return out
        g, width = self.groups, self.dim // self.groups
        mins, scales = side[:, :g], side[:, g:]
        out = values.astype(np.float32).reshape(n, g, width) * scales[:, :, None]
        if dither.shape[1]:
            u = np.stack([dither_offsets(int(s), int(o), self.dim) for s, o in dither])
            out -= (u.reshape(n, g, width) - np.float32(0.5)) * scales[:, :, None]
        out += mins[:, :, None]
        return (out.transpose(0, 2, 1) if self.channels_last else out).reshape(n, self.dim)


@dataclass(frozen=True)
class StoredRows:
    """Rows in the store's packed layout, as added or as drawn."""

    codes: np.ndarray  # uint8 (n, row_bytes), byte-aligned packed codes per row
    side: np.ndarray  # (n, k) side information (ranges), any float dtype
    labels: np.ndarray  # (n,) int class labels, or float targets (n,) / (n, k)
    weights: np.ndarray  # (n,) float32, original samples each row stands for
    node: np.ndarray  # (n,) uint64 origin clients (their identities)
    ids: np.ndarray  # (n,) int64 client-local sample ids
    dither: np.ndarray  # (n, 2) int64 dither (seed, start) per row, or (n, 0)
    holdout: np.ndarray | None = None  # (n,) bool, held-out rows; None: none held out

    def __len__(self) -> int:
        return int(self.codes.shape[0])


def _narrow_uint(values: np.ndarray) -> np.ndarray:
    """Ints in the narrowest dtype that holds them: unsigned where none is below 0.

    (Labels of ignored elements, -100, are the only values below 0 a store holds.)
    """
    values = np.asarray(values)
    low, top = (int(values.min()), int(values.max())) if values.size else (0, 0)
    return values.astype(np.result_type(np.min_scalar_type(low), np.min_scalar_type(top)))


def _narrow_float(values: np.ndarray) -> np.ndarray:
    """Weights as float16 when that is exact, else float32."""
    values = np.asarray(values, dtype=np.float32)
    with np.errstate(over="ignore"):  # past 65,504: inf, so float32
        half = values.astype(np.float16)
    return half if np.array_equal(half.astype(np.float32), values) else values


def strata_of(labels: np.ndarray) -> np.ndarray:
    """Each row's stratum: its class label, or 0 for every float target or token window."""
    labels = np.asarray(labels)
    if labels.dtype.kind in "iu" and labels.ndim == 1:
        return labels.reshape(-1).astype(np.int64)
    return np.zeros(labels.shape[0] if labels.ndim else 0, dtype=np.int64)


class SampleStore:
    """Append-only packed sample store (narrowest exact dtypes) with optional eviction.

    Parameters
    ----------
    dequantize : callable
        ``dequantize(codes, side, dither) -> float32 (n, d)``, the quantizer's row decoder.
    max_samples : int
        Bound on stored rows (0 = unbounded).
    eviction : str
        ``fifo`` (oldest first) or ``random`` (uniformly chosen rows, seeded).
    """

    def __init__(self, dequantize: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 max_samples: int = 0, eviction: str = "fifo", seed: int = 0) -> None:
        if eviction not in EVICTION_POLICIES:
            raise ValueError(f"eviction must be one of {EVICTION_POLICIES}, got {eviction!r}")
        if max_samples < 0:
            raise ValueError("max_samples must be >= 0")
        self._dequantize = dequantize
        #: per client, the feature ranges ``(lo, span)`` its rows are coded against
        self.ranges: dict[int, tuple[np.ndarray, ...]] = {}
        self.max_samples, self.eviction = int(max_samples), eviction
        self._rng, self.evicted = np.random.default_rng(seed), 0
        self._rows: StoredRows | None = None
        self._node_table: dict[int, int] = {}
        #: per client, the sorted ids of its evicted rows (narrowest unsigned dtype)
        self._evicted_ids: dict[int, np.ndarray] = {}
        #: token windows: a row's targets are its own ids (its stored label is a stratum)
        self.inputs_are_targets = False

    # ---------------------------------------------------------------- contents
    def __len__(self) -> int:
        return 0 if self._rows is None else int(self._rows.codes.shape[0])

    @property
    def nbytes(self) -> int:
        """Bytes held by the store's arrays (exactly sized, no spare capacity)."""
        if self._rows is None:
            return 0
        r = self._rows
        return int(sum(getattr(r, f).nbytes for f in _FIELDS)
                   + sum(v.nbytes for v in self._evicted_ids.values()))

    def _mine(self, node: int) -> np.ndarray | None:  # node's rows (None: it has none)
        code = self._node_table.get(int(node))
        return None if self._rows is None or code is None else self._rows.node == code

    def has(self, node: int, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` from ``node`` are already stored."""
        mine = self._mine(node)
        if mine is None:
            return np.zeros(len(ids), dtype=bool)
        assert self._rows is not None
        return np.isin(ids, self._rows.ids[mine])

    def received(self, node: int) -> np.ndarray:
        """Sorted int64 ids of every row received from ``node`` (evicted ones included)."""
        return self.holding(node, np.zeros(0, dtype=np.int64))[1]

    def holding(self, node: int, strata: np.ndarray) -> tuple[int, np.ndarray, float]:
        """``node``'s stored rows in ``strata``, the ids it ever sent, its stored rows' weight."""
        mine, rows = self._mine(node), self._rows
        evicted = self._evicted_ids.get(int(node), np.zeros(0, dtype=np.int64)).astype(np.int64)
        if mine is None or rows is None:
            return 0, np.unique(evicted), 0.0
        ids = np.unique(np.concatenate([rows.ids[mine].astype(np.int64), evicted]))
        return (int(np.isin(strata_of(rows.labels[mine]), strata).sum()), ids,
                float(rows.weights[mine].astype(np.float64).sum()))

    def was_received(self, node: int, ids: np.ndarray) -> np.ndarray:
        """Boolean mask: which of ``ids`` from ``node`` the store received before."""
        return np.isin(np.asarray(ids, dtype=np.int64), self.received(node))

    @property
    def clients(self) -> list[int]:
        """Every client the store received rows from, in the order of their first rows."""
        return sorted(self._node_table, key=self._node_table.__getitem__)

    def add(self, rows: StoredRows) -> None:
        """Append rows, then evict down to the bound."""
        self._append(self._compact(rows))
        self._evict()

    def _compact(self, rows: StoredRows) -> StoredRows:  # narrow dtypes, node indices
        nodes, inverse = np.unique(rows.node, return_inverse=True)
        codes = np.array([self._node_table.setdefault(int(n), len(self._node_table))
                          for n in nodes], dtype=np.int64)
        return StoredRows(
            codes=np.ascontiguousarray(rows.codes, dtype=np.uint8),
            side=np.ascontiguousarray(rows.side),
            labels=(_narrow_float(rows.labels) if np.issubdtype(rows.labels.dtype, np.floating)
                    else _narrow_uint(rows.labels)),
            weights=_narrow_float(rows.weights),
            node=_narrow_uint(codes[inverse.reshape(-1)]),
            ids=_narrow_uint(rows.ids),
            dither=np.ascontiguousarray(rows.dither, dtype=np.int64),
            holdout=(np.zeros(len(rows), dtype=bool) if rows.holdout is None
                     else np.asarray(rows.holdout, dtype=bool).reshape(len(rows))),
        )

    def _append(self, compact: StoredRows) -> None:
        old = self._rows
        self._rows = compact if old is None else StoredRows(
            *[np.concatenate([getattr(old, f), getattr(compact, f)]) for f in _FIELDS])

    def _evict(self) -> None:
        if not self.max_samples or len(self) <= self.max_samples:
            return
        excess = len(self) - self.max_samples
        if self.eviction == "fifo":
            keep = np.arange(excess, len(self))
        else:
            keep = np.sort(self._rng.choice(len(self), size=self.max_samples, replace=False))
        gone = np.ones(len(self), dtype=bool)
        gone[keep] = False
        evicted = self._take_meta(np.flatnonzero(gone))
        nodes = self.node_ids(evicted)
        for node in np.unique(nodes):  # evicted rows stay received
            self.note_received(int(node), evicted.ids[nodes == node])
        self._keep(keep)
        self.evicted += excess

    def _keep(self, keep: np.ndarray) -> None:  # keep: sorted indices
        self._rows = self._take_meta(keep)

    def _take_meta(self, idx: np.ndarray) -> StoredRows:  # the rows as held in memory
        assert self._rows is not None
        return StoredRows(*(getattr(self._rows, f)[idx] for f in _FIELDS))

    def _take(self, idx: np.ndarray) -> StoredRows:
        return self._take_meta(idx)  # with the codes (the disk store reads them)

    # ---------------------------------------------------------------- drawing
    def node_weight(self, node: int) -> float:
        """Sum of the weights of the rows stored from ``node``."""
        return self.holding(node, np.zeros(0, dtype=np.int64))[2]

    def node_ids(self, rows: StoredRows) -> np.ndarray:
        """Origin node ids (uint64, as Flower draws them) of rows taken from this store."""
        return np.array(self.clients, dtype=np.uint64)[rows.node.astype(np.int64)]

    @property
    def holdout_mask(self) -> np.ndarray:
        """Boolean mask of the held-out rows, in store order."""
        if self._rows is None:
            return np.zeros(0, dtype=bool)
        return cast(np.ndarray, self._rows.holdout)

    @property
    def num_train(self) -> int:
        """Rows the server trains on (the rows not held out)."""
        return len(self) - int(self.holdout_mask.sum())

    def counts(self, node: int, strata: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Rows stored from ``node`` in each of ``strata`` (class, or 0): ``(all, held out)``."""
        strata = np.asarray(strata).reshape(-1)
        mine = self._mine(node)
        if mine is None or self._rows is None or not strata.size:
            zeros = np.zeros(strata.size, dtype=np.int64)
            return zeros, zeros.copy()
        match = strata_of(self._rows.labels[mine])[None, :] == strata[:, None]
        held = self.holdout_mask[mine][None, :]
        return match.sum(1).astype(np.int64), (match & held).sum(1).astype(np.int64)

    def set_ranges(self, node: int, *ranges: np.ndarray) -> None:
        """Client ``node``'s ranges ``(lo, span[, scale])``: rows decode by :func:`.denormalise`."""
        self.ranges[int(node)] = tuple(np.asarray(a, dtype=np.float32) for a in ranges)

    def _decode(self, rows: StoredRows):
        x = self._dequantize(rows.codes, rows.side, rows.dither)
        if self.inputs_are_targets:
            return x, np.rint(x).astype(np.int64)
        if self.ranges:  # each client's rows by its feature ranges
            nodes, out = self.node_ids(rows), np.empty_like(x)
            for node in np.unique(nodes):
                out[nodes == node] = denormalise(x[nodes == node], *self.ranges[int(node)])
            x = out
        y = (rows.labels.astype(np.float32) if np.issubdtype(rows.labels.dtype, np.floating)
             else rows.labels.astype(np.int64))
        return x, y

    def draw(self, batch_size: int, rng: np.random.Generator, weights: str = "importance",
             skip: frozenset[int] = frozenset()):
        """A uniform minibatch ``(x, y, weights)`` of training rows, without replacement.

        Held-out rows and those of the clients in ``skip`` are never drawn. ``weights``:
        ``importance`` (each row's own) or ``node`` (its node's mean training row weight).
        """
        return next(self.draw_batches(1, batch_size, rng, weights, skip))

    def draw_batches(self, count: int, batch_size: int, rng: np.random.Generator,
                     weights: str = "importance", skip: frozenset[int] = frozenset(),
                     max_bytes: int = DECODE_BYTES):
        """``count`` minibatches, each as :meth:`draw` gives it, from the same draws of ``rng``.

        Consecutive minibatches are decoded together (up to ``max_bytes`` of float32 values);
        where those still to come hold more rows than the training rows, these are decoded once.
        """
        if count <= 0:
            return
        if len(self) == 0:
            raise ValueError("the sample store is empty")
        usable = ~self.holdout_mask
        if skip:
            usable &= ~self.rows_of(skip)
        train = np.flatnonzero(usable)  # ascending: train[sorted picks] are sorted
        if train.size == 0:
            raise ValueError("the sample store holds only held-out rows")
        size = min(batch_size, train.size)
        means = self._node_means(train) if weights == "node" else None
        done, group, whole = 0, 1, None  # the first minibatch alone: its size sets the groups
        while done < count:
            n = min(group, count - done)
            picks = [np.sort(rng.choice(train.size, size=size, replace=False)) for _ in range(n)]
            if whole is None:
                x, y, w = self._decoded(train[np.concatenate(picks)], means)
                parts, group = [slice(i * size, (i + 1) * size) for i in range(n)], max(
                    1, max_bytes // max(1, x.nbytes // n))
            for part in (parts if whole is None else picks):
                yield x[part], y[part], w[part]
            done += n
            if whole is None and (count - done) * size >= train.size \
                    and train.size * (x.nbytes // (n * size)) <= max_bytes:
                whole = x, y, w = self._decoded(train, means)

    def _decoded(self, idx: np.ndarray, means: np.ndarray | None):
        """Rows ``idx`` decoded, with their weights (``means``: per node index)."""
        x, y = self._decode(rows := self._take(idx))
        return x, y, (means[rows.node] if means is not None else rows.weights).astype(np.float32)

    def rows_of(self, nodes: frozenset[int]) -> np.ndarray:
        """Boolean mask of the rows stored from the clients ``nodes``, in store order."""
        codes = [self._node_table[n] for n in nodes if n in self._node_table]
        if self._rows is None or not codes:
            return np.zeros(len(self), dtype=bool)
        return np.isin(self._rows.node, codes)

    def note_received(self, node: int, ids: np.ndarray) -> None:
        """Remember ``ids`` of ``node`` as received though not stored (as evicted rows are)."""
        if len(ids):
            old = self._evicted_ids.get(int(node), np.zeros(0, dtype=np.int64))
            merged = np.concatenate([old.astype(np.int64), np.asarray(ids, dtype=np.int64)])
            self._evicted_ids[int(node)] = _narrow_uint(np.unique(merged))

    def _node_means(self, train: np.ndarray) -> np.ndarray:  # per node index
        stored = self._rows
        assert stored is not None  # draw() refuses an empty store first
        nodes = stored.node[train].astype(np.int64)
        totals = np.bincount(nodes, stored.weights[train].astype(np.float64))
        counts = np.bincount(nodes)
        return np.divide(totals, counts, out=np.zeros_like(totals), where=counts > 0)

    def holdout_batches(self, batch_size: int = 1024):
        """Yield the held-out rows as ``(x, y, weights, node_ids, ids)`` chunks, in store order."""
        held = np.flatnonzero(self.holdout_mask)
        for start in range(0, held.size, batch_size):
            rows = self._take(held[start:start + batch_size])
            x, y = self._decode(rows)
            yield (x, y, rows.weights.astype(np.float32), self.node_ids(rows),
                   rows.ids.astype(np.int64))

    # ---------------------------------------------------------------- checkpoints
    def state(self) -> dict:
        """Arrays for a checkpoint."""
        rows = self._rows
        out = {"node_table": np.array(self.clients, dtype=np.uint64),
               "evicted": np.array([self.evicted]), "rng": self._rng.bit_generator.state,
               **({} if rows is None else {f: getattr(rows, f) for f in _FIELDS})}
        nodes = sorted(self._evicted_ids)
        out["evicted_nodes"] = np.array(nodes, dtype=np.uint64)
        out["evicted_counts"] = np.array([self._evicted_ids[n].size for n in nodes],
                                         dtype=np.int64)
        out["evicted_ids"] = _narrow_uint(np.concatenate(
            [self._evicted_ids[n].astype(np.int64) for n in nodes]) if nodes
            else np.zeros(0, dtype=np.int64))
        return out

    def load_state(self, state: dict) -> None:
        """Inverse of :meth:`state`."""
        if "disk_used" in state:
            raise ValueError(f"store-dir: the checkpoint's store codes are on disk in "
                             f"{state['disk_dir']!r}; set store-dir to resume it")
        self._node_table = {int(n): i for i, n in enumerate(state["node_table"])}
        self.evicted = int(state["evicted"][0])
        if "rng" in state:  # the eviction generator resumes where it stopped
            self._rng.bit_generator.state = state["rng"]
        if "codes" in state:
            n = len(state["codes"])
            self._rows = StoredRows(*(np.asarray(state[f]) if f in state
                                      else np.zeros(n, dtype=bool) for f in _FIELDS))
        else:
            self._rows = None
        # (an older checkpoint has no evicted ids: its evicted rows count as never received)
        self._evicted_ids = {}
        if len(state.get("evicted_nodes", ())):
            ids = np.asarray(state["evicted_ids"])
            bounds = np.cumsum(np.asarray(state["evicted_counts"], dtype=np.int64))[:-1]
            for node, part in zip(np.asarray(state["evicted_nodes"], dtype=np.uint64),
                                  np.split(ids, bounds), strict=True):
                self._evicted_ids[int(node)] = _narrow_uint(part)
