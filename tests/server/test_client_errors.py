"""A failing client in the server's log: one line per failure, its traceback once."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from unittest import mock

import pytest
from flwr.app import Context, Message, RecordDict

from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.client_errors import (
    FailedReplies,
    _EngineTracebacks,
    failed_node,
    failure_cause,
    one_traceback_per_cause,
)
from dq_flower.server.common import ClientFailureError
from dq_flower.server.pipeline import FailureWatch
from dq_flower.torch_support import TorchUnavailableError
from dq_flower.wire.partition import name_partition, names_partition, partition_of, partition_tag

ROOT = Path(__file__).resolve().parents[2]

# the reason of a real error reply from Flower's simulation engine (Ray), shortened
RAY_REASON = "\n".join([
    "<class 'ray.exceptions.RayTaskError(ClientAppException)'>:<'\x1b[36mray::ClientAppActor."
    "run()\x1b[39m (pid=26257, ip=192.0.2.2, actor_id=e1a3, repr=<flwr.simulation."
    "ray_transport.ray_actor.ClientAppActor object at 0x7f3344fdf9d0>)",
    '  File "/work/.venv/lib/python3.11/site-packages/flwr/clientapp/client_app.py", '
    "line 161, in __call__",
    "    return self._registered_funcs[full_name](message, context)",
    '  File "/tmp/app.py", line 29, in train',
    '    raise ValueError("my data file is missing")',
    "ValueError: my data file is missing",
    "",
    "The above exception was the direct cause of the following exception:",
    "",
    "\x1b[36mray::ClientAppActor.run()\x1b[39m (pid=26257, ip=192.0.2.2, actor_id=e1a3)",
    '  File "/work/.venv/lib/python3.11/site-packages/flwr/simulation/ray_transport/'
    'ray_actor.py", line 65, in run',
    "    raise ClientAppException(str(ex)) from ex",
    "flwr.clientapp.client_app.ClientAppException: ",
    "Exception ClientAppException occurred. Message: my data file is missing'>"])


@pytest.mark.parametrize("reason, cause", [
    (RAY_REASON, "ValueError: my data file is missing"),
    # a SuperNode's reply: the exception's type and message, no traceback
    ("<class 'KeyError'>:<''label''>", "KeyError: 'label'"),
    ("<class 'flwr.clientapp.client_app.ClientAppException'>:<'\nException "
     "ClientAppException occurred. Message: disk full'>", "disk full"),
    # a chained exception: the last one the client's code raised
    ("OSError: no such file\n\nThe above exception was the direct cause of the following "
     "exception:\n\nRuntimeError: cannot load partition 3",
     "RuntimeError: cannot load partition 3"),
    ("", "no reason given"),
    ("x" * 5000, "x" * 597 + "..."),
])
def test_a_failure_is_its_cause_in_one_line(reason, cause):
    assert failure_cause(reason) == cause


def test_each_failure_is_one_line_and_the_whole_error_is_shown_once_per_cause(caplog):
    failed = FailedReplies()
    with caplog.at_level(logging.WARNING, logger="flwr"):
        for node in (7, 8, 7):
            assert failed.log(node, RAY_REASON) == "ValueError: my data file is missing"
        failed.log(9, "<class 'KeyError'>:<''label''>")
        # the same cause from partition 3: its line names it, its traceback is not shown again
        failed.log(10, RAY_REASON.replace("missing", "missing [partition-id 3]"))
    lines = [r.getMessage() for r in caplog.records]
    unknown = "(partition unknown: the error names none)"
    assert [line for line in lines if line.startswith("reply from node")] == [
        f"reply from node 7 {unknown} failed: ValueError: my data file is missing",
        f"reply from node 8 {unknown} failed: ValueError: my data file is missing",
        f"reply from node 7 {unknown} failed: ValueError: my data file is missing",
        f"reply from node 9 {unknown} failed: KeyError: 'label'",
        "reply from node 10 (partition 3) failed: ValueError: my data file is missing"]
    wholes = [line for line in lines if line.startswith("the client's whole error")]
    assert len(wholes) == 2 and 'raise ValueError("my data file is missing")' in wholes[0]


def _context(partition=None):
    config = {} if partition is None else {"partition-id": partition, "num-partitions": 4}
    return Context(run_id=1, node_id=77, node_config=config, state=RecordDict(), run_config={})


def _flower_reason(exc: BaseException) -> str:
    """A SuperNode's reason for ``exc`` (flwr/supernode/runtime/run_clientapp.py)."""
    return str(type(exc)) + ":<'" + str(exc) + "'>"


@pytest.mark.parametrize("exc, shown", [
    (ValueError("bad rows"), "bad rows [partition-id 3]"),
    (TorchUnavailableError("no torch here"), "no torch here [partition-id 3]"),
    (ModuleNotFoundError("No module named 'x'", name="x"), "No module named 'x' [partition-id 3]"),
])
def test_an_error_raised_in_a_client_function_names_its_partition(exc, shown):
    @names_partition
    def client(msg, context):
        raise exc

    with pytest.raises(type(exc)) as caught:
        client(None, _context(3))
    assert caught.value is exc and str(exc) == shown  # the same exception, its type kept
    assert partition_of(_flower_reason(exc)) == 3
    assert failure_cause(_flower_reason(exc)) == f"{type(exc).__name__}: {shown[:-17]}"
    name_partition(exc, _context(3))  # named once, however many wrappers it passes
    assert str(exc) == shown


def test_a_message_its_type_formats_gets_a_note_and_no_partition_is_no_tag():
    key = KeyError("label")
    name_partition(key, _context(2))
    assert str(key) == "'label'" and key.__notes__ == ["[partition-id 2]"]
    assert partition_of(_flower_reason(key)) is None  # a SuperNode's reason lacks the note
    plain = ValueError("bad rows")
    name_partition(plain, _context(None))  # a SuperNode started without partition-id
    name_partition(plain, _context("two"))
    assert str(plain) == "bad rows" and not hasattr(plain, "__notes__")
    assert partition_tag(_context("5")) == " [partition-id 5]"


def _record(path: str, func: str, level: int = logging.ERROR) -> logging.LogRecord:
    record = logging.LogRecord("flwr", level, path, 1, "boom", None, None, func=func)
    return record


def test_only_the_engine_records_of_a_client_exception_are_dropped():
    quiet = _EngineTracebacks()
    engine = "/x/flwr/server/superlink/fleet/vce/vce_api.py"
    assert not quiet.filter(_record(engine, "worker"))
    assert not quiet.filter(_record("/x/vce/backend/raybackend.py", "process_message"))
    assert quiet.filter(_record(engine, "run_api"))           # the engine failing to start
    assert quiet.filter(_record(engine, "worker", logging.WARNING))
    assert quiet.filter(_record("/x/flwr/serverapp/strategy/fedavg.py", "worker"))
    flower = logging.getLogger("flwr")
    with one_traceback_per_cause():
        assert any(isinstance(f, _EngineTracebacks) for f in flower.filters)
    assert not any(isinstance(f, _EngineTracebacks) for f in flower.filters)


def test_a_run_whose_every_client_fails_ends_with_the_cause():
    def client(msg, context):
        raise ValueError("my data file is missing")

    grid = InProcessGrid(client, 1)
    node = next(iter(grid.get_node_ids()))
    watch = FailureWatch(2, "dq")

    def one_round():
        watch.observe(grid.send_and_receive(
            [Message(RecordDict(), dst_node_id=node, message_type="train")]))

    one_round()
    with pytest.raises(ClientFailureError) as caught:
        one_round()
    assert str(caught.value).endswith(
        f"first client error, from node {node} (partition unknown: the error names none): "
        "ValueError: my data file is missing")
    assert "\n" not in str(caught.value)


APP = textwrap.dedent('''
    import sys

    import numpy as np
    from flwr.app import ArrayRecord, Context, Message
    from flwr.clientapp import ClientApp
    from flwr.serverapp import Grid, ServerApp
    from flwr.simulation import run_simulation
    from torch import nn

    import dq_flower

    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 8)).astype(np.float32)
    Y = (X[:, 0] > 0).astype(np.int64)
    server_app, client_app = ServerApp(), ClientApp()


    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        model = nn.Linear(8, 2)
        strategy = dq_flower.DQStrategy(model, seed=0, max_server_steps=50)
        strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=2)


    @client_app.train()
    def train(msg: Message, context: Context) -> Message:
        k = context.node_config["partition-id"]
        if k == 1:  # the app's own code, before dq_train runs
            raise ValueError("my data file is missing")
        labels = Y[:5] if k == 2 else Y[k::4]  # partition 2: dq_train refuses its data
        return dq_flower.client.dq_train(msg, context, (X[k::4], labels))


    run_simulation(server_app=server_app, client_app=client_app, num_supernodes=4)
''')


def test_failing_clients_in_flowers_simulation_engine(tmp_path):
    # a user's app in Flower's simulation engine, two of four clients raising every round:
    # one in its own code (no partition known), one in dq_train (its partition named)
    (tmp_path / "app.py").write_text(APP)
    # RAY_TMPDIR: the suite's short one (conftest.py); Ray's socket paths must stay short
    env = {**os.environ, "FLWR_HOME": str(tmp_path / "flwr"), "FLWR_TELEMETRY_ENABLED": "0",
           "FLWR_DISABLE_UPDATE_CHECK": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "app.py"], cwd=tmp_path, env=env, timeout=600,
                          capture_output=True, text=True, check=False)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-3000:]
    failures = [line for line in out.splitlines() if "failed: ValueError" in line]
    assert len(failures) == 4, failures
    own = [line for line in failures if line.endswith("my data file is missing")]
    assert len(own) == 2 and all(re.search(
        r"reply from node \d+ \(partition unknown: the error names none\) failed: "
        r"ValueError: my data file is missing$", line) for line in own), own
    refused = [line for line in failures if line not in own]
    assert len(refused) == 2 and all(re.search(
        r"reply from node \d+ \(partition 2\) failed: ValueError: data \(x, y\): x has 75 "
        r"samples, y has 5$", line) for line in refused), refused
    assert out.count('raise ValueError("my data file is missing")') == 1, out
    assert out.count("the client's whole error") == 2, out
    assert "An exception was raised when processing a message" not in out


def test_compression_mod_names_the_partition_of_its_own_and_the_apps_errors():
    from dq_flower import compression_mod

    msg = Message(RecordDict(), dst_node_id=77, message_type="train")
    refused = compression_mod(msg, _context(1), lambda m, c: m)  # no CompressedUpdates knobs
    assert refused.has_error() and partition_of(refused.error.reason) == 1
    assert failed_node(77, refused.error.reason) == "node 77 (partition 1)"

    def raising_train(m, c):  # an app's own train() failing under the mod
        raise ValueError("my data file is missing")

    with mock.patch("dq_flower.compression.mod._config", return_value={}), \
            mock.patch("dq_flower.compression.mod.CompressionConfig"), \
            mock.patch("dq_flower.compression.mod._received", return_value=(None, None)), \
            pytest.raises(ValueError, match=r"missing \[partition-id 1\]$"):
        compression_mod(msg, _context(1), raising_train)
