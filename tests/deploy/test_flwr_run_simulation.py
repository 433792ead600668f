"""``flwr run .`` with the pyproject.toml config against a local simulation SuperLink.

Exactly what a user types (see the README, "Run with flwr run"): start
``flower-superlink --simulation --disable-runtime-dependency-installation``, add a
``[superlink.<name>]`` entry to ``$FLWR_HOME/config.toml`` and ``flwr run . <name>`` with
run-config overrides. The SuperLink is stopped by its pid in a ``finally``. About 40 s on
2 cores, hence ``slow``: ``flwr run`` of the package's example and of a user's app runs in
every run of the suite from the installed wheel (``tests/test_install.py``).
"""

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from dq_flower.deploy.flower_cli import flower_env, flower_executable
from dq_flower.deploy.supervisor import free_port, start_process, wait_for_port

APP_DIR = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_flwr_run_against_simulation_superlink(tmp_path):
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's tmp_path
    ray_tmp = Path(tempfile.mkdtemp(prefix="dq-ray-"))
    env = flower_env(flwr_home=tmp_path / "flwr-home", ray_tmpdir=ray_tmp)
    port = free_port()
    (tmp_path / "flwr-home").mkdir()
    (tmp_path / "flwr-home" / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    results = tmp_path / "results.json"
    pyproject_before = (APP_DIR / "pyproject.toml").read_bytes()

    superlink = start_process(
        [flower_executable("flower-superlink"), "--simulation", "--insecure",
         "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
         "--port", str(port)],
        log_path=tmp_path / "superlink.log", env=env, cwd=tmp_path, name="superlink")
    try:
        wait_for_port("127.0.0.1", port, 60, superlink)
        done = subprocess.run(
            [flower_executable("flwr"), "run", ".", "sim", "--run-config",
             f"num-server-rounds=2 results-path='{results}'", "--stream"],
            cwd=APP_DIR, env=env, capture_output=True, text=True, timeout=120, check=False)
        output = done.stdout + done.stderr
        assert done.returncode == 0, output
        assert "Successfully started run" in output, output
        ls = subprocess.run([flower_executable("flwr"), "ls", "sim", "--format", "json"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60,
                            check=True)
        runs = json.loads(ls.stdout[ls.stdout.index("{"):])["runs"]
    finally:
        superlink.stop()
        sys.stdout.write(superlink.log_tail(10) + "\n")
        shutil.rmtree(ray_tmp, ignore_errors=True)

    assert superlink.poll() is not None
    assert [r["status"] for r in runs] == ["finished:completed"], output
    saved = json.loads(results.read_text())
    assert saved["config"]["num-server-rounds"] == 2
    assert saved["config"]["method"] == "dq"  # the defaults from [tool.flwr.app.config]
    history = saved["history"]
    assert [r["round"] for r in history] == [0, 1, 2]
    assert history[2]["accuracy"] > history[0]["accuracy"] + 0.2, history
    assert history[1]["up_bytes"] > 0 and history[1]["down_bytes"] > 0
    # docs/deploy.md's observed output is this run's: the same round lines
    page = (APP_DIR / "docs" / "deploy.md").read_text()
    shown = page[page.index("Observed output (2 simulated clients"):].split("```")[1]
    round_line = r"\[dq\] round \d+/2: .*"
    printed, documented = re.findall(round_line, output), re.findall(round_line, shown)
    assert len(printed) == len(documented) == 3, output[-3000:]
    loss = re.compile(r"loss (\d+\.\d+)")
    for got, want in zip(printed, documented, strict=True):
        # the loss's fourth decimal moves with the machine's float kernels (its sums'
        # order); accuracy, bytes and replies are exact
        assert loss.sub("loss", got) == loss.sub("loss", want), (got, want)
        assert abs(float(loss.search(got)[1]) - float(loss.search(want)[1])) <= 2e-4
    # flwr run must not rewrite the project (legacy [tool.flwr.federations] migration)
    assert (APP_DIR / "pyproject.toml").read_bytes() == pyproject_before
