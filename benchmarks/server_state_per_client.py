"""What one more client costs the server process, part by part (bytes, tracemalloc).

Side by side, per client:

- Flower's simulation engine: registering ``--nodes`` nodes as ``run_simulation`` does
  (a node record in the in-memory link state, and a node state with its ``Context``);
- DQ, per registered node: the connected-node set a round keeps (``ClientIdentities``);
- DQ, per client that has uploaded flat samples: its feature ranges (two float32 vectors
  of ``--dim``; ``ranges`` ``auto`` uses them for flat samples, images use per-sample ranges).

The whole process's growth per registered client is measured by
``benchmarks/many_clients_simulation.py --sizes``; this script names where it goes.

    .venv/bin/python benchmarks/server_state_per_client.py [--nodes 100000] [--dim 784]
"""

from __future__ import annotations

import argparse
import os
import sys
import tracemalloc
from collections.abc import Callable

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

# the engine's own registration functions (flwr 1.42), as run_simulation calls them
from flwr.server.superlink.fleet.vce.vce_api import (  # noqa: E402
    _register_node_info_stores,
    _register_nodes,
)
from flwr.server.superlink.linkstate import LinkStateFactory  # noqa: E402
from flwr.supercore.constant import FLWR_IN_MEMORY_DB_NAME  # noqa: E402
from flwr.supercore.object_store import ObjectStoreFactory  # noqa: E402
from flwr.supercore.run import Run  # noqa: E402
from flwr.superlink.federation import NoOpFederationManager  # noqa: E402

from dq_flower.dq.server.federation import ClientIdentities  # noqa: E402
from dq_flower.dq.server.store import SampleStore  # noqa: E402


def traced(fn: Callable[[], object]) -> tuple[int, object]:
    """Bytes ``fn`` leaves allocated (tracemalloc), and what it returned (kept alive)."""
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    kept = fn()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")), kept


def flower_registration(nodes: int) -> object:
    """``nodes`` nodes registered as Flower's simulation engine registers them."""
    factory = LinkStateFactory(FLWR_IN_MEMORY_DB_NAME, NoOpFederationManager(),
                               ObjectStoreFactory())
    mapping = _register_nodes(nodes, factory)
    stores = _register_node_info_stores(mapping, Run.create_empty(run_id=1))
    return factory, mapping, stores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=784)
    args = parser.parse_args()
    flower_registration(100)  # warm-up: what the first registration imports or caches
    flower_bytes, registered = traced(lambda: flower_registration(args.nodes))
    node_ids = list(registered[1])  # type: ignore[index]
    identities = ClientIdentities()
    # the ids a grid returns are new int objects, as Flower's get_node_ids gives them
    connected_bytes, _ = traced(lambda: identities.observe(int(str(n)) for n in node_ids))
    rng = np.random.default_rng(0)
    store = SampleStore(lambda codes, side, dither: codes)
    clients = min(args.nodes, 2000)
    ranges_bytes, _ = traced(lambda: [store.set_ranges(
        i, rng.random(args.dim, dtype=np.float32), rng.random(args.dim, dtype=np.float32))
        for i in range(clients)])
    print(f"| part | per | bytes per client (over {args.nodes:,} nodes) |")
    print("|---|---|---:|")
    print(f"| Flower: link-state node and node context | registered node | "
          f"{flower_bytes / args.nodes:,.0f} |")
    print(f"| DQ: connected-node set of the round | registered node | "
          f"{connected_bytes / args.nodes:,.0f} |")
    print(f"| DQ: feature ranges (d = {args.dim:,}) | client that uploaded | "
          f"{ranges_bytes / clients:,.0f} |")


if __name__ == "__main__":
    sys.exit(main())
