from pathlib import Path

import tomllib

from dq_flower.config import field_keys
from dq_flower.harness.methods import get_method, method_names
from dq_flower.harness.server_app import validate_run_config
from dq_flower.harness.task_config import TaskConfig

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _config():
    return tomllib.loads(PYPROJECT.read_text())["tool"]["flwr"]["app"]["config"]


def test_every_run_config_key_is_a_known_knob():
    known = field_keys(TaskConfig) | {"method", "results-path"}
    for name in method_names():
        known |= field_keys(get_method(name).config_cls)
    assert set(_config()) - known == set()


def test_run_config_validates_for_every_method():
    for name in method_names():
        task, knobs = validate_run_config({**_config(), "method": name})
        assert task.dataset == "digits"


def test_every_knob_is_listed_so_flwr_run_can_override_it():
    # `flwr run --run-config` rejects keys that pyproject.toml does not list; the method's
    # own choices (codec) and the step sizes whose defaults differ by method are left out on
    # purpose, since one listed value would override every method's default
    per_method = {"codec", "optimizer", "lr", "momentum", "weight-decay"}
    known = field_keys(TaskConfig)
    for name in method_names():
        known |= field_keys(get_method(name).config_cls)
    assert known - set(_config()) == per_method
