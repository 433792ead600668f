"""IID partitions of many clients: flwr-datasets' IidPartitioner against the shards cut at once.

``--rows`` rows split over ``--clients`` clients, as every process that loads a partition
computes them (once per process): partition by partition with flwr-datasets'
``IidPartitioner`` (each a data-set view; timed over ``--partitioner-clients`` of them,
the rest extrapolated), and at once with
:func:`dq_flower.harness.tasks.data.partitions.iid_shards`, which gives the same rows.

    .venv/bin/python benchmarks/iid_partitions.py [--rows 240000] [--clients 100000]
"""

from __future__ import annotations

import argparse
import sys
import time

import datasets
import numpy as np
from flwr_datasets.partitioner import IidPartitioner

from dq_flower.harness.tasks.data.partitions import iid_shards


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=240_000)
    parser.add_argument("--clients", type=int, default=100_000)
    parser.add_argument("--partitioner-clients", type=int, default=10_000,
                        help="partitions timed with IidPartitioner (it takes ms each)")
    args = parser.parse_args()
    datasets.disable_progress_bars()
    perm = np.random.default_rng(0).permutation(args.rows)
    partitioner = IidPartitioner(num_partitions=args.clients)
    partitioner.dataset = datasets.Dataset.from_dict(
        {"idx": perm, "label": np.zeros(args.rows, np.int64)})
    timed = min(args.partitioner_clients, args.clients)
    t0 = time.perf_counter()
    for i in range(timed):
        partitioner.load_partition(i)
    each = (time.perf_counter() - t0) / timed
    t0 = time.perf_counter()
    iid_shards(perm, args.clients)
    at_once = time.perf_counter() - t0
    print(f"{args.rows:,} rows over {args.clients:,} clients")
    print(f"IidPartitioner: {each * 1e3:.2f} ms per partition ({timed:,} timed): "
          f"{each * args.clients:,.0f} s for all")
    print(f"iid_shards: {at_once:.2f} s for all ({each * args.clients / at_once:,.0f}x faster)")


if __name__ == "__main__":
    sys.exit(main())
