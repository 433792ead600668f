"""A sample store whose packed codes live on disk (the ``store-dir`` knob).

The codes go to one memory-mapped file of fixed-width rows, ``store-dir/store-codes.u8``;
the per-row metadata stays in memory, so bookkeeping reads no code and a minibatch reads
only its own rows. The file only grows (appended; full: its capacity doubles in place, the
space allocated on disk before any row is written, so a full disk is an error of the
server's (:class:`StoreDiskError`) with every stored row intact, never a SIGBUS). Written
rows never change, so a checkpoint refers to the file: the metadata, each row's slot, the
rows in use and a CRC-32 per block of :data:`BLOCK_ROWS` rows; a resume reopens the file,
checks every block and writes over rows appended after it. The rows of a block that
changed are dropped, saying so (their clients upload them again); a file none of whose
blocks match is refused. Evicted rows keep their place on disk. One run per ``store-dir``
(:mod:`.store_lock`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import zlib
from collections.abc import Callable
from logging import WARNING
from pathlib import Path

import numpy as np
from flwr.common.logger import log

from dq_flower.dq.server.store import SampleStore, StoredRows, _narrow_uint
from dq_flower.dq.server.store_lock import StoreLock, lock_store_dir

__all__ = ["CodeFile", "DiskSampleStore", "StoreDiskError", "CODE_FILE", "BLOCK_ROWS"]

#: Name of the codes file in ``store-dir``.
CODE_FILE = "store-codes.u8"
#: Rows checked by a fingerprint at most (checkpoints before block checksums).
_FINGERPRINT_ROWS = 64
#: Rows per checksummed block of the codes file.
BLOCK_ROWS = 256
#: Bytes written at once where the file system cannot allocate space ahead.
_ZERO_CHUNK = 1 << 20


class StoreDiskError(RuntimeError):
    """The server's disk refused the store's rows (full, or a file size limit)."""


def _allocate(fd: int, offset: int, length: int) -> None:
    """Real disk space for ``length`` bytes at ``offset`` (the file grows to cover them)."""
    try:
        os.posix_fallocate(fd, offset, length)
        return
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
            raise
    zeros = bytes(min(length, _ZERO_CHUNK))  # no fallocate here: write the zeros
    end = offset + length
    while offset < end:
        offset += os.pwrite(fd, zeros[:end - offset], offset)


class CodeFile:
    """Fixed-width uint8 rows in a memory-mapped file that grows by doubling.

    ``used`` rows are in use; rows are addressed by their slot (row number in the file).
    """

    def __init__(self, directory: str | Path, row_bytes: int, min_rows: int = 4096) -> None:
        if row_bytes < 1:
            raise ValueError(f"row_bytes must be >= 1, got {row_bytes}")
        self.path = Path(directory) / CODE_FILE
        self.row_bytes = int(row_bytes)
        self.min_rows = int(min_rows)
        self.used = 0
        #: CRC-32 of each block of :data:`BLOCK_ROWS` rows in use (the last one partial)
        self.crcs: list[int] = []
        self._capacity = 0
        self._map: np.memmap | None = None

    @classmethod
    def create(cls, directory: str | Path, row_bytes: int, min_rows: int = 4096) -> CodeFile:
        """A new, empty file in ``directory`` (created; an old file there is emptied)."""
        out = cls(directory, row_bytes, min_rows)
        out.path.parent.mkdir(parents=True, exist_ok=True)
        out.path.write_bytes(b"")
        with contextlib.suppress(StoreDiskError):  # a head start: rows reserve what they need
            out._reserve(out.min_rows)
        return out

    @classmethod
    def open(cls, directory: str | Path, row_bytes: int, used: int) -> CodeFile:
        """The existing file of ``directory`` with its first ``used`` rows in use."""
        out = cls(directory, row_bytes)
        size = out.path.stat().st_size if out.path.is_file() else -1
        if size < used * out.row_bytes or size % out.row_bytes:
            raise ValueError(f"store-dir: {out.path} does not hold {used} rows of "
                             f"{out.row_bytes} bytes (size {size})")
        out._capacity = size // out.row_bytes
        out._map = np.memmap(out.path, dtype=np.uint8, mode="r+",
                             shape=(out._capacity, out.row_bytes))
        out.used = int(used)
        return out

    def _reserve(self, rows: int) -> None:
        """Room for ``rows`` rows: at least double the capacity (else just ``rows``).

        The space is allocated on disk before a row is written (``posix_fallocate``): where
        it cannot be, :class:`StoreDiskError`, the file and its rows as they were.
        """
        if rows <= self._capacity:
            return
        old = self._capacity
        if self._map is not None:
            self._map.flush()
            self._map = None  # the old mapping goes with its last reference
        fd, error = os.open(self.path, os.O_RDWR), OSError(errno.ENOSPC, "no space")
        try:
            for capacity in dict.fromkeys((max(rows, 2 * old, self.min_rows), rows)):
                try:
                    _allocate(fd, old * self.row_bytes, (capacity - old) * self.row_bytes)
                    break
                except OSError as exc:
                    os.ftruncate(fd, old * self.row_bytes)  # what it held, no more
                    error = exc
            else:
                self._map_rows(old)
                raise StoreDiskError(
                    f"store-dir: the server cannot store {rows - self.used} more rows of "
                    f"{self.row_bytes} bytes in {self.path} ({error.strerror or error}; "
                    f"{self.used} rows stored there are kept): free space or move "
                    "store-dir, then resume from the last checkpoint") from error
        finally:
            os.close(fd)
        self._map_rows(capacity)

    def _map_rows(self, capacity: int) -> None:  # map the file's first ``capacity`` rows
        self._capacity = capacity
        self._map = (np.memmap(self.path, dtype=np.uint8, mode="r+",
                               shape=(capacity, self.row_bytes)) if capacity else None)

    def append(self, codes: np.ndarray) -> np.ndarray:
        """Write ``codes`` (``(n, row_bytes)`` uint8) after the rows in use; their slots."""
        if codes.ndim != 2 or codes.shape[1] != self.row_bytes:
            raise ValueError(f"rows of {self.row_bytes} bytes expected, got {codes.shape}")
        n = int(codes.shape[0])
        self._reserve(self.used + n)
        assert self._map is not None
        self._map[self.used:self.used + n] = codes
        self._checksum(codes)
        slots = np.arange(self.used, self.used + n, dtype=np.int64)
        self.used += n
        return slots

    def _checksum(self, codes: np.ndarray) -> None:  # rows appended at ``used``: their CRCs
        done = 0
        while done < len(codes):
            block = (self.used + done) // BLOCK_ROWS
            end = min(len(codes), (block + 1) * BLOCK_ROWS - self.used)
            chunk = np.ascontiguousarray(codes[done:end]).tobytes()
            if block == len(self.crcs):
                self.crcs.append(zlib.crc32(chunk))
            else:
                self.crcs[block] = zlib.crc32(chunk, self.crcs[block])
            done = end

    def block_crcs(self) -> list[int]:
        """The CRC-32 of each block of the rows in use, as read from the file now."""
        rows = self._map
        if rows is None:
            return []
        return [zlib.crc32(np.ascontiguousarray(rows[s:min(s + BLOCK_ROWS, self.used)]).tobytes())
                for s in range(0, self.used, BLOCK_ROWS)]

    def read(self, slots: np.ndarray) -> np.ndarray:
        """The rows at ``slots``, copied into memory (only those rows are read)."""
        if self._map is None:
            return np.zeros((0, self.row_bytes), dtype=np.uint8)
        return np.asarray(self._map[np.asarray(slots, dtype=np.int64)]).view(np.ndarray)

    def flush(self) -> None:
        """Write the mapped rows through to the file."""
        if self._map is not None:
            self._map.flush()

    def fingerprint(self) -> int:
        """CRC-32 of up to 64 evenly spaced rows in use (and of their count)."""
        picks = np.unique(np.linspace(0, self.used - 1, min(self.used, _FINGERPRINT_ROWS))
                          .astype(np.int64)) if self.used else np.zeros(0, dtype=np.int64)
        crc = zlib.crc32(np.array([self.used, self.row_bytes], dtype=np.int64).tobytes())
        return zlib.crc32(np.ascontiguousarray(self.read(picks)).tobytes(), crc)

    @property
    def nbytes(self) -> int:
        """Bytes of the rows in use."""
        return self.used * self.row_bytes


class DiskSampleStore(SampleStore):
    """:class:`~dq_flower.dq.server.store.SampleStore` with its codes in ``directory``.

    Same rows, draws and eviction as the in-memory store; the codes file is created at the
    first row (emptying an old one) or reopened by :meth:`load_state`.
    """

    def __init__(self, dequantize: Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray],
                 directory: str | Path, max_samples: int = 0, eviction: str = "fifo",
                 seed: int = 0) -> None:
        super().__init__(dequantize, max_samples=max_samples, eviction=eviction, seed=seed)
        self.directory = Path(directory)
        #: this run's hold on the directory (another process's run there is refused)
        self.lock: StoreLock = lock_store_dir(self.directory)
        self._file: CodeFile | None = None
        #: per stored row (in store order), its slot in the codes file
        self._slots = np.zeros(0, dtype=np.int64)

    @property
    def nbytes(self) -> int:
        """Bytes of the stored rows, codes on disk included (as the in-memory store's)."""
        width = 0 if self._file is None else self._file.row_bytes
        return super().nbytes + len(self) * width

    @property
    def memory_bytes(self) -> int:
        """Bytes the store keeps in memory: the rows' metadata and slots."""
        return super().nbytes + int(self._slots.nbytes)

    @property
    def disk_bytes(self) -> int:
        """Bytes of the codes file in use (evicted rows included)."""
        return 0 if self._file is None else self._file.nbytes

    def _append(self, compact: StoredRows) -> None:
        if self._file is None:
            self._file = CodeFile.create(self.directory, compact.codes.shape[1])
        slots = self._file.append(compact.codes)
        super()._append(dataclasses.replace(
            compact, codes=np.zeros((len(compact), 0), dtype=np.uint8)))
        self._slots = np.concatenate([self._slots, slots])

    def _keep(self, keep: np.ndarray) -> None:
        super()._keep(keep)
        self._slots = self._slots[keep]

    def _take(self, idx: np.ndarray) -> StoredRows:
        assert self._file is not None
        meta = self._take_meta(idx)
        return dataclasses.replace(meta, codes=self._file.read(self._slots[idx]))

    def state(self) -> dict:
        """Arrays for a checkpoint: the metadata and where each row's codes are on disk."""
        out = super().state()
        out.pop("codes", None)
        file = self._file
        if file is not None:
            file.flush()
        used, width, crc = (0, 0, 0) if file is None else (file.used, file.row_bytes,
                                                           file.fingerprint())
        out.update({"disk_dir": str(self.directory.resolve()), "disk_used": np.array([used]),
                    "disk_row_bytes": np.array([width]),
                    "disk_fingerprint": np.array([crc], dtype=np.int64),
                    "disk_block_rows": np.array([BLOCK_ROWS]),
                    "disk_block_crcs": np.array([] if file is None else file.crcs,
                                                dtype=np.uint32),
                    "disk_slots": _narrow_uint(self._slots)})
        return out

    def load_state(self, state: dict) -> None:
        """Inverse of :meth:`state`; an in-memory store's state is written to the file."""
        meta = {k: v for k, v in state.items() if not k.startswith("disk_") and k != "codes"}
        if "labels" in state:  # rows: their codes are on disk, none in memory
            meta["codes"] = np.zeros((len(state["labels"]), 0), dtype=np.uint8)
        super().load_state(meta)
        if "disk_used" not in state:  # from an in-memory store: its codes go to disk
            codes = state.get("codes")
            self._file, self._slots = None, np.zeros(0, dtype=np.int64)
            if codes is not None and len(codes):
                self._file = CodeFile.create(self.directory, np.asarray(codes).shape[1])
                self._slots = self._file.append(np.ascontiguousarray(codes, dtype=np.uint8))
            return
        used, width = int(state["disk_used"][0]), int(state["disk_row_bytes"][0])
        self._slots = np.asarray(state["disk_slots"]).astype(np.int64)
        self._file = None
        if width:
            code_file = CodeFile.open(self.directory, width, used)
            refused = ValueError(f"store-dir: {code_file.path} does not hold the rows of "
                                 f"this checkpoint (written with store-dir "
                                 f"{state['disk_dir']!r})")
            if "disk_block_crcs" not in state:  # an older checkpoint: its fingerprint
                if code_file.fingerprint() != int(state["disk_fingerprint"][0]):
                    raise refused
                self._file = code_file
                code_file.crcs = code_file.block_crcs()
                return
            if int(state["disk_block_rows"][0]) != BLOCK_ROWS:
                raise ValueError(f"store-dir: the checkpoint's blocks have "
                                 f"{int(state['disk_block_rows'][0])} rows, not {BLOCK_ROWS}")
            self._file = code_file
            self._drop_damaged(code_file, [int(c) for c in state["disk_block_crcs"]], refused)

    def _drop_damaged(self, code_file: CodeFile, expected: list[int],
                      refused: ValueError) -> None:
        """Check every block against the checkpoint's CRCs; drop the rows of those that differ.

        Dropped rows are forgotten (not received), so their clients upload them again; a
        file none of whose blocks match is not this checkpoint's (``refused``).
        """
        found = code_file.block_crcs()
        code_file.crcs = found
        damaged = [b for b, (a, e) in enumerate(zip(found, expected, strict=True)) if a != e]
        if not damaged:
            return
        if len(damaged) == len(found):
            raise refused
        hit = np.isin(self._slots // BLOCK_ROWS, damaged)
        nodes = sorted({int(n) for n in self.node_ids(self._take_meta(np.flatnonzero(hit)))})
        self._keep(np.flatnonzero(~hit))
        log(WARNING, "store-dir: %s changed since the checkpoint in %d of its %d blocks of "
            "%d rows (blocks %s): their %d stored rows (clients %s) are dropped and will be "
            "asked for again; the other %d rows resume", code_file.path, len(damaged),
            len(found), BLOCK_ROWS, damaged[:10], int(hit.sum()), nodes[:10], len(self))
