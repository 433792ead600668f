"""A ClientApp in a process of its own: ``python client_worker.py [--block-torch]``.

Reads framed requests on stdin, each a serialized ``Message`` and ``Context`` (Flower's
protobufs), calls the package's ``ClientApp`` on them, and writes back the reply, the
context after the call and a JSON status: whether ``torch`` is in ``sys.modules``, the
process's peak resident memory and the call's seconds. A raising ClientApp becomes an
error reply, as on a SuperNode. With ``--block-torch`` any import of torch raises
(:mod:`torch_blocker`), before anything else is imported; with ``--import-torch`` torch is
imported first, as in a client whose app defines an ``nn.Module``; ``--app module:name``
serves that ClientApp instead of the package's. The first status also has ``import_s``, the
seconds the imports took.

Frames are a 4-byte big-endian length and that many bytes.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__" and "--block-torch" in sys.argv:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import torch_blocker

    torch_blocker.install()

import json  # noqa: E402
import resource  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402


def read_frame(stream) -> bytes | None:
    """One frame from ``stream``; ``None`` at the end of the stream."""
    head = stream.read(4)
    if len(head) < 4:
        return None
    (size,) = struct.unpack(">I", head)
    return stream.read(size)


def write_frame(stream, data: bytes) -> None:
    """Write one frame to ``stream``."""
    stream.write(struct.pack(">I", len(data)) + data)


def peak_rss_kb() -> int:
    """This process's peak resident memory in KiB.

    ``VmHWM`` of ``/proc/self/status`` where there is one: ``ru_maxrss`` would also count
    the parent's memory at the time it forked this process (Linux keeps it across exec).
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main() -> None:
    t_start = time.perf_counter()
    if "--import-torch" in sys.argv:
        import torch  # noqa: F401

    from flwr.app import Error, Message
    from flwr.common.serde import (
        context_from_proto,
        context_to_proto,
        message_from_proto,
        message_to_proto,
    )
    from flwr.proto.message_pb2 import Context as ProtoContext
    from flwr.proto.message_pb2 import Message as ProtoMessage

    if "--app" in sys.argv:
        import importlib

        module, _, name = sys.argv[sys.argv.index("--app") + 1].partition(":")
        app = getattr(importlib.import_module(module), name)
    else:
        from dq_flower.harness.client_app import app

    import_s = time.perf_counter() - t_start
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    while (msg_bytes := read_frame(stdin)) is not None:
        ctx_bytes = read_frame(stdin) or b""
        proto_msg, proto_ctx = ProtoMessage(), ProtoContext()
        proto_msg.ParseFromString(msg_bytes)
        proto_ctx.ParseFromString(ctx_bytes)
        msg, context = message_from_proto(proto_msg), context_from_proto(proto_ctx)
        t0 = time.perf_counter()
        try:
            reply = app(msg, context)
        except Exception as exc:  # noqa: BLE001  (a crashed ClientApp is an error reply)
            reply = Message(Error(code=0, reason=f"{type(exc).__name__}: {exc}"),
                            reply_to=msg)
        seconds = time.perf_counter() - t0
        package = sys.modules.get("dq_flower")
        status = {"torch": "torch" in sys.modules, "seconds": seconds,
                  "package": getattr(package, "__file__", None),
                  "maxrss_kb": peak_rss_kb(),
                  "import_s": import_s}
        write_frame(stdout, message_to_proto(reply).SerializeToString())
        write_frame(stdout, context_to_proto(context).SerializeToString())
        write_frame(stdout, json.dumps(status).encode())
        stdout.flush()


if __name__ == "__main__":
    main()
