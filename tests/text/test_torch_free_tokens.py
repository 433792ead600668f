"""A token round on a node without PyTorch: ``dq_train(window=...)`` imports no torch."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[1])
    from tests.edge.torch_blocker import install
    install()  # any import of torch raises from here on
    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity
    import dq_flower.client
    from dq_flower.wire.token_batch import decode_token_batch

    TaskIdentity.run_id, TaskIdentity.task_id, TaskIdentity.node_id = 1, 1, SUPERLINK_NODE_ID
    config = ConfigRecord({"server-round": 1, "round-seed": 3, "budget": 4})
    msg = Message(content=RecordDict({"config": config}), dst_node_id=5, message_type="train")
    msg.metadata.__dict__["_message_id"] = "m1"
    ctx = Context(run_id=1, node_id=5, node_config={"partition-id": 0}, state=RecordDict(),
                  run_config={})
    text = ["It is a truth universally acknowledged, that a single man " * 4]
    reply = dq_flower.client.dq_train(msg, ctx, text, window=16)
    batch = decode_token_batch(reply.content, 256, 16, 4)
    print(json.dumps({"torch": any(m.split(".")[0] == "torch" for m in sys.modules),
                      "metrics": dict(reply.content.metric_records["metrics"]),
                      "windows": batch.labels.tolist(), "ids": batch.ids.tolist()}))
""")


def test_a_token_round_runs_where_torch_cannot_be_imported():
    out = subprocess.run([sys.executable, "-c", WORKER, str(ROOT)], capture_output=True,
                         text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["torch"] is False
    assert result["metrics"]["selected"] == 4 and result["metrics"]["num-examples"] == 14
    text = ("It is a truth universally acknowledged, that a single man " * 4).encode()
    for row, i in zip(result["windows"], result["ids"], strict=True):
        assert bytes(row) == text[16 * i:16 * (i + 1)]  # each window exactly as held
