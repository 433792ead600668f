"""``flwr run APP`` against a simulation SuperLink that the caller's test starts and stops.

What an example's README tells a user to type, with the SuperLink managed here: started
with ``--disable-runtime-dependency-installation`` (the app's packages come from this
environment), named in a ``$FLWR_HOME/config.toml`` of the test's own, and stopped by its
pid whatever happens.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from pathlib import Path

from dq_flower.deploy.flower_cli import flower_env, flower_executable
from dq_flower.deploy.supervisor import free_port, start_process, wait_for_port

__all__ = ["flwr_run_in_simulation"]


def flwr_run_in_simulation(app_dir: Path, workdir: Path, supernodes: int, run_config: str,
                           timeout: float = 240) -> str:
    """``flwr run app_dir --stream`` with ``supernodes`` simulated SuperNodes: its output.

    Raises ``AssertionError`` (with the output) where ``flwr run`` fails.
    """
    # Ray's socket paths must stay under 108 bytes: a short folder, not pytest's tmp_path
    ray_tmp = Path(tempfile.mkdtemp(prefix="dq-ray-"))
    home = workdir / "flwr-home"
    home.mkdir(parents=True)
    env = flower_env(flwr_home=home, ray_tmpdir=ray_tmp)
    port = free_port()
    (home / "config.toml").write_text(
        f'[superlink]\ndefault = "sim"\n\n[superlink.sim]\naddress = "127.0.0.1:{port}"\n'
        "insecure = true\n")
    superlink = start_process(
        [flower_executable("flower-superlink"), "--simulation", "--insecure",
         "--disable-runtime-dependency-installation", "--host", "127.0.0.1",
         "--port", str(port)],
        log_path=workdir / "superlink.log", env=env, cwd=workdir, name="superlink")
    try:
        wait_for_port("127.0.0.1", port, 60, superlink)
        done = subprocess.run(
            [flower_executable("flwr"), "run", str(app_dir), "sim", "--federation-config",
             f"num-supernodes={supernodes}", "--run-config", run_config, "--stream"],
            cwd=workdir, env=env, capture_output=True, text=True, timeout=timeout,
            check=False)
    finally:
        superlink.stop()
        shutil.rmtree(ray_tmp, ignore_errors=True)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert f"{supernodes} simulated SuperNodes" in output, output
    return output
