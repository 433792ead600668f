"""Fuzz the DQ strategy with corrupted replies mixed with good ones.

Every mutation below makes a reply invalid on purpose, so each must be rejected and
counted; the good reply of each round must still be used, no exception may escape and the
model must stay finite.
"""

import json

import numpy as np
import torch
from flwr.app import Array, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from tests.faults.ranges_edit import sample_ranges, set_sample_ranges

TASK = TaskConfig(num_partitions=4, model="logreg", seed=5)
# samples entropy-coded, the compensation raw (its values are what the mutations edit)
CFG = DQConfig(budget=16, server_steps=1, upload_schedule="fixed", compensation="fp16",
               entropy_coder="zlib",
               compensation_params="entropy=none")
_COUNT = {"corrupted": 0}


def _good_replies():
    info = task_info(TASK)
    strategy = DQStrategy(build_model(TASK, info), seed=TASK.seed, config=CFG)
    grid = InProcessGrid(client_app, 4)
    messages = strategy.configure_train(1, None, client_task_config(TASK, "dq"), grid)
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return [(r, r.content) for r in replies]


GOOD = _good_replies()


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
    size = len(data) // np.dtype(dtype).itemsize
    return Array(dtype=dtype, shape=(size,), stype="raw", data=data)


def _header(content, record="samples"):
    return json.loads(bytes(content[record]["header"].data))


def _set_header(content, header, record="samples"):
    content[record]["header"] = _raw(json.dumps(header).encode(), "uint8")


def _set_info(content, name, values, dtype):
    content["sample-info"][name] = _raw(np.asarray(values, dtype=dtype).tobytes(), dtype)


def _info(content, name, dtype):
    return np.frombuffer(content["sample-info"][name].data, dtype=dtype).copy()


# ----------------------------------------------------------------- ranges, as sent
def _range_buffer(content):
    """The samples' per-row ranges as sent: the coded ``ranges`` stream or raw ``scales``."""
    return "ranges" if "ranges" in content["samples"] else "scales"


_ranges, _set_ranges = sample_ranges, set_sample_ranges


# ----------------------------------------------------------------- mutations (all invalid)
def truncate(content, rng):
    ranges = [("samples", "mins"), ("samples", "scales")]
    if "ranges" in content["samples"]:
        ranges = [("samples", "ranges"), ("samples", "ranges")]
    record, name = [("samples", "codes"), *ranges,
                    ("sample-info", "labels"), ("sample-info", "ids"),
                    ("compensation", "values")][rng.integers(6)]
    arr = content[record][name]
    cut = int(rng.integers(1, max(2, len(arr.data))))
    content[record][name] = _raw(arr.data[:-cut], arr.dtype)


def wrong_dtype(content, rng):
    name = _range_buffer(content)
    arr = content["samples"][name]
    content["samples"][name] = Array(dtype=["int32", "uint32", "float16"][rng.integers(3)],
                                     shape=arr.shape, stype="raw", data=arr.data)


def huge_declared_size(content, rng):
    header = _header(content)
    if rng.integers(2):
        header["shape"] = [10**12, header["shape"][1]]
    else:
        header["buffers"]["codes"][1] = 10**12
    _set_header(content, header)


def nan_scale(content, rng):
    mins, scales = _ranges(content)
    scales[rng.integers(scales.size)] = [np.nan, np.inf, -np.inf][rng.integers(3)]
    _set_ranges(content, mins, scales)


def bad_ranges_stream(content, rng):
    """A ranges stream that does not inflate to two float32 per row (or is not zlib)."""
    if "ranges" not in content["samples"]:
        return wrong_dtype(content, rng)
    mins, scales = _ranges(content)
    choice = rng.integers(3)
    if choice == 0:
        _set_ranges(content, mins[:-1], scales)  # one value short
    elif choice == 1:
        _set_ranges(content, np.concatenate([mins, mins[:1]]), scales)  # one value long
    else:
        data = bytearray(content["samples"]["ranges"].data)
        data[:2] = b"\x00\x00"  # not a zlib stream any more
        content["samples"]["ranges"] = _raw(bytes(data), "uint8")


def nan_compensation(content, rng):
    arr = content["compensation"]["values"]
    values = np.frombuffer(arr.data, dtype=arr.dtype).copy()
    values[rng.integers(values.size)] = np.nan
    content["compensation"]["values"] = _raw(values.tobytes(), arr.dtype)


def label_out_of_range(content, rng):
    counts = _info(content, "counts", "int64")
    from dq_flower.codecs.bitpack import pack, unpack

    labels = unpack(_info(content, "labels", "uint8"), int(counts[1]), int(counts[0]))
    labels[rng.integers(labels.size)] = int(rng.integers(10, 16))
    _set_info(content, "labels", pack(labels, int(counts[1])), "uint8")


def wrong_bits(content, rng):
    header = _header(content)
    header["meta"]["bits"] = int(rng.choice([0, 1, 3, 8, 9, -1]))
    _set_header(content, header)


def unknown_version(content, rng):
    record = ["samples", "compensation"][rng.integers(2)]
    header = _header(content, record)
    header["version"] = int(rng.choice([0, 2, 99]))
    _set_header(content, header, record)


def missing_key(content, rng):
    choice = rng.integers(6)
    if choice == 0:
        del content["samples"]
    elif choice == 1:
        del content["sample-info"]
    elif choice == 2:
        del content["metrics"]
    elif choice == 3:
        del content["sample-info"]["counts"]
    elif choice == 4:
        del content["samples"]["header"]
    else:
        del content["compensation"]


def duplicated_ids(content, rng):
    counts = _info(content, "counts", "int64")
    from dq_flower.codecs.bitpack import pack_wide, unpack_wide

    ids = unpack_wide(_info(content, "ids", "uint8"), int(counts[2]), int(counts[0]))
    i, j = rng.choice(ids.size, size=2, replace=False)
    ids[j] = ids[i]
    _set_info(content, "ids", pack_wide(ids, int(counts[2])), "uint8")


def bad_counts(content, rng):
    counts = _info(content, "counts", "int64")
    counts[int(rng.integers(4))] += int(rng.choice([-1, 1, 10**12]))
    _set_info(content, "counts", counts, "int64")


def bad_weights(content, rng):
    _set_info(content, "weights", [[np.nan, 0.0, -1.0, np.inf][rng.integers(4)]], "float32")


def bad_candidates(content, rng):
    content["metrics"] = MetricRecord({"num-examples": 10,
                                       "candidates": int(rng.choice([-1, 0, 3, 2**40]))})


def garbage_header(content, rng):
    content["samples"]["header"] = _raw(rng.bytes(int(rng.integers(0, 300))), "uint8")


MUTATIONS = [truncate, wrong_dtype, huge_declared_size, nan_scale, bad_ranges_stream,
             nan_compensation,
             label_out_of_range, wrong_bits, unknown_version, missing_key, duplicated_ids,
             bad_counts, bad_weights, bad_candidates, garbage_header]


@settings(max_examples=600, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32 - 1)),
                min_size=3, max_size=5),
       st.integers(0, len(GOOD) - 1))
def _fuzz_round(mutations, good_index):
    info = task_info(TASK)
    strategy = DQStrategy(build_model(TASK, info), seed=TASK.seed, config=CFG)
    request, content = GOOD[good_index]
    replies = [Message(_copy(content), reply_to=request)]
    for index, seed in mutations:
        corrupted = _copy(GOOD[(good_index + 1) % len(GOOD)][1])
        MUTATIONS[index](corrupted, np.random.default_rng(seed))
        replies.append(Message(corrupted, reply_to=_request_from(1000 + len(replies))))
    _COUNT["corrupted"] += len(mutations)

    arrays, metrics = strategy.aggregate_train(1, replies)

    assert metrics["rejected"] == len(mutations), [MUTATIONS[i].__name__ for i, _ in mutations]
    assert metrics["replies"] == 1
    assert metrics["stored"] == CFG.budget
    assert all(torch.isfinite(p).all() for p in strategy.model.parameters())


def test_the_good_replies_carry_coded_ranges():
    """The ranges mutations reach the coded ``ranges`` stream, the form the defaults send."""
    for _, content in GOOD:
        assert _header(content)["meta"].get("ranges") == "zlib"
        assert "ranges" in content["samples"] and "scales" not in content["samples"]


def test_fuzzed_replies_are_rejected_counted_and_harmless():
    _fuzz_round()
    assert _COUNT["corrupted"] >= 2000
