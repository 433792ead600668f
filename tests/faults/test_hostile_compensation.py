"""Compensations a majority of hostile nodes inflate are refused, whatever the round's median.

Four nodes on the logistic-regression digits task with ``topk`` compensations, one server
step a round (the fresh step with the compensations): three nodes send their honest reply
with the compensation's values multiplied by 10^6 (finite). The round's norm screen compares
each compensation with the round's others, so a hostile majority passes it; the bound on a
compensation's norm against the gradient the server computes on the reply's own rows does
not depend on the others.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Context, Message
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

from .test_fuzz_wire import _scale_buffer

NODES, HOSTILE, ROUNDS = 4, 3, 12
KNOBS = {"compensation": "topk", "compensation_params": "ratio=0.05", "budget": 8,
         "server_steps": 1, "upload_schedule": "fixed"}


def _app(msg: Message, context: Context) -> Message:
    reply = client_app(msg, context)
    if int(context.node_config["partition-id"]) >= NODES - HOSTILE and not reply.has_error():
        content = recorddict_from_proto(recorddict_to_proto(reply.content))
        for name in list(content["compensation"]):
            if name != "header":
                _scale_buffer(content, "compensation", name, 1e6)
        return Message(content, reply_to=msg)
    return reply


def test_inflated_compensations_of_a_hostile_majority_are_refused():
    run_config = build_run_config("dq", model="logreg", num_clients=NODES, rounds=ROUNDS,
                                  seed=4, **KNOBS)
    result = run_server(InProcessGrid(_app, NODES), run_config)
    rows = result.history[1:]
    assert all(np.isfinite(r["loss"]) for r in rows)
    assert all(r["rejected"] == HOSTILE for r in rows), [r["rejected"] for r in rows]
    assert result.history[-1]["accuracy"] > result.history[0]["accuracy"] + 0.2
