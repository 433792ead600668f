"""DQ's every upload takes ``entropy-coder``: the compensation and the gradient rounds'
gradients too (unless their params say otherwise)."""

from __future__ import annotations

import pytest

from dq_flower.codecs.lossless import STREAM
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.strategy import DQStrategy
from dq_flower.harness.client_app import app as client_app
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.harness.methods import client_task_config
from dq_flower.harness.runtime import build_model, task_info
from dq_flower.harness.task_config import TaskConfig
from dq_flower.wire.dq_batch import GRADIENT_KEY

TASK = TaskConfig(num_partitions=2, model="logreg", seed=3)


def _reply_record(config: DQConfig, key: str):
    strategy = DQStrategy(build_model(TASK, task_info(TASK)), seed=TASK.seed, config=config)
    grid = InProcessGrid(client_app, 2)
    messages = strategy.configure_train(1, None, client_task_config(TASK, "dq"), grid)
    reply = grid.send_and_receive(messages)[0]
    assert not reply.has_error()
    return reply.content[key]


@pytest.mark.parametrize(("knobs", "key"), [
    (dict(compensation="qsgd", compensation_params="levels=4"), "compensation"),
    (dict(upload_mode="gradient"), GRADIENT_KEY),
])
def test_compensation_and_gradient_uploads_are_entropy_coded_like_the_samples(knobs, key):
    coded = _reply_record(DQConfig(entropy_coder="zlib", **knobs), key)
    raw = _reply_record(DQConfig(entropy_coder="none", **knobs), key)
    assert STREAM in coded and STREAM not in raw
    assert DQConfig(entropy_coder="lzma", **knobs).compensation_kwargs["entropy"] == "lzma"
    # an explicit entropy= in the params wins over entropy-coder
    params = "compensation_params" if key == "compensation" else "gradient_codec_params"
    plain = _reply_record(DQConfig(entropy_coder="zlib", **{
        **knobs, params: (knobs.get(params, "") + ",entropy=none").lstrip(",")}), key)
    assert STREAM not in plain
