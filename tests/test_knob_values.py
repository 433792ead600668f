"""Knob values: one type rule for keyword arguments and run configs, and upper bounds.

A value is checked where the config is built, naming its key, never later inside Flower's
serializer, a process spawn or a wait.
"""

from __future__ import annotations

import dataclasses
import typing

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord
from flwr.serverapp.strategy import FedAvg

import dq_flower
from dq_flower.baselines.config import FedAvgConfig, GradientConfig
from dq_flower.codecs import make, names
from dq_flower.codecs.registry import codec_class
from dq_flower.compression.config import CompressionConfig
from dq_flower.config import (
    INT_RANGE,
    OptimizerConfig,
    RobustConfig,
    StrategyConfig,
    kind_of,
    knob_of,
    knobs_of,
    read,
)
from dq_flower.dq.config import DQConfig, DQStrategyConfig
from dq_flower.harness.methods import get_method, method_names
from dq_flower.harness.task_config import TaskConfig

#: Every config class with integer knobs (RobustConfig's and OptimizerConfig's are floats).
CONFIGS = (DQConfig, DQStrategyConfig, StrategyConfig, GradientConfig, FedAvgConfig,
           CompressionConfig, TaskConfig)


def model() -> torch.nn.Module:
    return torch.nn.Linear(4, 3)


def _build(cls: type, name: str, value: object) -> object:
    base = {"codec": "qsgd"} if cls is CompressionConfig else {}
    return cls(**{**base, name: value})


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"bits": 2.5}, "bits"), ({"bits": "2"}, "bits"), ({"dither": "yes"}, "dither"),
    ({"stochastic": "false"}, "stochastic"), ({"lr": "0.1"}, "lr"),
    ({"lr": float("inf")}, "lr"), ({"scorer": 3}, "scorer"),
])
def test_keyword_arguments_and_run_configs_refuse_the_same_values(kwargs, key):
    run_config = {k.replace("_", "-"): v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=f"^{key}: expected"):
        DQConfig(**kwargs)
    with pytest.raises(ValueError, match=f"^{key}: expected"):
        read(DQConfig, run_config)
    with pytest.raises(ValueError, match=f"^{key}: expected"):
        dq_flower.DQStrategy.from_run_config(model(), run_config)


def test_whole_numbers_numpy_scalars_and_paths_are_taken_as_their_type(tmp_path):
    cfg = DQConfig(budget=64.0, dither=1, lr=1, store_dir=tmp_path)
    assert (cfg.budget, cfg.dither, cfg.lr, cfg.store_dir) == (64, True, 1.0, str(tmp_path))
    assert type(cfg.budget) is int and type(cfg.lr) is float
    cfg = DQConfig(budget=np.int64(8), dither=np.bool_(True), lr=np.float32(0.5))
    assert (cfg.budget, cfg.dither, cfg.lr) == (8, True, 0.5)
    assert (type(cfg.budget), type(cfg.dither), type(cfg.lr)) == (int, bool, float)


@pytest.mark.parametrize("cls", CONFIGS)
def test_every_integer_knob_holds_what_a_config_record_carries(cls):
    """A 64-bit integer at most; a float only where it is exactly a whole number."""
    hints = typing.get_type_hints(cls)
    ints = [name for name, found in knobs_of(cls).items()
            if found.coerce is None and kind_of(hints[name]) is int]
    assert ints
    for name in ints:
        key = name.replace("_", "-")
        for value in (INT_RANGE[1] + 1, INT_RANGE[0] - 1, 1e300, 2.0**60):
            with pytest.raises(ValueError, match=f"^{key}: "):
                _build(cls, name, value)
    ConfigRecord({"x": INT_RANGE[1]})  # what the bound is: Flower's own limit


@pytest.mark.parametrize(("build", "key"), [
    (lambda: dq_flower.DQStrategy(model(), budget=1e300), "budget"),
    (lambda: dq_flower.DQStrategy(model(), budget=10**18), "budget"),
    (lambda: dq_flower.DQStrategy(model(), num_classes=10**18), "num-classes"),
    (lambda: dq_flower.DQStrategy(model(), server_processes=10**18), "server-processes"),
    (lambda: dq_flower.DQStrategy(model(), min_available_nodes=10**18),
     "min-available-nodes"),
    (lambda: dq_flower.DQStrategy(model(), min_available_nodes=1e300), "min-available-nodes"),
    (lambda: dq_flower.DQStrategy(model(), seed=2.5), "seed"),
    (lambda: dq_flower.GradientStrategy(model(), local_steps=10**18), "local-steps"),
    (lambda: dq_flower.GradientStrategy(model(), min_available_nodes=10**18),
     "min-available-nodes"),
    (lambda: dq_flower.CompressedUpdates(FedAvg(), codec="qsgd", seed=1e300), "seed"),
    (lambda: dq_flower.CompressedUpdates.from_run_config(
        FedAvg(), {"codec": "qsgd", "seed": 2**63}), "seed"),
    (lambda: dq_flower.DQStrategy.from_run_config(model(), {"num-classes": 10**18}),
     "num-classes"),
    (lambda: dq_flower.GradientStrategy.from_run_config(model(), {"local-steps": 10**9}),
     "local-steps"),
])
def test_a_huge_value_is_refused_at_construction_naming_its_key(build, key):
    with pytest.raises(ValueError, match=f"^{key}: (must be|expected)"):
        build()


def test_the_largest_allowed_values_are_accepted():
    strategy = dq_flower.DQStrategy(model(), budget=2**31 - 1, num_classes=1_000_000,
                                    server_processes=256, min_available_nodes=1_000_000)
    assert strategy.cfg.budget == 2**31 - 1 and strategy.min_available_nodes == 1_000_000
    assert GradientConfig(local_steps=1_000_000).local_steps == 1_000_000


def test_a_simulation_refuses_more_replies_than_its_nodes_can_send():
    """The server would wait an hour for the third node of two."""
    from dq_flower.harness.simulate import build_run_config

    with pytest.raises(ValueError, match="^min-available: 3 replies a round cannot come from "
                                         "2 nodes"):
        build_run_config("dq", num_clients=2, min_available=3)
    assert build_run_config("dq", num_clients=2, min_available=2)["min-available"] == 2


#: Values a run config or a caller may give any knob: wrong types, out of range, "not set".
PROBES = (2.5, 2, "2", "yes", True, -1, 0, 10**19, float("inf"), None, "", "auto",
          {"levels": 2}, [1])


def _outcome(build, *args):
    try:
        return build(*args)
    except (ValueError, TypeError) as exc:
        return f"{type(exc).__name__}: {exc}"


@pytest.mark.parametrize("cls", [*CONFIGS, OptimizerConfig, RobustConfig,
                                 *(get_method(m).config_cls for m in method_names())],
                         ids=lambda c: c.__name__)
def test_direct_construction_refuses_what_the_run_config_reader_refuses(cls):
    """One coercion, in the knob: ``cls(bits=2.5)`` fails as ``bits = 2.5`` in a run config
    does, with the same message, and a value both take builds the same config."""
    base = {"codec": "qsgd"} if issubclass(cls, CompressionConfig) else {}
    refused = 0
    for name, found in knobs_of(cls).items():
        for value in PROBES:
            direct = _outcome(lambda kwargs: cls(**kwargs), {**base, name: value})
            read_back = _outcome(read, cls, {**base, found.key: value})
            assert direct == read_back, (name, value)
            refused += isinstance(direct, str)
    assert refused > len(knobs_of(cls))  # the probes do find refusals


def test_every_codec_parameter_is_a_knob():
    """A codec's parameters are coerced and checked by their knobs, none by hand."""
    for name in names():
        codec = codec_class(name)
        if dataclasses.is_dataclass(codec):
            plain = [f.name for f in dataclasses.fields(codec)
                     if f.init and knob_of(codec, f.name) is None]
            assert not plain, (name, plain)
    with pytest.raises(ValueError, match=r"^ratio must be a number in \(0, 1\], got 2$"):
        make("topk", ratio=2)
    with pytest.raises(ValueError, match="^bits must be an integer in 1..8, got 2.5$"):
        make("uniform", bits=2.5)
    with pytest.raises(ValueError, match="^clip must be a finite number > 0"):
        make("terngrad", clip=float("nan"))
    assert make("terngrad", clip=2).clip == 2 and type(make("topk", ratio=1).ratio) is int
