"""DQ says once where its samples outweigh FedAvg's uplink over the run.

A logistic regression of 62 weights on 50,000 rows a node cost DQ 3.9 times FedAvg's
uplink (40,143 B against 10,368) without a word in the log. ``upload-all`` sends every row in
round 1: it was said there against one round of FedAvg's updates, not the run's.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord
from sklearn.datasets import load_breast_cancer
from torch import nn

import dq_flower
from dq_flower.harness.inprocess import InProcessGrid

X, Y = load_breast_cancer(return_X_y=True)
X = ((X - X.mean(0)) / X.std(0)).astype(np.float32)


def _said(model: nn.Module, caplog, rounds: int = 3, **knobs) -> list[str]:
    def train(msg, context):
        part = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (X[part::4], Y[part::4]))

    with caplog.at_level(logging.INFO, logger="flwr"):
        dq_flower.DQStrategy(model, seed=0, **knobs).start(
            grid=InProcessGrid(train, 4), num_rounds=rounds,
            initial_arrays=ArrayRecord(model.state_dict()))
    return [r.getMessage() for r in caplog.records if "outweigh" in r.getMessage()]


def test_a_model_smaller_than_its_samples_is_said_once(caplog):
    torch.manual_seed(0)
    said = _said(nn.Linear(30, 2), caplog)
    assert len(said) == 1
    page = " ".join((Path(__file__).parents[2] / "docs" / "plugin.md").read_text().split())
    quoted = page.split("FedAvg's uplink over the run's rounds")[1].split("`")[1]
    assert quoted in said[0] and "over 3 rounds (2,976 B)" in quoted  # the page quotes it


def test_a_model_larger_than_its_samples_is_not(caplog):
    torch.manual_seed(0)
    assert not _said(nn.Sequential(nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2)), caplog)


def test_upload_all_is_weighed_against_the_runs_updates_not_one_rounds(caplog):
    """All 569 rows (7,921 B) in round 1: above one round's 992 B, below 12 rounds' 11,904 B."""
    torch.manual_seed(0)
    assert not _said(nn.Linear(30, 2), caplog, rounds=12, upload_schedule="all")
    caplog.clear()
    torch.manual_seed(0)
    said = _said(nn.Linear(30, 2), caplog, rounds=5, upload_schedule="all")
    assert len(said) == 1 and "(7,921 B) outweigh" in said[0] and "(4,960 B)" in said[0]
