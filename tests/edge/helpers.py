"""A ClientApp in a subprocess (optionally one that cannot import torch) for the grids."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from flwr.app import Context, Message
from flwr.common.serde import (
    context_from_proto,
    context_to_proto,
    message_from_proto,
    message_to_proto,
)
from flwr.proto.message_pb2 import Context as ProtoContext
from flwr.proto.message_pb2 import Message as ProtoMessage

from tests.edge.client_worker import read_frame, write_frame

HERE = Path(__file__).resolve().parent
WORKER = HERE / "client_worker.py"
REPO = HERE.parents[1]


class SubprocessClient:
    """``(Message, Context) -> Message`` served by ``client_worker.py`` in its own process.

    The node's ``Context`` travels both ways, so its ``state`` persists across rounds as on
    a SuperNode. ``statuses`` keeps the worker's status after each call. ``python`` is the
    interpreter (default: this one), e.g. a virtual environment's without PyTorch; ``app``
    (``module:name``) a ClientApp to serve instead of the package's; ``checkout=False``
    keeps this checkout off its path (the package from ``python``'s environment). Use as a context
    manager: leaving stops the worker by its pid.
    """

    def __init__(self, *, block_torch: bool = False, import_torch: bool = False,
                 block_log: Path | None = None, python: str | None = None,
                 app: str | None = None, checkout: bool = True) -> None:
        env = dict(os.environ)
        if checkout:
            env["PYTHONPATH"] = os.pathsep.join(
                p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
        else:  # nothing of this process's path (a simulation may have set PYTHONPATH)
            env.pop("PYTHONPATH", None)
        env["OMP_NUM_THREADS"] = "1"
        if block_log is not None:
            env["DQ_TORCH_BLOCK_LOG"] = str(block_log)
        cmd = [python or sys.executable, str(WORKER)]
        cmd += (["--block-torch"] if block_torch else []) + (
            ["--import-torch"] if import_torch else []) + (["--app", app] if app else [])
        # checkout=False: the package comes from ``python``'s own environment (an installed
        # wheel), never from this checkout
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=env, cwd=str(REPO if checkout else HERE))
        self.statuses: list[dict] = []

    def __call__(self, msg: Message, context: Context) -> Message:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        write_frame(self.proc.stdin, message_to_proto(msg).SerializeToString())
        write_frame(self.proc.stdin, context_to_proto(context).SerializeToString())
        self.proc.stdin.flush()
        frames = [read_frame(self.proc.stdout) for _ in range(3)]
        if any(f is None for f in frames):
            raise RuntimeError(f"client worker {self.proc.pid} died "
                               f"(exit status {self.proc.poll()})")
        reply_bytes, ctx_bytes, status = frames
        proto_reply, proto_ctx = ProtoMessage(), ProtoContext()
        proto_reply.ParseFromString(reply_bytes)
        proto_ctx.ParseFromString(ctx_bytes)
        context.state = context_from_proto(proto_ctx).state
        self.statuses.append(json.loads(status))
        return message_from_proto(proto_reply)

    def close(self) -> None:
        """Stop the worker (end of input, then its pid) and wait for it."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, 9)
                self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()

    def __enter__(self) -> SubprocessClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
