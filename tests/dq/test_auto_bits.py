"""``bits = 0`` (auto): 4 bits per feature for small tables, 2 for everything else."""

import torch
from torch import nn

import dq_flower
from dq_flower.dq.config import auto_bits
from dq_flower.model_inputs import input_width
from dq_flower.wire.dq_batch import DataSpec


def test_the_rule_reads_the_flat_width():
    assert [auto_bits(d) for d in (13, 30, 63, 64, 784, None)] == [4, 4, 4, 2, 2, 2]


def test_the_strategy_resolves_auto_from_the_model_or_the_spec():
    table = nn.Sequential(nn.Linear(13, 16), nn.ReLU(), nn.Linear(16, 3))
    assert input_width(table) == 13
    assert dq_flower.DQStrategy(table).cfg.bits == 4
    image = nn.Sequential(nn.Flatten(), nn.Linear(784, 10))
    assert dq_flower.DQStrategy(image).cfg.bits == 2
    conv = nn.Sequential(nn.Conv2d(1, 4, 3), nn.Flatten(), nn.Linear(4 * 26 * 26, 10))
    assert input_width(conv) is None and dq_flower.DQStrategy(conv).cfg.bits == 2
    # a given spec decides: flat 13 features, or the same 64 values as an 8x8 image
    assert dq_flower.DQStrategy(table, data_spec=DataSpec((13,), "class", 1)).cfg.bits == 4
    flat_in = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    assert dq_flower.DQStrategy(flat_in, data_spec=DataSpec((1, 8, 8), "class", 1)
                                ).cfg.bits == 2


def test_a_table_normalised_by_the_first_layer_is_still_a_table():
    """A model that starts with ``BatchNorm1d`` (or ``LayerNorm``) on a table's columns got 2
    bits, as for images: its first layer was not linear."""
    normed = nn.Sequential(nn.BatchNorm1d(30), nn.Linear(30, 64), nn.ReLU(), nn.Linear(64, 2))
    assert input_width(normed) == 30 and dq_flower.DQStrategy(normed).cfg.bits == 4
    assert input_width(nn.Sequential(nn.LayerNorm(13), nn.Linear(13, 3))) == 13
    assert input_width(nn.Sequential(nn.BatchNorm1d(30, affine=False), nn.Linear(30, 2))) == 30
    # sensor windows (N, 6, 128): the normalised channels are not the features a sample
    windows = nn.Sequential(nn.BatchNorm1d(6), nn.Conv1d(6, 8, 5), nn.Flatten(),
                            nn.Linear(8 * 124, 6))
    assert input_width(windows) is None and dq_flower.DQStrategy(windows).cfg.bits == 2
    sequence = nn.Sequential(nn.LayerNorm(16), nn.Linear(32, 2))  # widths that do not match
    assert input_width(sequence) is None


def test_given_bits_are_used_as_given():
    table = nn.Linear(13, 3)
    assert dq_flower.DQStrategy(table, bits=2).cfg.bits == 2
    assert dq_flower.DQStrategy(table, bits=8).cfg.bits == 8


def test_the_clients_are_sent_the_resolved_bits():
    from flwr.app import ArrayRecord, ConfigRecord

    from dq_flower.harness.inprocess import InProcessGrid

    table = nn.Linear(13, 3)
    strategy = dq_flower.DQStrategy(table)
    grid = InProcessGrid(lambda msg, context: msg, 2)
    messages = list(strategy.configure_train(1, ArrayRecord(table.state_dict()),
                                             ConfigRecord({}), grid))
    assert messages and all(m.content["config"]["bits"] == 4 for m in messages)


def test_bits_chosen_by_auto_are_not_logged_as_a_knob_set(caplog):
    import logging

    caplog.set_level(logging.INFO)
    dq_flower.DQStrategy(nn.Linear(5, 2), seed=0).summary()  # a table's 4 bits, by auto
    dq_flower.DQStrategy(nn.Linear(5, 2), seed=0, bits=3).summary()
    said = [r.getMessage() for r in caplog.records if "knobs:" in r.getMessage()]
    assert said[0].endswith("knobs: defaults") and said[1].endswith("knobs: bits=3")


class _HeadFirst(nn.Module):
    """A CNN whose head is registered before its features (the order forward does not use)."""

    def __init__(self):
        super().__init__()
        self.head = nn.Linear(32, 10)
        self.features = nn.Sequential(nn.Conv2d(1, 32, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten())

    def forward(self, x):
        return self.head(self.features(x))


class _Gated(nn.Module):
    """A table's MLP whose model holds a parameter of its own beside its layers."""

    def __init__(self):
        super().__init__()
        self.gate = nn.Parameter(torch.ones(6))
        self.body = nn.Sequential(nn.Linear(6, 16), nn.ReLU(), nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x * self.gate)


def test_the_first_layer_is_a_leaf_and_a_convolution_means_no_table():
    """A head registered first gave an image CNN 4 bits ("flat samples of 32 features"; 2.7x
    the uplink), a model's own gate parameter gave a 6-column table 2 bits."""
    assert input_width(_HeadFirst()) is None and dq_flower.DQStrategy(_HeadFirst()).cfg.bits == 2
    assert input_width(_Gated()) == 6 and dq_flower.DQStrategy(_Gated()).cfg.bits == 4
