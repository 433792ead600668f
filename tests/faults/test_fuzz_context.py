"""Fuzz DQ replies whose samples are coded with the ``context`` coder.

Good replies of a ``context``-coded round, corrupted by the DQ fuzz test's mutations plus
ones aimed at the context stream (bit flips, cut or appended 32-bit words, a bad
``context_shape``): each must be rejected and counted, the good reply used, the model finite.
"""

import numpy as np
import pytest
import torch
from flwr.app import Message
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info

from .test_fuzz_dq import (
    TASK,
    _copy,
    _header,
    _raw,
    _request_from,
    _set_header,
    bad_counts,
    bad_ranges_stream,
    garbage_header,
    huge_declared_size,
    label_out_of_range,
    nan_scale,
    wrong_bits,
)

CFG = DQConfig(budget=16, server_steps=1, entropy_coder="context", min_holdout_rows=0)


def _good_replies():
    strategy = DQStrategy(build_model(TASK, task_info(TASK)), seed=TASK.seed, config=CFG)
    grid = InProcessGrid(client_app, 4)
    messages = strategy.configure_train(1, None, client_task_config(TASK, "dq"), grid)
    replies = grid.send_and_receive(messages)
    assert not any(r.has_error() for r in replies)
    return [(r, r.content) for r in replies]


GOOD = _good_replies()


def flip_stream_bit(content, rng):
    data = bytearray(content["samples"]["codes"].data)
    data[int(rng.integers(len(data)))] ^= 1 << int(rng.integers(8))
    content["samples"]["codes"] = _raw(bytes(data), "uint8")


def cut_or_extend_stream(content, rng):
    data = bytes(content["samples"]["codes"].data)
    data = data[:-4] if rng.integers(2) else data + data[:4]
    content["samples"]["codes"] = _raw(data, "uint8")
    header = _header(content)
    header["buffers"]["codes"][1] = len(data)
    header["nbits"] = header["nbits"] + 8 * (len(data) - len(content["samples"]["codes"].data))
    _set_header(content, header)


def bad_context_shape(content, rng):
    header = _header(content)
    header["meta"]["context_shape"] = ["1x9x9", "0x8x8", "x", "1x1x99999"][rng.integers(4)]
    _set_header(content, header)


# (the DQ test's ``truncate`` and ``missing_key`` also pick the compensation, absent here)
MUTATIONS = [flip_stream_bit, cut_or_extend_stream, bad_context_shape, huge_declared_size,
             nan_scale, bad_ranges_stream, label_out_of_range, wrong_bits, bad_counts,
             garbage_header]
_COUNT = {"corrupted": 0}


def test_the_good_replies_are_context_coded():
    for _, content in GOOD:
        assert _header(content)["meta"]["entropy"] == "context"


@settings(max_examples=120, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(MUTATIONS) - 1), st.integers(0, 2**32 - 1)),
                min_size=3, max_size=5),
       st.integers(0, len(GOOD) - 1))
def _fuzz_round(mutations, good_index):
    _check_round(mutations, good_index)


def _check_round(mutations, good_index):
    """One round: a good reply and the ``(mutation, seed)`` corruptions of another one."""
    strategy = DQStrategy(build_model(TASK, task_info(TASK)), seed=TASK.seed, config=CFG)
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


@pytest.mark.slow
def test_fuzzed_context_replies_are_rejected_counted_and_harmless():
    _fuzz_round()
    assert _COUNT["corrupted"] >= 400


def test_seeded_context_corruptions_are_rejected():
    """The fast variant (CI): 30 seeded corruptions, every mutation at least three times."""
    rng = np.random.default_rng(2024)
    order = [i % len(MUTATIONS) for i in range(30)]
    for start in range(0, 30, 3):
        mutations = [(i, int(rng.integers(2**32))) for i in order[start:start + 3]]
        _check_round(mutations, start // 3 % len(GOOD))
