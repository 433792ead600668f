"""One rule says which knobs travel to the clients: the ``client_knob`` field metadata."""

from __future__ import annotations

import pytest

from dq_flower.baselines.config import GradientConfig
from dq_flower.compression.config import MESSAGE_PREFIX, CompressionConfig
from dq_flower.config import client_keys, field_keys
from dq_flower.dq.config import CLIENT_KEYS, DQConfig
from dq_flower.harness.task_config import CLIENT_TASK_KEYS, TaskConfig


@pytest.mark.parametrize("cls", [DQConfig, GradientConfig, CompressionConfig, TaskConfig])
def test_the_robust_aggregation_knobs_stay_on_the_server(cls):
    travels = set(client_keys(cls))
    assert travels < field_keys(cls)
    assert not travels & {"clip-factor", "weight-cap", "min-cosine", "checkpoint-dir",
                          "max-failed-rounds", "optimizer", "server-steps", "lr"} - (
        {"lr"} if cls is GradientConfig else set())  # a gradient client steps with lr


def test_the_exported_key_lists_are_the_marked_fields():
    assert client_keys(DQConfig) == CLIENT_KEYS and "bits" in CLIENT_KEYS
    assert client_keys(TaskConfig) == CLIENT_TASK_KEYS and "dataset" in CLIENT_TASK_KEYS


def test_the_wrapper_sends_its_client_knobs_only():
    cfg = CompressionConfig(codec="qsgd", levels=1, clip_factor=1.0, weight_cap=3.0)
    sent = cfg.message_config()
    assert f"{MESSAGE_PREFIX}levels" in sent and f"{MESSAGE_PREFIX}clip-factor" not in sent
    assert CompressionConfig.from_message_config(
        {**sent, f"{MESSAGE_PREFIX}weight-cap": 99.0}).weight_cap == 10.0  # not read back
