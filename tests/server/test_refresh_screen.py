"""A refreshed residual goes through the norm screen and the clip, as compensations do.

Before, refreshed residuals skipped the screen: one scaled by -1000 was accepted and, as
the largest norm on record, blocked later refreshes from everyone.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config
from dq_flower.wire.dq_batch import REFRESH_KEY
from tests.server.replies import node


def _scaled_refresh_app(scale):
    def app(msg, context):
        reply = client_app(msg, context)
        if msg.metadata.dst_node_id == node(0) and REFRESH_KEY in reply.content:
            arr = reply.content[REFRESH_KEY]["values"]
            values = np.frombuffer(arr.data, dtype=arr.dtype) * np.float32(scale)
            reply.content[REFRESH_KEY]["values"] = Array(
                dtype=arr.dtype, shape=tuple(arr.shape), stype="raw",
                data=values.astype(arr.dtype).tobytes())
        return reply

    return app


def test_a_refresh_scaled_by_minus_1000_is_rejected_and_later_refreshes_pass():
    run_config = build_run_config("dq", num_clients=4, rounds=5, compensation="identity",
                                  compensation_mode="refresh", refresh_every=2,
                                  compensation_params="entropy=none", server_steps=5,
                                  upload_schedule="fixed", budget=32)
    rows = run_server(InProcessGrid(_scaled_refresh_app(-1000.0), 4), run_config).history
    by_round = {r["round"]: r for r in rows if r.get("round")}
    # round 2 and 4 are refresh rounds: node 0's refresh is rejected, the others' kept
    assert by_round[2]["refreshes_rejected"] == 1 and by_round[2]["refreshed"] == 3
    assert by_round[4]["refreshes_rejected"] == 1 and by_round[4]["refreshed"] == 3
