"""Hostile clients over many rounds, through the real ClientApp and the wire.

Each round, the honest nodes answer with the package's ClientApp; every hostile node takes
an honest reply of that round, serializes it as Flower does (protobuf), corrupts it with one
of the mutations below (nested headers, codec options the server did not configure,
extreme finite values, size claims of 2**28 to 2**31 elements for every payload,
truncation, metric and data-spec lies), parses it back and sends it. Over each run at least
2,000 hostile replies reach the server: no exception may escape, the model must stay
finite after every round, and the honest replies must keep being used.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import Array, ConfigRecord, Context, Message, MetricRecord
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto

from dq_flower.dq.server.federation import FederationData
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.server_app import run_server
from dq_flower.harness.simulate import build_run_config

HONEST, HOSTILE, ROUNDS = 2, 20, 100


def _raw(data: bytes, dtype: str) -> Array:
    return Array(dtype=dtype, shape=(len(data) // np.dtype(dtype).itemsize,), stype="raw",
                 data=data)


def _payload_records(content) -> list[str]:
    return [k for k, rec in content.array_records.items() if "header" in rec]


def _header(content, key):
    return json.loads(bytes(content[key]["header"].data))


def _set_header(content, key, header):
    content[key]["header"] = _raw(json.dumps(header).encode(), "uint8")


def _scale_buffer(content, key, name, factor):
    arr = content[key][name]
    if arr.dtype not in ("float32", "float16"):
        return
    values = np.frombuffer(arr.data, dtype=arr.dtype).astype(np.float64) * factor
    values = np.clip(values, -3e38, 3e38).astype(arr.dtype)
    content[key][name] = _raw(values.tobytes(), arr.dtype)


# ------------------------------------------------------------------ mutations
def nested_header(content, rng):
    key = rng.choice(_payload_records(content))
    depth = int(rng.integers(500, 1500))
    content[key]["header"] = _raw(b"[" * depth + b"]" * depth, "uint8")


def huge_size_claim(content, rng):
    key = rng.choice(_payload_records(content))
    header = _header(content, key)
    n = int(2 ** rng.integers(28, 32))
    header["shape"] = [n] if len(header["shape"]) == 1 else [n, *header["shape"][1:]]
    _set_header(content, key, header)


def unconfigured_option(content, rng):
    key = rng.choice(_payload_records(content))
    header = _header(content, key)
    header["meta"]["dither_seed" if key == "samples" else "bucket"] = int(rng.integers(1, 99))
    _set_header(content, key, header)


def extreme_values(content, rng):
    key = rng.choice(_payload_records(content) + (["sample-info"] if "sample-info" in content
                                                 else []))
    factor = float(rng.choice([1e20, 1e30, 3e38, -1e30]))
    for name in list(content[key]):
        if name != "header":
            _scale_buffer(content, key, name, factor)


def truncate(content, rng):
    key = rng.choice(_payload_records(content))
    names = [n for n in content[key] if n != "header"]
    name = names[int(rng.integers(len(names)))]
    arr = content[key][name]
    if len(arr.data) > 1:
        content[key][name] = _raw(arr.data[: int(rng.integers(0, len(arr.data)))], "uint8")


def metric_lies(content, rng):
    metrics = dict(content["metrics"].items())
    key = rng.choice([k for k in ("num-examples", "candidates", "partition-id")
                      if k in metrics])
    metrics[key] = int(rng.choice([2**31, 2**40, -1, 0]))
    content["metrics"] = MetricRecord(metrics)


def spec_lies(content, rng):
    if "data-spec" not in content.config_records:
        content["data-spec"] = ConfigRecord({"sample-shape": [3, 32, 32], "target": "class",
                                             "target-dim": 1})
        return
    spec = dict(content["data-spec"].items())
    shapes = [[65], [1, 8, 9], [10**7], [0], [2**31, 2**31]]
    spec["sample-shape"] = shapes[int(rng.integers(len(shapes)))]
    content["data-spec"] = ConfigRecord(spec)


def garbage(content, rng):
    key = rng.choice(_payload_records(content))
    content[key]["header"] = _raw(rng.bytes(int(rng.integers(0, 400))), "uint8")


MUTATIONS = [nested_header, huge_size_claim, unconfigured_option, extreme_values, truncate,
             metric_lies, spec_lies, garbage]


def _hostile_app(counter):
    """Honest nodes run the ClientApp; hostile ones corrupt an honest reply of the round."""
    honest_replies: dict[int, Message] = {}

    def app(msg: Message, context: Context) -> Message:
        pid = int(context.node_config["partition-id"])
        rnd = int(msg.content["config"]["server-round"])
        if pid < HONEST:
            reply = client_app(msg, context)
            honest_replies[rnd] = reply
            return reply
        source = honest_replies.get(rnd)
        if source is None or source.has_error():
            raise RuntimeError("no honest reply to corrupt")
        content = recorddict_from_proto(recorddict_to_proto(source.content))
        rng = np.random.default_rng([rnd, pid])
        MUTATIONS[int(rng.integers(len(MUTATIONS)))](content, rng)
        wire = recorddict_from_proto(recorddict_to_proto(content))
        counter["hostile"] += 1
        return Message(wire, reply_to=msg)

    return app


@pytest.mark.parametrize(("method", "knobs"), [
    ("dq", {"compensation": "topk", "compensation_params": "ratio=0.05", "budget": 2,
            "resend": True, "server_steps": 1, "upload_schedule": "fixed"}),
    ("dq", {"upload_mode": "gradient", "gradient_codec": "powersgd",
            "gradient_codec_params": "rank=1", "server_steps": 1}),
    ("qsgd", {}),
    ("ef-signsgd", {}),
])
def test_two_thousand_hostile_replies_over_many_rounds(method, knobs, monkeypatch):
    # a node refused twice in a row rests (FederationData.note_asks): not counted, the hostile
    # nodes are asked on and send the server two thousand corrupted replies
    monkeypatch.setattr(FederationData, "note_asks", lambda self, *args: None)
    counter = {"hostile": 0}
    finite, replies = [], []
    run_config = build_run_config(method, model="logreg", num_clients=HONEST + HOSTILE,
                                  rounds=ROUNDS, seed=4, **knobs)
    grid = InProcessGrid(_hostile_app(counter), HONEST + HOSTILE)

    def on_round(row):
        if row["round"]:
            finite.append(np.isfinite(row["loss"]))
            replies.append(row["replies"])

    result = run_server(grid, run_config, on_round=on_round)
    assert counter["hostile"] >= 2000
    assert all(finite), "the model became non-finite"
    assert all(r >= 1 for r in replies), replies  # the honest nodes' replies were used
    rejected = sum(r["rejected"] for r in result.history[1:])
    assert rejected >= 0.4 * counter["hostile"], rejected  # most corruptions are invalid
    assert result.history[-1]["accuracy"] > result.history[0]["accuracy"] + 0.2
