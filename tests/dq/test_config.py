import pytest

from dq_flower.codecs.params import parse_params
from dq_flower.config import read, write
from dq_flower.dq.config import DQConfig
from dq_flower.harness.task_config import TaskConfig


def test_hyphenated_keys_map_to_fields_and_coerce():
    cfg = read(DQConfig, {"server-steps": 7.0, "bits": 3, "stochastic": 0,
                                  "other-method-knob": 1})
    assert cfg.server_steps == 7 and cfg.bits == 3 and cfg.stochastic is False


@pytest.mark.parametrize(
    ("mapping", "key"),
    [({"bits": 9}, "bits"), ({"bits": -1}, "bits"), ({"budget": 0}, "budget"),
     ({"selection-rule": "best"}, "selection-rule"), ({"lr": -1.0}, "lr"),
     ({"server-steps": 1.5}, "server-steps"), ({"compensation": "nope"}, "compensation")],
)
def test_bad_values_name_their_key(mapping, key):
    with pytest.raises(ValueError, match=key):
        read(DQConfig, mapping)


def test_task_config_validation():
    with pytest.raises(ValueError, match="partition"):
        TaskConfig(partition="shards")
    with pytest.raises(ValueError, match="fraction-train"):
        TaskConfig(fraction_train=0.0)


def test_strict_mode_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown knob 'nope' \\(no knob is spelled like it"):
        read(TaskConfig, {"nope": 1}, strict=True)


def test_parse_params_and_config_record_round_trip():
    assert parse_params("levels=4, bucket=512,clip=2.5,flag=true") == {
        "levels": 4, "bucket": 512, "clip": 2.5, "flag": True}
    with pytest.raises(ValueError):
        parse_params("levels")
    record = write(TaskConfig(num_partitions=3), changed_only=True)
    assert record == {"num-partitions": 3}  # defaults are left out
    assert read(TaskConfig, record) == TaskConfig(num_partitions=3)
    full = write(TaskConfig(num_partitions=3))
    assert full["dataset"] == "digits" and full["num-partitions"] == 3


def test_device_knob():
    import torch

    from dq_flower.model_ops import resolve_device

    with pytest.raises(ValueError, match="device"):
        TaskConfig(device="tpu")
    assert resolve_device("cpu").type == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto").type == "cpu"
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda")


def test_codec_params_are_a_typed_mapping_from_any_of_its_spellings():
    from dq_flower.baselines.config import GradientConfig
    from dq_flower.codecs.params import CodecParams

    given = {"levels": 4, "bucket": 512}
    assert CodecParams(given) == CodecParams("levels=4,bucket=512") == given
    assert str(CodecParams(given)) == "levels=4,bucket=512"  # what a ConfigRecord carries
    assert CodecParams(None) == CodecParams("") == {} and not CodecParams()
    assert hash(CodecParams(given)) == hash(CodecParams({"bucket": 512, "levels": 4}))
    as_dict = GradientConfig(codec="qsgd", codec_params=given)
    as_text = GradientConfig(codec="qsgd", codec_params="levels=4,bucket=512")
    as_table = read(GradientConfig, {"codec": "qsgd", "codec-params.levels": 4,
                                             "codec-params.bucket": 512})
    assert as_dict == as_text == as_table and as_table.codec_params == given
    record = write(as_table, changed_only=True)  # to the clients: the text, read back equal
    assert record["codec-params"] == "levels=4,bucket=512"
    assert read(GradientConfig, record) == as_table


@pytest.mark.parametrize(("mapping", "message"), [
    ({"codec-params": "levels"}, "^codec-params: expected 'name=value,...', got 'levels'"),
    ({"codec-params": {"levels": [1]}}, "^codec-params: parameter 'levels': expected a number"),
    ({"codec-params": "levels=2", "codec-params.bucket": 64}, "given both as text and as"),
    ({"levels.x": 1}, "'levels' is not a table of parameters"),
    ({"codec-params.levels": 0, "codec": "qsgd"}, "codec-params"),
])
def test_bad_codec_params_fail_naming_their_key(mapping, message):
    from dq_flower.baselines.config import GradientConfig

    with pytest.raises(ValueError, match=message):
        read(GradientConfig, mapping)


def test_a_strategys_run_config_takes_a_table_of_codec_params():
    import torch

    import dq_flower
    import dq_flower.codecs

    s = dq_flower.DQStrategy.from_run_config(
        torch.nn.Linear(4, 2), {"compensation": "qsgd", "compensation-params.levels": 2,
                                "compensation-params.bucket": 64})
    assert s.cfg.compensation_params == {"levels": 2, "bucket": 64}
    assert dq_flower.codecs.make(s.cfg.compensation, **s.cfg.compensation_kwargs).levels == 2


def test_simulate_takes_codec_params_as_a_dict_and_passes_flowers_flat_keys():
    from dq_flower.harness.methods import validate_run_config
    from dq_flower.harness.simulate import build_run_config

    run_config = build_run_config("dq", compensation="qsgd",
                                  compensation_params={"levels": 2, "bucket": 64})
    assert run_config["compensation-params.levels"] == 2  # scalars only, as Flower's
    assert all(not isinstance(v, dict) for v in run_config.values())
    _, knobs = validate_run_config(run_config)
    assert knobs.compensation_params == {"levels": 2, "bucket": 64}
    with pytest.raises(ValueError, match="compensation-params: parameter 'levels'"):
        build_run_config("dq", compensation="qsgd", compensation_params={"levels": [2]})


def test_the_auto_knobs_read_auto_from_a_run_config():
    # the log says "bits auto", and `bits = "auto"` in a pyproject stopped the ServerApp
    # ("bits: expected an integer, got 'auto'"), as did server-threads and max-abs-value
    import pytest
    from torch import nn

    from dq_flower import DQStrategy

    model = nn.Linear(4, 2)
    auto = DQStrategy.from_run_config(model, {"bits": "auto", "server-threads": "auto",
                                              "max-abs-value": "auto"})
    assert (auto.cfg.bits, auto.cfg.server_threads, auto.cfg.max_abs_value) == (4, 0, 0.0)
    assert DQStrategy.from_run_config(model, {"bits": 3}).cfg.bits == 3
    with pytest.raises(ValueError, match="bits"):
        DQStrategy.from_run_config(model, {"bits": "automatic"})
