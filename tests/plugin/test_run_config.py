"""``from_run_config``: the app's ``[tool.flwr.app.config]`` drives every knob."""

from __future__ import annotations

import inspect

import pytest
import torch
from flwr.serverapp.strategy import FedAvg

import dq_flower
import dq_flower.config
import dq_flower.dq.config
from dq_flower.config import knobs_of


def model() -> torch.nn.Module:
    return torch.nn.Linear(4, 3)


RUN_CONFIG = {"num-server-rounds": 3, "learning-rate": 0.1, "local-epochs": 1}
APP_KEYS = ("learning-rate", "local-epochs")


def test_dq_strategy_reads_its_keys_and_passes_the_apps_own():
    s = dq_flower.DQStrategy.from_run_config(
        model(), {**RUN_CONFIG, "bits": 4, "scorer": "loss", "selection-rule": "sample",
                  "server-steps": 7, "fraction-evaluate": 0.5, "seed": 3}, app_keys=APP_KEYS)
    assert (s.cfg.bits, s.cfg.scorer, s.cfg.selection_rule, s.cfg.server_steps) == (
        4, "loss", "sample", 7)
    assert s.fraction_evaluate == 0.5 and s.seed == 3


def test_overrides_win_and_unset_keys_keep_their_defaults():
    s = dq_flower.DQStrategy.from_run_config(model(), {"bits": 4, "budget": 9}, bits=2)
    assert s.cfg.bits == 2 and s.cfg.budget == 9
    assert s.cfg.scorer == dq_flower.DQConfig().scorer


@pytest.mark.parametrize(("cls", "args", "config", "key"), [
    (dq_flower.DQStrategy, (), {"bits": "two"}, "bits"),
    (dq_flower.DQStrategy, (), {"scorer": 3}, "scorer"),
    (dq_flower.DQStrategy, (), {"fraction-evaluate": "half"}, "fraction-evaluate"),
    (dq_flower.GradientStrategy, (), {"local-steps": 1.5}, "local-steps"),
    (dq_flower.GradientStrategy, (), {"seed": "x"}, "seed"),
    (dq_flower.CompressedUpdates, (), {"levels": "one"}, "levels"),
    (dq_flower.CompressedUpdates, (), {"downlink": "fp8"}, "downlink"),
])
def test_a_value_of_the_wrong_type_fails_naming_its_key(cls, args, config, key):
    first = FedAvg() if cls is dq_flower.CompressedUpdates else model()
    with pytest.raises(ValueError, match=key):
        cls.from_run_config(first, {**RUN_CONFIG, **config}, app_keys=APP_KEYS)


def test_gradient_strategy_defaults_to_qsgd_and_reads_its_keys():
    assert dq_flower.GradientStrategy.from_run_config(
        model(), RUN_CONFIG, app_keys=APP_KEYS).cfg.codec == "qsgd"
    s = dq_flower.GradientStrategy.from_run_config(
        model(), {"codec": "topk", "ratio": 0.05, "local-steps": 2, "lr": 0.3,
                  "min-available-nodes": 2})
    assert (s.cfg.codec, s.cfg.ratio, s.cfg.local_steps, s.cfg.lr) == ("topk", 0.05, 2, 0.3)
    assert s.min_available_nodes == 2


def test_compressed_updates_reads_its_keys():
    s = dq_flower.CompressedUpdates.from_run_config(
        FedAvg(), {**RUN_CONFIG, "codec": "qsgd", "levels": 1, "bucket": 64,
                   "downlink": "fp16", "error-feedback": "on", "entropy-coder": "lzma"},
        app_keys=APP_KEYS)
    assert (s.cfg.codec, s.cfg.levels, s.cfg.bucket, s.cfg.downlink) == ("qsgd", 1, 64, "fp16")
    assert (s.cfg.error_feedback, s.cfg.entropy_coder) == ("on", "lzma")
    assert s.codec.levels == 1
    with pytest.raises(TypeError, match="codec="):
        dq_flower.CompressedUpdates(FedAvg())


def test_a_misspelled_knob_is_refused_naming_the_knob_it_is_close_to():
    with pytest.raises(ValueError, match="'bitz' is not a knob of DQStrategy \\(did you "
                                         "mean 'bits'"):
        dq_flower.DQStrategy.from_run_config(torch.nn.Linear(4, 2), {"bitz": 3})
    with pytest.raises(ValueError, match="did you mean 'min-gain'"):
        dq_flower.DQStrategy.from_run_config(torch.nn.Linear(4, 2), {"min_gian": 0.01})


@pytest.mark.parametrize("cls", [dq_flower.DQStrategy, dq_flower.GradientStrategy,
                                 dq_flower.CompressedUpdates])
def test_a_key_no_strategy_reads_is_refused_before_any_round(cls):
    first = FedAvg() if cls is dq_flower.CompressedUpdates else model()
    # checkpoint-dir is simulate's knob: in a user's app it would do nothing, silently
    with pytest.raises(ValueError, match=f"'checkpoint-dir' is not a knob of {cls.__name__} "
                                         r"\(no knob is spelled like it\); .*state_dict"):
        cls.from_run_config(first, {"checkpoint-dir": "ckpt"})
    with pytest.raises(ValueError, match=r"'seeds' is not a knob .*did you mean 'seed'"):
        cls.from_run_config(first, {"seeds": 3})


@pytest.mark.parametrize("cls", [dq_flower.DQStrategy, dq_flower.GradientStrategy,
                                 dq_flower.CompressedUpdates])
def test_a_key_neither_a_knob_nor_declared_by_the_app_is_refused(cls):
    first = FedAvg() if cls is dq_flower.CompressedUpdates else model()
    with pytest.raises(ValueError, match=f"^'learning-rate' is not a knob of {cls.__name__} "
                                         r"\(no knob is spelled like it\); if it is your "
                                         r"app's own key, pass app_keys=\['learning-rate'"):
        cls.from_run_config(first, RUN_CONFIG)
    with pytest.raises(ValueError, match=r"^'max-rounds' is not a knob "):
        cls.from_run_config(first, {"max-rounds": 3})
    read = cls.from_run_config(first, {**RUN_CONFIG, "seed": 4}, app_keys=APP_KEYS)
    assert read.cfg.seed == 4 if cls is dq_flower.CompressedUpdates else read.seed == 4


def test_every_unknown_key_is_named_at_once():
    # two typos in a pyproject took two failed runs: the first one was named alone
    with pytest.raises(ValueError, match=r"^'fraction-evalute' is not a knob of DQStrategy "
                                         r"\(did you mean 'fraction-evaluate'.* and 'bitz' is "
                                         r"not a knob of DQStrategy \(did you mean 'bits'"):
        dq_flower.DQStrategy.from_run_config(model(), {"fraction-evalute": 0.5, "bitz": 2})


def test_an_unknown_key_names_the_closest_knobs():
    with pytest.raises(ValueError, match=r"^'max-rounds' is not a knob of DQStrategy \(did "
                                         r"you mean 'max-failed-rounds' or 'max-growth'\?\)"):
        dq_flower.DQStrategy.from_run_config(model(), {"max-rounds": 3})


def test_the_apps_own_keys_pass_when_named():
    s = dq_flower.DQStrategy.from_run_config(
        torch.nn.Linear(4, 2), {"num-server-rounds": 3, "output-dir": "", "bits": 3,
                                "fraction_evaluate": 0.5}, app_keys=["output-dir"])
    assert s.cfg.bits == 3 and s.fraction_evaluate == 0.5


@pytest.mark.parametrize(("cls", "args_cls"), [
    (dq_flower.DQStrategy, dq_flower.dq.config.DQStrategyConfig),
    (dq_flower.GradientStrategy, dq_flower.config.StrategyConfig),
])
def test_the_strategy_arguments_are_knobs_with_the_signatures_defaults(cls, args_cls):
    params = inspect.signature(cls.__init__).parameters
    for name, found in knobs_of(args_cls).items():
        assert params[name].default == found.default, name
    read = cls.from_run_config(model(), {"seed": 7, "fraction-train": 0.5,
                                         "min-available-nodes": 2, "min-evaluate-nodes": 3})
    assert (read.seed, read.fraction_train, read.min_available_nodes,
            read.min_evaluate_nodes) == (7, 0.5, 2, 3)


@pytest.mark.parametrize(("kwargs", "key"), [
    ({"fraction_train": 0.0}, "fraction-train"), ({"fraction_evaluate": 1.5}, "fraction-evaluate"),
    ({"min_available_nodes": 0}, "min-available-nodes"), ({"num_classes": 0}, "num-classes"),
])
def test_a_bad_strategy_argument_fails_naming_its_key(kwargs, key):
    with pytest.raises(ValueError, match=f"^{key}: must be"):
        dq_flower.DQStrategy(model(), **kwargs)
    run_config = {k.replace("_", "-"): v for k, v in kwargs.items()}
    with pytest.raises(ValueError, match=f"^{key}: must be"):
        dq_flower.DQStrategy.from_run_config(model(), run_config)


def test_num_classes_is_read_from_the_run_config_by_dq_only():
    assert dq_flower.DQStrategy.from_run_config(model(), {"num-classes": 5}).num_classes == 5
    with pytest.raises(ValueError, match="^'num-classes' is not a knob of GradientStrategy"):
        dq_flower.GradientStrategy.from_run_config(model(), {"num-classes": 5})


PYPROJECT = """
[build-system]
requires = ["hatchling"]
build-backend = "hatchling.build"

[project]
name = "myapp"
version = "1.0.0"

[tool.flwr.app]
publisher = "me"

[tool.flwr.app.components]
serverapp = "myapp.server_app:app"
clientapp = "myapp.client_app:app"

[tool.flwr.app.config]
num-server-rounds = 3
codec = "qsgd"

[tool.flwr.app.config.codec-params]
levels = 1
bucket = 64
"""


def test_a_pyproject_table_of_codec_params_reaches_the_codec(tmp_path):
    from flwr.common.config import get_fused_config_from_dir

    (tmp_path / "pyproject.toml").write_text(PYPROJECT)
    run_config = get_fused_config_from_dir(tmp_path, {"codec-params.levels": 3})
    assert run_config["codec-params.levels"] == 3  # Flower flattened the table
    s = dq_flower.CompressedUpdates.from_run_config(FedAvg(), run_config)
    assert s.cfg.codec_params == {"levels": 3, "bucket": 64}
    assert (s.codec.levels, s.codec.bucket) == (3, 64)


def test_a_key_the_app_declares_its_own_is_not_read_as_a_knob_of_its_name():
    # the app's own "lr" (its nodes' step size) was read as DQ's server lr, declared or not
    mine = dq_flower.DQStrategy.from_run_config(model(), {"lr": 0.3}, app_keys=["lr"])
    theirs = dq_flower.DQStrategy.from_run_config(model(), {"lr": 0.3})
    assert mine.cfg.lr == dq_flower.DQStrategy(model()).cfg.lr != 0.3 and theirs.cfg.lr == 0.3
