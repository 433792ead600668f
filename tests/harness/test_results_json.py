"""Results files are strict JSON: a round without a loss is ``null``, read back as nan."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dq_flower.harness.history import RunResult
from dq_flower.json_out import strict_dumps


def _refuse_constant(name):
    raise ValueError(f"not strict JSON: {name}")


def test_a_run_whose_round_trained_nothing_saves_strict_json_and_loads_its_nan(tmp_path):
    row = {"round": 2, "accuracy": 0.8, "loss": float("nan"), "up_bytes": 0, "down_bytes": 9,
           "cum_up_bytes": 5, "cum_down_bytes": 18, "wall_s": np.float32(1.5)}
    result = RunResult("dq", {"lr": 0.1}, [row], num_params=10, data_dim=4)
    path = result.save(tmp_path / "run.json")
    text = path.read_text()
    data = json.loads(text, parse_constant=_refuse_constant)  # NaN/Infinity would raise
    assert data["history"][0]["loss"] is None and data["history"][0]["wall_s"] == 1.5
    loaded = RunResult.load(path)
    assert math.isnan(loaded.history[0]["loss"]) and loaded.history[0]["accuracy"] == 0.8


def test_strict_dumps_turns_every_non_finite_number_into_null():
    text = strict_dumps({"a": [float("inf"), -float("inf"), np.float64("nan"), 1.0]})
    assert json.loads(text, parse_constant=_refuse_constant) == {"a": [None, None, None, 1.0]}
    with pytest.raises(ValueError):
        json.dumps({"a": float("nan")}, allow_nan=False)  # what strict_dumps avoids
