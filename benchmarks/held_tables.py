"""Encoding and decoding the per-client held table of a large population, measured.

Where the server cannot yet name the node it asks (partial participation over many
clients), a train message carries one entry per client identity: its ask and the rows the
server holds of it (:mod:`dq_flower.wire.held`). Each client decodes the whole table, on the
PyTorch path and the torch-free path alike. This prints the table's size and the median
encode and decode times for 4,000 to 100,000 clients (each holding 600 rows, about 180 of
them held), and the decode time per MB relative to the smallest table: about 1 where the
decoder is linear in its input. Run: ``.venv/bin/python benchmarks/held_tables.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from dq_flower.wire.held import decode_table, encode_held, encode_table, table_entry


def entries(clients: int, seed: int = 0) -> dict[int, tuple[int, bytes]]:
    rng = np.random.default_rng(seed)
    return {identity: (int(rng.integers(1, 9)),
                       encode_held(np.flatnonzero(rng.random(600) < 0.3)))
            for identity in range(clients)}


def median_seconds(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--clients", type=int, nargs="+", default=[4_000, 25_000, 100_000])
    args = parser.parse_args()
    print("| clients | table | encode (median) | decode (median) | one entry (median) "
          "| decode s/MB vs smallest |")
    print("|---:|---:|---:|---:|---:|---:|")
    base = None
    for clients in args.clients:
        table = entries(clients)
        data = encode_table(table, default_ask=4)
        assert decode_table(data) == (4, table)
        encode_s = median_seconds(lambda t=table: encode_table(t, default_ask=4), args.repeats)
        decode_s = median_seconds(lambda d=data: decode_table(d), args.repeats)
        entry_s = median_seconds(lambda d=data, c=clients: table_entry(d, c - 1), args.repeats)
        per_mb = decode_s / (len(data) / 1e6)
        base = per_mb if base is None else base
        print(f"| {clients:,} | {len(data) / 1e6:.2f} MB | {encode_s:.3f} s | {decode_s:.3f} s "
              f"| {entry_s:.3f} s | {per_mb / base:.2f} |")


if __name__ == "__main__":
    main()
