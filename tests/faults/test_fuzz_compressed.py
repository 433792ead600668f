"""Fuzz the compressed-gradient strategy with corrupted replies mixed with a good one.

Methods ``qsgd`` (norms side information), ``orq`` (level tables) and ``ef-signsgd``
(scale) are fuzzed; every mutation makes a reply invalid, so each must be rejected and
counted, the good reply used, no exception may escape and the model must stay finite.
``qsgd`` with ``entropy-coder = "context"`` (its codes as an ANS stream) is fuzzed too,
with mutations aimed at the stream (bit flips, cut or appended 32-bit words).
"""

import json

import numpy as np
import pytest
import torch
from flwr.app import Array, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import get_method
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.server_app import validate_run_config
from dq_flower.harness.simulate import build_run_config

_COUNT = {"corrupted": 0}
METHODS = ("qsgd", "orq", "ef-signsgd")


def _setup(method, coder="none"):
    # the fixed-length payloads (no lossless coding): the fuzzer corrupts their buffers;
    # ``context``: qsgd's codes as the symbol model's stream, its norms as they are
    run_config = {**get_method(method).defaults,
                  **build_run_config(method, model="logreg", num_clients=3, seed=6),
                  "entropy-coder": coder}
    task, _ = validate_run_config(run_config)
    info = task_info(task)

    def new_strategy():
        return get_method(method).build(task, run_config, build_model(task, info), info)[0]

    strategy, train_config = get_method(method).build(task, run_config,
                                                      build_model(task, info), info)
    grid = InProcessGrid(client_app, 3)
    replies = grid.send_and_receive(strategy.configure_train(1, None, train_config, grid))
    assert not any(r.has_error() for r in replies)
    return new_strategy, [(r, r.content) for r in replies]


SETUPS = {m: _setup(m) for m in METHODS}
CONTEXT_SETUP = _setup("qsgd", "context")


def _request_from(node: int) -> Message:
    """A train request to ``node``: each corrupted reply comes from a node of its own, since
    the server refuses a second reply from the same node in a round."""
    request = Message(RecordDict({"config": ConfigRecord({"server-round": 1})}),
                      dst_node_id=node, message_type="train")
    request.metadata.__dict__["_message_id"] = f"fuzz-{node}"
    return request


def _copy(content: RecordDict) -> RecordDict:
    return recorddict_from_proto(recorddict_to_proto(content))


def _raw(data: bytes, dtype: str) -> Array:
    return Array(dtype=dtype, shape=(len(data) // np.dtype(dtype).itemsize,), stype="raw",
                 data=data)


def _payload_keys(content):
    return sorted(k for k, rec in content.array_records.items() if "header" in rec)


def _pick(content, rng):
    keys = _payload_keys(content)
    return keys[int(rng.integers(len(keys)))]


def _header(record):
    return json.loads(bytes(record["header"].data))


def _set_header(record, header):
    record["header"] = _raw(json.dumps(header).encode(), "uint8")


def truncate(content, rng):
    record = content[_pick(content, rng)]
    name = sorted(k for k in record if k != "header")[int(rng.integers(2))]
    arr = record[name]
    record[name] = _raw(arr.data[: -int(rng.integers(1, len(arr.data) + 1))], arr.dtype)


def wrong_dtype(content, rng):
    record = content[_pick(content, rng)]
    name = next(k for k in record if k != "header" and record[k].dtype == "float32")
    record[name] = Array(dtype=["int32", "uint32", "uint8"][int(rng.integers(3))],
                         shape=record[name].shape, stype="raw", data=record[name].data)


def huge_declared_size(content, rng):
    record = content[_pick(content, rng)]
    header = _header(record)
    header["shape"] = [10**12]
    _set_header(record, header)


def nan_side_information(content, rng):
    record = content[_pick(content, rng)]
    name = next(k for k in record if k != "header" and record[k].dtype == "float32")
    values = np.frombuffer(record[name].data, dtype=np.float32).copy()
    values[int(rng.integers(values.size))] = [np.nan, np.inf][int(rng.integers(2))]
    record[name] = _raw(values.tobytes(), "float32")


def wrong_parameters(content, rng):
    record = content[_pick(content, rng)]
    header = _header(record)
    if header["meta"]:
        key = sorted(header["meta"])[int(rng.integers(len(header["meta"])))]
        header["meta"][key] = int(rng.choice([0, 3, 9, 1000]))
        if header["meta"][key] == _header(record)["meta"][key]:
            header["meta"][key] += 1
    else:
        header["codec"] = "qsgd"
    _set_header(record, header)


def unknown_version(content, rng):
    record = content[_pick(content, rng)]
    header = _header(record)
    header["version"] = int(rng.choice([0, 2, 99]))
    _set_header(record, header)


def missing_key(content, rng):
    if rng.integers(3) == 0:
        del content["metrics"]
    elif rng.integers(2):
        del content[_pick(content, rng)]
    else:
        del content[_pick(content, rng)]["header"]


def garbage_header(content, rng):
    content[_pick(content, rng)]["header"] = _raw(rng.bytes(int(rng.integers(0, 200))), "uint8")


def bad_metrics(content, rng):
    bad = [{"num-examples": 0, "train-loss": 1.0}, {"num-examples": 10**9, "train-loss": 1.0},
           {"num-examples": 8, "train-loss": float("nan")}, {"train-loss": 1.0}]
    content["metrics"] = MetricRecord(bad[int(rng.integers(len(bad)))])


MUTATIONS = [truncate, wrong_dtype, huge_declared_size, nan_side_information, wrong_parameters,
             unknown_version, missing_key, garbage_header, bad_metrics]


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(METHODS),
       st.lists(st.tuples(st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32 - 1)),
                min_size=3, max_size=5))
def _fuzz_round(method, mutations):
    new_strategy, good = SETUPS[method]
    strategy = new_strategy()
    request, content = good[0]
    replies = [Message(_copy(content), reply_to=request)]
    for index, seed in mutations:
        corrupted = _copy(good[1][1])
        MUTATIONS[index](corrupted, np.random.default_rng(seed))
        replies.append(Message(corrupted, reply_to=_request_from(1000 + len(replies))))
    _COUNT["corrupted"] += len(mutations)

    _, metrics = strategy.aggregate_train(1, replies)

    assert metrics["rejected"] == len(mutations), [MUTATIONS[i].__name__ for i, _ in mutations]
    assert metrics["replies"] == 1
    assert all(torch.isfinite(p).all() for p in strategy.model.parameters())


def test_fuzzed_replies_are_rejected_counted_and_harmless():
    _fuzz_round()
    assert _COUNT["corrupted"] >= 2000


@pytest.mark.parametrize("method", METHODS)
def test_good_replies_alone_are_all_used(method):
    new_strategy, good = SETUPS[method]
    _, metrics = new_strategy().aggregate_train(
        1, [Message(_copy(c), reply_to=_request_from(r.metadata.src_node_id))
            for r, c in good])
    assert metrics["replies"] == 3 and metrics["rejected"] == 0


def flip_stream_bit(content, rng):
    record = content[_pick(content, rng)]
    data = bytearray(record["entropy-stream"].data)
    data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    record["entropy-stream"] = _raw(bytes(data), "uint8")


def cut_or_extend_stream(content, rng):
    record = content[_pick(content, rng)]
    data = bytes(record["entropy-stream"].data)
    data = data[:-4] if rng.integers(2) else data + data[:4]
    header = _header(record)
    header["nbits"] += 8 * (len(data) - len(record["entropy-stream"].data))
    header["buffers"]["entropy-stream"][1] = len(data)
    record["entropy-stream"] = _raw(data, "uint8")
    _set_header(record, header)


CONTEXT_MUTATIONS = [*MUTATIONS, flip_stream_bit, cut_or_extend_stream]


def test_context_replies_are_context_coded():
    for _, content in CONTEXT_SETUP[1]:
        for key in _payload_keys(content):
            assert _header(content[key])["meta"]["entropy-coder"] == "context"


@settings(max_examples=80, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(CONTEXT_MUTATIONS) - 1),
                          st.integers(0, 2**32 - 1)), min_size=3, max_size=5))
def test_fuzzed_context_coded_replies_are_rejected(mutations):
    new_strategy, good = CONTEXT_SETUP
    strategy = new_strategy()
    request, content = good[0]
    replies = [Message(_copy(content), reply_to=request)]
    for index, seed in mutations:
        corrupted = _copy(good[1][1])
        CONTEXT_MUTATIONS[index](corrupted, np.random.default_rng(seed))
        replies.append(Message(corrupted, reply_to=_request_from(1000 + len(replies))))
    _, metrics = strategy.aggregate_train(1, replies)
    assert metrics["rejected"] == len(mutations), [CONTEXT_MUTATIONS[i].__name__
                                                   for i, _ in mutations]
    assert metrics["replies"] == 1
    assert all(torch.isfinite(p).all() for p in strategy.model.parameters())
