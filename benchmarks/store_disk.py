"""Minibatches drawn from DQ's sample store in memory and on disk (``store-dir``), measured.

Two stores receive the same rows (CIFAR-10-shaped by default: 3,072 coordinates at 2 bits,
768 bytes of codes a row, random codes and per-sample ranges): one keeps its codes in
memory (:class:`~dq_flower.dq.server.store.SampleStore`), the other in a memory-mapped
file (:class:`~dq_flower.dq.server.disk_store.DiskSampleStore`). Each repetition times
``--draws`` minibatches of ``--batch`` rows drawn uniformly and dequantized
(``store.draw``, what every server step does) from

- ``memory``: the in-memory store;
- ``disk, cached``: the disk store with its file in the page cache (a store that fits in
  RAM, or the hot part of one that does not);
- ``disk, cold``: the disk store after its file's pages were dropped from this process's
  mapping and from the page cache (``madvise`` and ``posix_fadvise`` ``DONTNEED`` on this
  file only), so every drawn row is read from the device: a store much larger than RAM.

and prints the samples per second of each (median over ``--repeats``), side by side, with
the memory each store keeps. The three are interleaved within each repetition.
Run: ``.venv/bin/python benchmarks/store_disk.py`` (about a minute);
``--rows 2000000`` for a 1.5 GB store.
"""

from __future__ import annotations

import argparse
import mmap
import os
import platform
import shutil
import statistics
import tempfile
import time

import numpy as np

from dq_flower.dq.server.disk_store import DiskSampleStore
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows


def chunks(layout: RowLayout, rows: int, chunk: int, seed: int):
    """Rows of random codes with per-sample ranges, ``chunk`` at a time."""
    rng = np.random.default_rng(seed)
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        lo = rng.uniform(-1, 0, n).astype(np.float32)
        yield StoredRows(
            codes=rng.integers(0, 256, (n, layout.row_bytes), dtype=np.uint8),
            side=np.stack([lo, rng.uniform(0.5, 1, n).astype(np.float32)], axis=1),
            labels=rng.integers(0, 10, n), weights=np.ones(n, np.float32),
            node=rng.integers(1, 101, n).astype(np.uint64),
            ids=np.arange(start, start + n, dtype=np.int64),
            dither=np.zeros((n, 0), np.int64))


def drop_cache(store: DiskSampleStore) -> None:
    """Drop the store's file from this process's mapping and from the page cache."""
    code_file = store._file  # the benchmark's own look inside: nothing else needs this
    assert code_file is not None and code_file._map is not None
    code_file.flush()
    code_file._map._mmap.madvise(mmap.MADV_DONTNEED)  # type: ignore[attr-defined]
    fd = os.open(code_file.path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def samples_per_second(store: SampleStore, draws: int, batch: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    for _ in range(draws):
        store.draw(batch, rng)
    return draws * batch / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000, help="rows in the store")
    parser.add_argument("--dim", type=int, default=3072, help="coordinates per sample")
    parser.add_argument("--bits", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256, help="rows per minibatch")
    parser.add_argument("--draws", type=int, default=40, help="minibatches per repetition")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dir", default=None,
                        help="folder of the disk store (default: a temporary one, removed)")
    args = parser.parse_args()

    layout = RowLayout(args.dim, args.bits)
    directory = args.dir or tempfile.mkdtemp(prefix="dq-store-bench-", dir="/tmp")
    try:
        memory = SampleStore(layout.dequantize)
        disk = DiskSampleStore(layout.dequantize, directory)
        t0 = time.perf_counter()
        for rows in chunks(layout, args.rows, 50_000, seed=0):
            memory.add(rows)
        t1 = time.perf_counter()
        for rows in chunks(layout, args.rows, 50_000, seed=0):
            disk.add(rows)
        t2 = time.perf_counter()
        a, b = memory.draw(8, np.random.default_rng(1)), disk.draw(8, np.random.default_rng(1))
        assert all(np.array_equal(u, v) for u, v in zip(a, b, strict=True))  # same store

        runs: dict[str, list[float]] = {"memory": [], "disk, cached": [], "disk, cold": []}
        for rep in range(args.repeats):
            seed = 100 + rep
            runs["memory"].append(samples_per_second(memory, args.draws, args.batch, seed))
            samples_per_second(disk, 1, args.batch, seed + 1000)  # the map is warm
            runs["disk, cached"].append(samples_per_second(disk, args.draws, args.batch, seed))
            drop_cache(disk)
            runs["disk, cold"].append(samples_per_second(disk, args.draws, args.batch, seed))

        codes_mb = args.rows * layout.row_bytes / 2**20
        print(f"store: {args.rows:,} rows of {args.dim} coordinates at {args.bits} bits "
              f"({layout.row_bytes} bytes of codes a row, {codes_mb:,.1f} MB of codes); "
              f"minibatches of {args.batch}, {args.draws} per repetition, median of "
              f"{args.repeats}; {platform.machine()}, {os.cpu_count()} CPU cores")
        print(f"fill: memory {t1 - t0:.2f} s, disk {t2 - t1:.2f} s; memory held: in-memory "
              f"store {memory.nbytes / 2**20:,.1f} MB, disk store "
              f"{disk.memory_bytes / 2**20:,.1f} MB (file {disk.disk_bytes / 2**20:,.1f} MB)")
        print()
        print("| store | samples/s drawn and decoded (median) | relative to memory |")
        print("|---|---|---|")
        base = statistics.median(runs["memory"])
        for name, values in runs.items():
            med = statistics.median(values)
            print(f"| {name} | {med:,.0f} | {med / base:.2f} |")
    finally:
        if args.dir is None:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
