"""A real ``dq-flower deploy run`` against a TLS + node-authentication deployment on loopback.

Starts a SuperLink and two registered SuperNodes (:class:`LocalDeployment`, every process
stopped by pid at the end), runs ``dq-flower deploy run`` on the project's app with the
connection it wrote, and prints what that command printed: the transcript in
docs/deploy.md, step 6.

    OMP_NUM_THREADS=1 .venv/bin/python simulations/deploy_run_transcript.py [--workdir DIR]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from dq_flower.deploy.local import LocalDeployment

PROJECT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--run-config", default="num-server-rounds=3 budget=32")
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="dq-deploy-", dir="/tmp"))
    with LocalDeployment(workdir, num_nodes=2) as dep:
        cmd = [str(Path(sys.executable).parent / "dq-flower"), "deploy", "run",
               "--app", str(PROJECT), "--connection", dep.connection,
               "--run-config", args.run_config]
        done = subprocess.run(cmd, env=dep.env, capture_output=True, text=True,  # noqa: S603
                              timeout=900, check=False)
    print(f"$ dq-flower deploy run --run-config \"{args.run_config}\"")
    print(done.stdout, end="")
    print(done.stderr, end="", file=sys.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
