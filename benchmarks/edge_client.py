"""The torch-free DQ client beside the full one: installed size, peak memory, time per round.

Side by side in one run, on the same data file and server:

- **installed size**: the packages a device installs, summed from each distribution's
  ``RECORD``: the base install (this checkout without extras: Flower and numpy) in a fresh
  virtual environment this script creates (``--venv``; pip fetches flwr and numpy from
  the package index once), against the full one (the ``server`` extra: PyTorch and the
  rest) as installed in this interpreter's environment;
- **peak resident memory** of the ClientApp's process over ``--rounds`` DQ rounds and the
  **median time per round** the ClientApp takes, for: the package's ClientApp in that
  fresh environment (no PyTorch on disk); the same ClientApp where PyTorch is loaded (as in
  any client whose app defines an ``nn.Module``, and in every client before the client
  path became torch-free); and, for scale, a round that needs the model (``gradnorm``).

The server is this process (``run_server`` with ``DQStrategy``); each client is
``tests/edge/client_worker.py`` in its own process, fed through the in-process grid.

Usage: python benchmarks/edge_client.py [--rounds 5] [--dataset fmnist] [--budget 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

#: Run in a target interpreter: the installed bytes of the requirements' closure there.
CLOSURE = r"""
import json, sys
from importlib import metadata
try:
    from packaging.requirements import Requirement
except ImportError:
    from pip._vendor.packaging.requirements import Requirement

def norm(name):
    return name.lower().replace("_", "-").replace(".", "-")

todo = [(Requirement(r), ()) for r in json.loads(sys.argv[1])]
sizes, seen = {}, set()
while todo:
    req, extras = todo.pop()
    key = (norm(req.name), tuple(sorted(req.extras)))
    if key in seen:
        continue
    seen.add(key)
    try:
        dist = metadata.distribution(req.name)
    except metadata.PackageNotFoundError:
        continue
    name = norm(dist.metadata["Name"])
    if name not in sizes:
        sizes[name] = sum(f.locate().stat().st_size for f in (dist.files or [])
                          if f.locate().is_file())
    for text in dist.requires or []:
        sub = Requirement(text)
        envs = [{"extra": e} for e in req.extras] or [{"extra": ""}]
        if sub.marker is None or any(sub.marker.evaluate(env) for env in envs):
            todo.append((sub, ()))
print(json.dumps(sizes))
"""


def requirements() -> tuple[list[str], list[str]]:
    """The base dependencies and those of the ``server`` extra, from pyproject.toml."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"]), list(project["optional-dependencies"]["server"])


def closure_sizes(python: str, reqs: list[str]) -> dict[str, int]:
    """Installed bytes per distribution of ``reqs`` and their dependencies, in ``python``."""
    out = subprocess.run([python, "-c", CLOSURE, json.dumps(reqs)], capture_output=True,
                         text=True, check=True).stdout
    return json.loads(out)


def edge_venv(path: Path) -> str:
    """A virtual environment with the base install only (created once); its python."""
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
        t0 = time.perf_counter()
        subprocess.run([str(python), "-m", "pip", "install", "-q", str(REPO)], check=True)
        print(f"pip install <checkout> (base) into {path}: {time.perf_counter() - t0:.0f} s")
    probe = subprocess.run([str(python), "-c", "import torch"], capture_output=True)
    if probe.returncode == 0:
        raise SystemExit(f"{path} has PyTorch; it must hold the base install only")
    return str(python)


def node_file(dataset: str, parts: int, folder: Path) -> tuple[Path, int]:
    """Partition 0 of ``parts`` of ``dataset`` as a device's own ``.npz``, shaped."""
    from dq_flower.harness.tasks.data import load_dataset_cached, load_partition, save_node_data

    x, y, _ = load_partition(dataset, 0, parts, "iid", 0.5, 0, None)
    shape = tuple(load_dataset_cached(dataset, None, 0).input_shape)
    return save_node_data(folder / "local.npz", x.reshape(-1, *shape), y), len(y)


def run_variant(name: str, python: str, import_torch: bool, data_file: Path, args,
                **knobs) -> dict:
    """``args.rounds`` DQ rounds against one client process; its statuses summarised."""
    from dq_flower.harness.inprocess import NODE_ID_BASE, InProcessGrid
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config
    from tests.edge.helpers import SubprocessClient

    run_config = build_run_config("dq", dataset=args.dataset, model=args.model,
                                  num_clients=1, rounds=args.rounds, budget=args.budget,
                                  bits=2, **knobs)
    with SubprocessClient(python=python, import_torch=import_torch) as client:
        grid = InProcessGrid(client, 1)
        grid.contexts[NODE_ID_BASE].node_config["data-file"] = str(data_file)
        result = run_server(grid, run_config)
        statuses = list(client.statuses)
    failed = [r["failed"] for r in result.history[1:]]
    if any(failed) or len(statuses) != args.rounds:
        raise SystemExit(f"{name}: rounds failed {failed}")
    return {"variant": name, "torch_loaded": any(s["torch"] for s in statuses),
            "import_s": statuses[0]["import_s"],
            "round_s_median": statistics.median(s["seconds"] for s in statuses),
            "first_round_s": statuses[0]["seconds"],
            "peak_rss_mb": max(s["maxrss_kb"] for s in statuses) / 1024,
            "stored": result.history[-1]["stored"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dataset", default="fmnist")
    parser.add_argument("--parts", type=int, default=10, help="the node holds 1/parts")
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--budget", type=int, default=256)
    parser.add_argument("--venv", default=os.path.join(tempfile.gettempdir(),
                                                       "dq-flower-edge-venv"))
    parser.add_argument("--out", default="", help="also write the results as JSON here")
    args = parser.parse_args()

    base, server = requirements()
    edge_python = edge_venv(Path(args.venv))
    small = closure_sizes(edge_python, ["dq-flower"])
    full = closure_sizes(sys.executable, base + server)
    cuda = sum(v for k, v in full.items() if k.startswith(("nvidia-", "triton", "cuda-")))
    mb = 1e6
    print(f"\ninstalled: base (torch-free) {sum(small.values()) / mb:.0f} MB "
          f"({len(small)} distributions, dq-flower included); full (server extra) "
          f"{sum(full.values()) / mb:.0f} MB ({len(full)} distributions), of which torch "
          f"{full.get('torch', 0) / mb:.0f} MB and CUDA libraries {cuda / mb:.0f} MB")

    with tempfile.TemporaryDirectory(prefix="dq-edge-") as tmp:
        data_file, rows = node_file(args.dataset, args.parts, Path(tmp))
        print(f"node data: {rows} rows of {args.dataset}; {args.rounds} rounds of "
              f"budget {args.budget}, 2 bits")
        rows_out = [
            run_variant("torch-free (base install)", edge_python, False, data_file, args),
            run_variant("full (PyTorch loaded)", sys.executable, True, data_file, args),
            run_variant("full, scorer gradnorm", sys.executable, True, data_file, args,
                        scorer="gradnorm"),
        ]
    print("\n| client | torch loaded | peak RSS (MB) | median s / round | first round s "
          "| import s |")
    print("|---|---|---|---|---|---|")
    for r in rows_out:
        print(f"| {r['variant']} | {'yes' if r['torch_loaded'] else 'no'} | "
              f"{r['peak_rss_mb']:.0f} | {r['round_s_median']:.3f} | "
              f"{r['first_round_s']:.3f} | {r['import_s']:.2f} |")
    free, loaded = rows_out[0], rows_out[1]
    print(f"\nratios, torch-free / full: peak RSS "
          f"{free['peak_rss_mb'] / loaded['peak_rss_mb']:.3f}, time per round "
          f"{free['round_s_median'] / loaded['round_s_median']:.2f}, installed size "
          f"{sum(small.values()) / sum(full.values()):.4f}")
    if args.out:
        Path(args.out).write_text(json.dumps(
            {"installed_bytes": {"base": small, "full": full}, "rounds": rows_out},
            indent=2))


if __name__ == "__main__":
    main()
