import pytest

from dq_flower.config import from_mapping, parse_params, to_config_record
from dq_flower.dq.config import DQConfig
from dq_flower.harness.task_config import TaskConfig


def test_hyphenated_keys_map_to_fields_and_coerce():
    cfg = from_mapping(DQConfig, {"server-steps": "7", "bits": 3, "stochastic": "false",
                                  "other-method-knob": 1})
    assert cfg.server_steps == 7 and cfg.bits == 3 and cfg.stochastic is False


@pytest.mark.parametrize(
    ("mapping", "key"),
    [({"bits": 9}, "bits"), ({"bits": 0}, "bits"), ({"budget": 0}, "budget"),
     ({"selection-rule": "best"}, "selection-rule"), ({"lr": -1.0}, "lr"),
     ({"server-steps": 1.5}, "server-steps"), ({"compensation": "nope"}, "compensation")],
)
def test_bad_values_name_their_key(mapping, key):
    with pytest.raises(ValueError, match=key):
        from_mapping(DQConfig, mapping)


def test_task_config_validation():
    with pytest.raises(ValueError, match="partition"):
        TaskConfig(partition="shards")
    with pytest.raises(ValueError, match="fraction-train"):
        TaskConfig(fraction_train=0.0)


def test_strict_mode_rejects_unknown_keys():
    with pytest.raises(ValueError, match="unknown config key 'nope'"):
        from_mapping(TaskConfig, {"nope": 1}, strict=True)


def test_parse_params_and_config_record_round_trip():
    assert parse_params("levels=4, bucket=512,clip=2.5,flag=true") == {
        "levels": 4, "bucket": 512, "clip": 2.5, "flag": True}
    with pytest.raises(ValueError):
        parse_params("levels")
    record = to_config_record(TaskConfig(num_partitions=3))
    assert dict(record.items()) == {"num-partitions": 3}  # defaults are left out
    assert from_mapping(TaskConfig, dict(record.items())) == TaskConfig(num_partitions=3)
    full = to_config_record(TaskConfig(num_partitions=3), changed_only=False)
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


def test_params_text_is_the_inverse_of_parse_params():
    from dq_flower.config import params_text

    assert params_text({"levels": 4, "bucket": 512}) == "levels=4,bucket=512"
    assert parse_params(params_text({"levels": 4, "bucket": 512})) == {"levels": 4, "bucket": 512}
    assert params_text("levels=1") == "levels=1"
    assert params_text(None) is None


def test_given_knobs_adds_the_named_ones_that_are_set_after_the_others():
    from dq_flower.config import given_knobs

    out = given_knobs({"seed": 1}, codec="qsgd", lr=None, local_steps=2)
    assert out == {"seed": 1, "codec": "qsgd", "local_steps": 2}
    assert list(out) == ["seed", "codec", "local_steps"]


def test_a_choice_knob_names_the_key_and_the_choices():
    with pytest.raises(ValueError, match=r"^scorer: must be one of \('auto', 'uniform', "
                                         r"'loss', 'gradnorm', 'entropy', 'margin'\), "
                                         r"got 'lossy'$"):
        DQConfig(scorer="lossy")


def test_the_start_up_log_names_only_the_knobs_that_differ_from_their_defaults(caplog):
    import logging

    import torch

    import dq_flower

    caplog.set_level(logging.INFO)
    dq_flower.DQStrategy(torch.nn.Linear(3, 2), bits=3, scorer="loss").summary()
    dq_flower.DQStrategy(torch.nn.Linear(3, 2)).summary()
    lines = [r.getMessage() for r in caplog.records if "knobs:" in r.getMessage()]
    assert lines[0].endswith("knobs: bits=3, scorer='loss'")
    assert lines[1].endswith("knobs: defaults")
    assert all(len(line) < 120 for line in lines)


@pytest.mark.parametrize(("mapping", "key", "words"), [
    ({"score-threshold": float("nan")}, "score-threshold", "a finite float"),
    ({"lr": float("inf")}, "lr", "a finite float"),
    ({"resend": "yes"}, "resend", "true or false"),
    ({"stochastic": 2}, "stochastic", "true or false"),
    ({"stochastic": "1"}, "stochastic", "true or false"),
])
def test_non_finite_floats_and_non_boolean_booleans_are_refused(mapping, key, words):
    with pytest.raises(ValueError, match=f"'{key}': expected {words}"):
        from_mapping(DQConfig, mapping)


def test_a_client_refuses_a_round_config_with_a_nan_threshold_before_any_work():
    import numpy as np
    from flwr.app import ConfigRecord, Context, Message, MessageType, RecordDict

    from dq_flower.client import dq_train
    from dq_flower.harness.inprocess import InProcessGrid
    InProcessGrid(lambda m, c: m, 1)  # a server identity for the message below
    cfg = ConfigRecord({"server-round": 1, "round-seed": 7, "budget": 5,
                        "score-threshold": float("nan"), "selection-rule": "threshold"})
    msg = Message(RecordDict({"config": cfg}), dst_node_id=1, message_type=MessageType.TRAIN)
    context = Context(run_id=1, node_id=1, state=RecordDict(), run_config={},
                      node_config={"partition-id": 0})
    data = (np.zeros((10, 4), dtype=np.float32), np.zeros(10, dtype=np.int64))
    with pytest.raises(ValueError, match="'score-threshold': expected a finite float"):
        dq_train(msg, context, data)
