"""The package as a user installs it: the built wheel in a fresh virtual environment.

``python -m build`` (what ``make dist`` runs) builds the sdist and, from the sdist, the
wheel; the wheel goes into a new virtual environment with ``pip install --no-index`` (no
network). The new environment takes its dependencies (Flower, numpy, PyTorch) from this
test's own environment through a ``.pth`` line, which adds that ``site-packages`` to the
path without running its ``.pth`` files, so this checkout's editable install stays out and
``import dq_flower`` finds the wheel's files. From there the README quickstart runs in
Flower's simulation engine and prints what the README shows, the console script answers,
and a node that cannot import PyTorch answers DQ rounds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import pytest

from tests.edge.helpers import SubprocessClient
from tests.test_docs import ALL_BLOCKS, _documented_output

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh virtual environment holding the built wheel; its directory."""
    base = tmp_path_factory.mktemp("install")
    dist = base / "dist"
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(dist), str(ROOT)], capture_output=True, text=True,
                           timeout=600, check=False)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    wheels, sdists = list(dist.glob("dq_flower-*.whl")), list(dist.glob("dq_flower-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, list(dist.iterdir())
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    python = venv / "bin" / "python"
    # a clean environment and a folder of its own: with this checkout on the path (an
    # earlier simulation may have put it on PYTHONPATH) pip would find the checkout's
    # egg-info and install nothing
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                           "--no-index", "--no-deps", "--quiet", str(wheels[0])],
                          capture_output=True, text=True, timeout=300, check=False,
                          cwd=base, env=_env(base))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    purelib = subprocess.run([str(python), "-c", "import sysconfig; "
                              "print(sysconfig.get_paths()['purelib'])"], cwd=base,
                             env=_env(base), capture_output=True, text=True,
                             check=True).stdout.strip()
    assert (Path(purelib) / "dq_flower" / "__init__.py").exists(), list(Path(purelib).iterdir())
    Path(purelib, "_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return venv


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # a short folder of its own for Ray: its socket paths must stay under 108 bytes
    ray_tmp = tempfile.mkdtemp(prefix="dqr-", dir="/tmp")
    env.update(FLWR_HOME=str(tmp / "flwr"), RAY_TMPDIR=ray_tmp,
               FLWR_TELEMETRY_ENABLED="0", FLWR_DISABLE_UPDATE_CHECK="1",
               OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    return env


def test_the_wheel_is_what_the_environment_imports(installed, tmp_path):
    code = "import dq_flower, flwr; print(dq_flower.__file__); print(flwr.__version__)"
    done = subprocess.run([str(installed / "bin" / "python"), "-c", code], cwd=tmp_path,
                          env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                          check=True)
    package, flwr_version = done.stdout.split()
    assert Path(package).is_relative_to(installed), package
    assert flwr_version.startswith("1.42")
    cli = subprocess.run([str(installed / "bin" / "dq-flower"), "--help"], cwd=tmp_path,
                         env=_env(tmp_path), capture_output=True, text=True, timeout=120,
                         check=False)
    assert cli.returncode == 0 and "compare" in cli.stdout, cli.stdout + cli.stderr


def test_the_readme_quickstart_runs_from_the_wheel(installed, tmp_path):
    block = next(b for b in ALL_BLOCKS if b.path == "README.md"
                 and b.code.startswith("# examples/quickstart.py"))
    expected = _documented_output(block)
    assert expected is not None
    shutil.copy(ROOT / "examples" / "quickstart.py", tmp_path / "quickstart.py")
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    # files, not pipes: Ray's helper processes inherit the streams and may outlive the
    # script; its own session, so that the group (its pid) is stopped at the end
    with out.open("w") as stdout, err.open("w") as stderr:
        proc = subprocess.Popen([str(installed / "bin" / "python"), "quickstart.py"],
                                cwd=tmp_path, env=_env(tmp_path), stdout=stdout,
                                stderr=stderr, start_new_session=True)
        try:
            returncode = proc.wait(timeout=600)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
    assert returncode == 0, err.read_text()[-3000:]
    assert expected in out.read_text(), (expected, out.read_text())


def test_a_torch_free_node_answers_dq_rounds_from_the_wheel(installed, tmp_path):
    from dq_flower.harness.server_app import run_server
    from dq_flower.harness.simulate import build_run_config
    from tests.edge.test_torch_free_client import BUDGET, ROUNDS, _edge_file, _grid

    data_file, _ = _edge_file(tmp_path)
    run_config = build_run_config("dq", dataset="digits", model="logreg", num_clients=2,
                                  rounds=ROUNDS, budget=BUDGET, upload_schedule="fixed")
    with SubprocessClient(block_torch=True, python=str(installed / "bin" / "python"),
                          checkout=False) as edge:
        result = run_server(_grid(edge, data_file), run_config)
        statuses = list(edge.statuses)
    assert len(statuses) == ROUNDS and not any(s["torch"] for s in statuses), statuses
    assert all(Path(s["package"]).is_relative_to(installed) for s in statuses), statuses
    for row in result.history[1:]:
        assert (row["replies"], row["rejected"], row["failed"]) == (2, 0, 0), row
    assert result.history[-1]["stored"] == 2 * ROUNDS * BUDGET
