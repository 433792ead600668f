"""The package as a user installs it: the built wheel in a fresh virtual environment.

``python -m build`` (what ``make dist`` runs) builds the sdist and, from the sdist, the
wheel; the wheel goes into a new virtual environment with ``pip install --no-index`` (no
network). The new environment takes its dependencies (Flower, numpy, PyTorch) from this
test's own environment through a ``.pth`` line, which adds that ``site-packages`` to the
path without running its ``.pth`` files, so this checkout's editable install stays out and
``import dq_flower`` finds the wheel's files. From there the README quickstart runs in
Flower's simulation engine and prints what the README shows, the console script answers,
and a node that cannot import PyTorch answers DQ rounds.

What a user of the wheel runs besides, each from a folder outside this checkout: ``flwr run``
of the examples and of the app that docs/plugin.md shows, against the SuperLink that ``flwr``
starts itself (the default ``local`` connection, Flower's runtime dependency installation
on: nothing is set but this test's own folders and ports), stopped by its pid at the end;
the presets that ``dq-flower compare --help`` names; ``dq-flower deploy local`` with the
package's own app and with plugin.md's app (``--app``); the missing-extra errors of a
client-only install. ``make dist`` builds in an isolated build environment without ``.venv``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import zipfile
from importlib import metadata
from pathlib import Path

import pytest
import tomli

from tests.edge.helpers import SubprocessClient
from tests.test_docs import ALL_BLOCKS, _documented_output, _lines

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
    _flower_scripts(venv)
    return venv


def _flower_scripts(venv: Path) -> None:
    """Flower's console scripts in the new environment, as ``pip install flwr`` writes them.

    The wheel went in with ``--no-deps`` (its dependencies come through the ``.pth`` line),
    so ``flwr``, ``flower-superlink``, ... are written here, run by the new environment's
    interpreter: the SuperLink that ``flwr run`` starts by name then imports the wheel.
    """
    for entry in metadata.distribution("flwr").entry_points:
        if entry.group != "console_scripts":
            continue
        module, _, attr = entry.value.partition(":")
        script = venv / "bin" / entry.name
        script.write_text(f"#!{venv / 'bin' / 'python'}\nimport sys\nfrom {module} import "
                          f"{attr.split('.')[0]}\nsys.exit({attr}())\n")
        script.chmod(0o755)


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


@pytest.mark.slow  # tests/examples/test_quickstart_rounds.py checks the same history in
# CI on the in-process grid; the wheel's simulation engine runs in the flwr run tests here
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
    # the whole output, line for line: a page showing fewer rounds is stale too
    assert _lines(expected) == _lines(out.read_text()), (expected, out.read_text())


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


# ------------------------------------------------------------ flwr run, as a user runs it
def _local_superlinks(flwr_home: Path) -> list[int]:
    """Pids of the SuperLinks that ``flwr`` started for ``flwr_home`` (their log is in it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                args = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if any(b"flower-superlink" in a for a in args[:2]) and any(
                    str(flwr_home).encode() in a for a in args):
                found.append(int(entry.name))
    return found


def _stop_with_descendants(pids: list[int]) -> None:
    """Stop ``pids`` and every process below them (Flower's helpers, Ray) by pid."""
    from dq_flower.deploy.supervisor import _descendants, _start_time, _stop_pids

    snapshot = {pid: start for pid in pids if (start := _start_time(pid)) is not None}
    for pid in pids:
        snapshot.update(_descendants(pid))
    _stop_pids(snapshot, grace=0.0, timeout=10.0)


@pytest.fixture(scope="module")
def flwr_user(installed, tmp_path_factory):
    """The wheel's environment as a user's shell has it: ``flwr`` on ``PATH``, nothing set.

    Only this test's folders (``FLWR_HOME``, Ray's) and the ports of Flower's local SuperLink
    (free ones, not 39091 and 39093) are its own. The SuperLink that the first ``flwr run``
    starts in the background stays for the module's runs, as it would for a user, and is
    stopped by its pid at the end.
    """
    from dq_flower.deploy.supervisor import free_port

    home = tmp_path_factory.mktemp("user")
    env = _env(home)
    for key in ("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "VIRTUAL_ENV", "UV_FIND_LINKS"):
        env.pop(key, None)
    env["PATH"] = os.pathsep.join([str(installed / "bin"), env.get("PATH", "")])
    env["FLWR_LOCAL_SUPERLINK_HTTP_API_PORT"] = str(free_port())
    env["FLWR_LOCAL_CONTROL_API_PORT"] = str(free_port())
    env["UV_CACHE_DIR"] = str(home / "uv-cache")
    try:
        yield env
    finally:
        superlinks = _local_superlinks(Path(env["FLWR_HOME"]))
        _stop_with_descendants(superlinks)
        assert not [p for p in superlinks if Path(f"/proc/{p}").exists()
                    and "Z" not in Path(f"/proc/{p}/stat").read_text().split(")")[1][:3]]
        shutil.rmtree(env["RAY_TMPDIR"], ignore_errors=True)


def _flwr_run(env: dict[str, str], app: Path, *args: str, timeout: float = 300) -> str:
    """``flwr run APP --stream ...`` from the app's parent folder; its output."""
    done = subprocess.run(["flwr", "run", app.name, *args, "--stream"], cwd=app.parent,
                          env=env, capture_output=True, text=True, timeout=timeout,
                          check=False)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    # Flower's runtime installation ran (it is on) and installed nothing
    assert "No additional application dependencies needed installation." in output, \
        output[-4000:]
    assert "Exit Code" not in output and "ERROR" not in output, output[-4000:]
    return output


def _requirement_names(project: dict) -> set[str]:
    def name(req: str) -> str:
        return re.split(r"[\s\[<>=!~;@]", req, maxsplit=1)[0].lower().replace("_", "-")

    reqs = list(project["project"].get("dependencies", []))
    for extra in project["project"].get("optional-dependencies", {}).values():
        reqs += extra
    return {name(r) for r in reqs} - {project["project"]["name"]}


@pytest.mark.parametrize("folder", ["", "examples/quickstart-dq", "examples/quickstart-pytorch",
                                    "examples/quickstart-pytorch-compressed",
                                    "examples/quickstart-pytorch-dq", "examples/text-dq"])
def test_every_app_leaves_its_packages_to_the_environment(folder):
    # Flower's runtime installation (uv sync) resolves every package of [project], extras
    # included; one that [tool.uv] does not exclude is fetched from an index at each run,
    # and dq-flower is on none
    with (ROOT / folder / "pyproject.toml").open("rb") as f:
        project = tomli.load(f)
    excluded = set(project.get("tool", {}).get("uv", {}).get("exclude-dependencies", []))
    assert _requirement_names(project) <= excluded, _requirement_names(project) - excluded


def _copy_app(name: str, tmp_path: Path) -> Path:
    app = tmp_path / name
    shutil.copytree(ROOT / "examples" / name, app,
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return app


def test_flwr_run_of_quickstart_dq_from_the_wheel(installed, flwr_user, tmp_path):
    app = _copy_app("quickstart-dq", tmp_path)
    output = _flwr_run(flwr_user, app, "--federation-config", "num-supernodes=2",
                       "--run-config", "num-server-rounds=1")
    assert re.search(r"Final accuracy 0\.9\d+, uplink \d+ bytes", output), output[-3000:]
    # the SuperLink that flwr started imports the wheel, not this checkout
    assert _local_superlinks(Path(flwr_user["FLWR_HOME"]))
    assert str(ROOT / "dq_flower") not in output


def _plugin_pages_app(tmp_path: Path) -> Path:
    """The README's one-file app (docs/plugin.md shows it too) and plugin.md's pyproject."""
    apps = [b.code for b in ALL_BLOCKS if b.code.startswith("# dq_app.py")]
    assert len(apps) == 2 and apps[0] == apps[1]  # README.md's and docs/plugin.md's
    project = next(b.code for b in ALL_BLOCKS if b.path == "docs/plugin.md"
                   and b.lang == "toml" and 'serverapp = "dq_app:server_app"' in b.code)
    app = tmp_path / "dq-app"
    app.mkdir()
    (app / "dq_app.py").write_text(apps[0])
    (app / "pyproject.toml").write_text(project)
    return app


def test_flwr_run_of_the_readme_and_plugin_pages_app_from_the_wheel(installed, flwr_user,
                                                                    tmp_path):
    # the README's quickstart, exactly as shown, run as both pages say: flwr run .
    app = _plugin_pages_app(tmp_path)
    output = _flwr_run(flwr_user, app, "--federation-config", "num-supernodes=4")
    found = re.search(r"accuracy (0\.\d+), up (\d+) B, down (\d+) B", output)
    assert found and float(found[1]) > 0.85, output[-3000:]
    # what both pages say `flwr run` prints
    said = re.search(r"`flwr run \.` prints `(accuracy [^`]+)`",
                     " ".join((ROOT / "docs" / "plugin.md").read_text().split()))
    assert said and said[1] == found[0], (said and said[1], found[0])
    readme = next(b for b in ALL_BLOCKS if b.path == "README.md"
                  and b.code.startswith("# dq_app.py"))
    assert _documented_output(readme) == found[0]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["quickstart-pytorch", "quickstart-pytorch-compressed",
                                  "quickstart-pytorch-dq"])
def test_flwr_run_of_every_example_from_the_wheel(installed, flwr_user, tmp_path, name):
    app = _copy_app(name, tmp_path)
    output = _flwr_run(flwr_user, app, "--run-config", "num-server-rounds=1",
                       "--federation-config", "num-supernodes=2", timeout=600)
    assert "Saving final model to disk" in output, output[-3000:]


@pytest.mark.slow
def test_flwr_run_of_the_package_app_from_the_wheel(installed, flwr_user, tmp_path):
    # the app the wheel ships (dq_flower/app/pyproject.toml), run from its installed folder
    app = Path(subprocess.run(
        [str(installed / "bin" / "python"), "-c",
         "from dq_flower.harness.app_folder import app_folder; print(app_folder())"],
        cwd=tmp_path, env=flwr_user, capture_output=True, text=True, check=True).stdout.strip())
    assert app.is_relative_to(installed) and app.name == "app", app
    results = tmp_path / "results.json"
    _flwr_run(flwr_user, app, "--run-config",
              f"num-server-rounds=1 results-path='{results}'", timeout=600)
    history = json.loads(results.read_text())["history"]
    assert [r["round"] for r in history] == [0, 1] and history[1]["accuracy"] > 0.5, history


# ------------------------------------------------------ what --help names, from the wheel
def test_the_presets_that_help_names_resolve_from_the_wheel(installed, tmp_path):
    dq_flower = installed / "bin" / "dq-flower"
    env = _env(tmp_path)

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(dq_flower), *args], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=120, check=False)

    named = re.search(r"preset name \(([^;)]*)", " ".join(run("compare", "--help").stdout.split()))
    assert named, "compare --help names no presets"
    names = [n.strip() for n in named[1].split(",") if n.strip() not in ("", "...")]
    assert {"digits-mlp", "fmnist-wide-cnn"} <= set(names), names
    listed = run("compare", "--list-presets")
    assert listed.returncode == 0, listed.stderr
    for name in names:  # each listed with its scenario, none invalid
        assert re.search(rf"^  {name} +\S+/\S+, \d+ clients", listed.stdout, re.M), \
            (name, listed.stdout)
    assert "invalid" not in listed.stdout
    # the preset resolves: the command goes on to its data (absent from this empty folder)
    (tmp_path / "no-data").mkdir()
    done = run("compare", "--preset", "fmnist-wide-cnn", "--data-dir", str(tmp_path / "no-data"),
               "--engine", "inprocess", "--out", str(tmp_path / "out"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "unknown preset" not in done.stderr and "no-data" in done.stderr, done.stderr


@pytest.mark.slow  # 33 s; the suite's version: a user's app, deployed from the wheel (below)
def test_deploy_local_runs_the_package_app_from_the_wheel(installed, tmp_path):
    # outside any checkout: no pyproject.toml in the folder it runs from
    env = _env(tmp_path)
    workdir = Path(tempfile.mkdtemp(prefix="dqd-"))  # short: Ray's and gRPC's socket paths
    try:
        done = subprocess.run([str(installed / "bin" / "dq-flower"), "deploy", "local",
                               "--nodes", "2", "--rounds", "1", "--workdir", str(workdir)],
                              cwd=tmp_path, env=env, capture_output=True, text=True,
                              timeout=400, check=False)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^round 1: accuracy 0\.\d+, up \d+ B", done.stdout, re.M), done.stdout
    # docs/deploy.md's transcript of `deploy local` shows this round (its bytes and accuracy)
    page = (ROOT / "docs" / "deploy.md").read_text()
    shown = page[page.index("$ dq-flower deploy local --nodes 2 --rounds 2"):]
    documented = re.search(r"^round 1: .*$", shown, re.M)
    assert documented and documented[0] in done.stdout.splitlines(), done.stdout


SMALLER = [("\nROUNDS = 5\n", "\nROUNDS = 1\n"),
           ("DQStrategy(model, seed=0)", "DQStrategy(model, seed=0, max_server_steps=100)")]


@pytest.mark.parametrize("small", [
    pytest.param(True, id="1-round"),
    pytest.param(False, id="as-shown", marks=pytest.mark.slow),  # 85 s on 2 cores
])
def test_deploy_local_runs_a_users_app_from_the_wheel(installed, tmp_path, small):
    # plugin.md's app, a user's own, on a TLS deployment of two SuperNodes: as shown, or one
    # round of 100 server steps (it declares no num-server-rounds for --rounds to set)
    app = _plugin_pages_app(tmp_path)
    code = (app / "dq_app.py").read_text()
    for old, new in SMALLER if small else []:
        assert old in code
        code = code.replace(old, new)
    (app / "dq_app.py").write_text(code)
    workdir = Path(tempfile.mkdtemp(prefix="dqd-"))  # short: Ray's and gRPC's socket paths
    try:
        done = subprocess.run([str(installed / "bin" / "dq-flower"), "deploy", "local",
                               "--app", str(app), "--nodes", "2", "--workdir", str(workdir)],
                              cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                              text=True, timeout=400, check=False)
        run_log = (workdir / "logs" / "flwr-run.log").read_text()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert re.search(r"^run \d+: finished:completed, SuperLink traffic \{\"inbound-bytes\": "
                     r"[1-9]\d*", done.stdout, re.M), done.stdout
    found = re.search(r"accuracy (0\.\d+), up [1-9]\d* B, down \d+ B", run_log)
    assert found and float(found[1]) > (0.7 if small else 0.85), run_log[-3000:]


# ------------------------------------------------------------- a client-only install
_BLOCK_SERVER_EXTRA = """
import importlib.abc, sys
class _NoServerExtra(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in {"torch", "torchvision", "sklearn", "matplotlib"}:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
sys.meta_path.insert(0, _NoServerExtra())
"""


@pytest.mark.parametrize("call", [
    "import dq_flower; dq_flower.DQStrategy",
    "import dq_flower; dq_flower.simulate('dq', rounds=1)",
    "import sys; from dq_flower.cli import main; sys.exit(main(['compare', '--rounds', '1']))",
])
def test_a_client_only_install_names_the_missing_extra(installed, tmp_path, call):
    done = subprocess.run([str(installed / "bin" / "python"), "-c", _BLOCK_SERVER_EXTRA + call],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True,
                          timeout=120, check=False)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode != 0 and "'server' extra" in last, done.stderr[-2000:]
    assert "[server]" in last and "download.pytorch.org/whl/cpu" in last, last


# ------------------------------------------------------------------------- make dist
def test_make_dist_builds_in_an_isolated_environment_without_the_venv(tmp_path):
    # a copy of the checkout's tracked and new files: no .venv, no build/ or dist/
    src = tmp_path / "src"
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                           cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    for name in files:
        if (ROOT / name).is_file():
            (src / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(ROOT)))
    start = time.monotonic()
    done = subprocess.run(["make", "dist", f"PY={sys.base_prefix}/bin/python3"], cwd=src,
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    took = time.monotonic() - start
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert not (src / ".venv").exists()
    assert "Creating isolated environment" in done.stdout + done.stderr, done.stderr[-3000:]
    wheel = next((src / "dist").glob("dq_flower-*.whl"))
    with zipfile.ZipFile(wheel) as whl:
        names = set(whl.namelist())
    assert "dq_flower/app/pyproject.toml" in names
    assert {f"dq_flower/presets/{p.name}" for p in (ROOT / "dq_flower" / "presets").glob(
        "*.toml")} <= names
    assert took < 60, f"make dist took {took:.0f} s"
