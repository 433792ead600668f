"""Samples of ids with labels (a text classifier's word ids) through DQ, sent exactly.

A model whose first layer is an embedding reads ids; the server names the embedding's rows
in the round config (``sample-vocab``), a node whose samples are whole numbers below it
sends them losslessly as a ``tokens`` payload beside its labels, and the server stores them
exactly and feeds them to the model as int64.
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch
from datasets import Dataset
from flwr.app import ArrayRecord, Context, Message, MessageType, MetricRecord, RecordDict
from torch import nn

import dq_flower
from dq_flower.codecs import PayloadError, make
from dq_flower.data_input import as_arrays
from dq_flower.dq.client.tokens import id_vocab
from dq_flower.dq.server.optimizer_choice import candidates
from dq_flower.dq.server.validation import History, Rules, check_upload
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.model_ops import embedding_vocab, model_input
from dq_flower.server.common import decay_groups
from dq_flower.wire.dq_batch import (
    ID_VOCAB_KEY,
    SPEC_KEY,
    DataSpec,
    spec_from_record,
    spec_record,
)
from dq_flower.wire.dq_upload import encode_batch
from dq_flower.wire.token_batch import tokens_payload

VOCAB, LENGTH, CLASSES, NODES, ROWS = 60, 12, 3, 4, 150
SPEC = DataSpec((LENGTH,), "class", 1, VOCAB)
RULES = Rules(bits=2, dither=False, selection_rule="topk", spec=SPEC, num_classes=CLASSES)


class BagOfWords(nn.Module):
    """A user's text classifier: the mean of the words' embeddings, then a linear layer."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.words = nn.EmbeddingBag(VOCAB, 8, mode="mean")
        self.out = nn.Linear(8, CLASSES)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.out(self.words(ids))


def passages(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Passages of class ``c``: half their words from the class's own ten, half shared."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, CLASSES, n)
    own = y[:, None] * 10 + rng.integers(0, 10, (n, LENGTH))
    shared = rng.integers(30, VOCAB, (n, LENGTH))
    x = np.where(rng.random((n, LENGTH)) < 0.5, own, shared)
    return x.astype(np.int64), y.astype(np.int64)


# ------------------------------------------------------------------ who reads ids
def test_a_model_reads_ids_where_its_first_layer_is_an_embedding():
    assert embedding_vocab(BagOfWords()) == VOCAB
    assert embedding_vocab(nn.Sequential(nn.Embedding(7, 2), nn.Flatten(), nn.Linear(6, 2))) == 7
    assert embedding_vocab(nn.Sequential(nn.Linear(4, 2), nn.ReLU())) == 0
    assert embedding_vocab(nn.ReLU()) == 0  # no parameters at all


def test_a_node_sends_ids_where_every_value_is_a_whole_number_below_the_vocabulary():
    x = np.array([[0, 5, 59], [1, 2, 3]], dtype=np.float32)
    assert id_vocab({ID_VOCAB_KEY: VOCAB}, x) == VOCAB
    assert id_vocab({}, x) == 0  # the server's model reads no ids
    assert id_vocab({ID_VOCAB_KEY: 59}, x) == 0  # an id outside: values, quantized
    assert id_vocab({ID_VOCAB_KEY: VOCAB}, x + 0.5) == 0
    assert id_vocab({ID_VOCAB_KEY: VOCAB}, -x) == 0
    assert id_vocab({ID_VOCAB_KEY: VOCAB}, np.zeros((0, 3), np.float32)) == 0


def test_a_tokenized_datasets_input_ids_are_the_samples():
    x, y = passages(6, 0)
    data = Dataset.from_dict({"input_ids": x.tolist(), "attention_mask": np.ones_like(x).tolist(),
                              "label": y.tolist()}).with_format("torch")
    got_x, got_y = as_arrays(data)
    assert np.array_equal(got_x, x) and np.array_equal(got_y, y)
    assert id_vocab({ID_VOCAB_KEY: VOCAB}, got_x) == VOCAB
    ragged = Dataset.from_dict({"input_ids": [[1, 2, 3], [4, 5]], "label": [0, 1]})
    with pytest.raises(ValueError, match=r"different shapes \(\(2,\) and \(3,\)\).*pad"):
        as_arrays(ragged)


def test_ids_reach_the_model_as_int64_and_values_as_float32():
    dev = torch.device("cpu")
    assert model_input(np.arange(4).reshape(2, 2), dev, False).dtype == torch.int64
    assert model_input(np.arange(4, dtype=np.int32), dev, False).dtype == torch.int64
    assert model_input(np.ones(3, np.float32), dev, False).dtype == torch.float32
    assert model_input(np.ones(3, np.uint8), dev, False).dtype == torch.float32  # pixels


def test_an_embeddings_rows_are_not_decayed():
    model = BagOfWords()
    decayed, rows = decay_groups(model, 5e-4)
    assert decayed["weight_decay"] == 5e-4 and rows["weight_decay"] == 0.0
    assert [p is model.words.weight for p in rows["params"]] == [True]
    assert {id(p) for p in decayed["params"]} == {id(model.out.weight), id(model.out.bias)}
    dense = nn.Linear(3, 2)
    assert [len(g["params"]) for g in decay_groups(dense, 5e-4)] == [2]


def test_an_id_model_probes_adam_first():
    assert [c.name for c in candidates(0.05, False)] == ["sgd", "adam"]
    assert [c.name for c in candidates(0.05, False, adam_first=True)] == ["adam", "sgd"]


# ------------------------------------------------------------------ the wire
def test_the_spec_carries_its_vocabulary_only_for_id_samples():
    assert "vocab" not in spec_record(DataSpec((LENGTH,), "class"))
    assert spec_from_record(spec_record(SPEC)) == SPEC
    for bad in ({"target": "tokens", "target-dim": 300, "vocab": 300}, {"vocab": 1},
                {"vocab": True}, {"vocab": 1 << 25}):
        record = spec_record(DataSpec((LENGTH,), "class"))
        for key, value in bad.items():
            record[key] = value
        with pytest.raises(PayloadError, match="vocab"):
            spec_from_record(record)
    with pytest.raises(ValueError, match="vocab"):
        DataSpec((LENGTH,), "tokens", 300, 300)


def _content(x: np.ndarray, y: np.ndarray, payload=None) -> RecordDict:
    n = len(y)
    samples = tokens_payload(x, VOCAB) if payload is None else payload
    content, _ = encode_batch(samples, y, np.arange(n), np.full(n, 20 / n), CLASSES, 20)
    content[SPEC_KEY] = spec_record(SPEC)
    content["metrics"] = MetricRecord({"num-examples": 20, "candidates": 20,
                                       "partition-id": 0})
    return content


def test_an_honest_reply_decodes_to_its_ids_and_labels():
    x, y = passages(5, 0)
    upload = check_upload(_content(x, y), 0, RULES, History(), 16)
    assert upload.x.dtype == np.int64 and np.array_equal(upload.x, x)
    assert np.array_equal(upload.batch.labels, y) and upload.spec == SPEC


@pytest.mark.parametrize("kind", ["other vocabulary", "quantized samples", "wrong length"])
def test_a_hostile_id_reply_is_refused_with_its_reason(kind):
    x, y = passages(5, 1)
    payload = {"other vocabulary": tokens_payload(x, 64),
               "quantized samples": make("uniform", bits=2).encode(
                   x.astype(np.float32), np.random.default_rng(0)),
               "wrong length": tokens_payload(x[:, :-1], VOCAB)}[kind]
    reason = {"other vocabulary": "vocabulary of 64", "quantized samples": "'uniform'",
              "wrong length": "shape"}[kind]
    with pytest.raises(PayloadError, match=reason):
        check_upload(_content(x, y, payload), 0, RULES, History(), 16)


# ------------------------------------------------------------------ a user's app
def _train(msg: Message, context: Context) -> Message:
    return dq_flower.client.dq_train(msg, context, passages(ROWS, int(
        context.node_config["partition-id"])))


def test_a_text_classifier_trains_through_dq_at_its_defaults():
    test_x, test_y = passages(600, 99)
    sent: list[dict] = []
    grid = InProcessGrid(_train, NODES)
    send = grid.send_and_receive

    def recording(messages, *args, **kwargs):
        messages = list(messages)
        sent.extend(dict(m.content.config_records["config"].items()) for m in messages)
        return send(messages, *args, **kwargs)

    grid.send_and_receive = recording

    def central(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = BagOfWords()
        model.load_state_dict(arrays.to_torch_state_dict())
        with torch.no_grad():
            hit = (model(torch.from_numpy(test_x)).argmax(1).numpy() == test_y).mean()
        return MetricRecord({"accuracy": float(hit)})

    model = BagOfWords()
    strategy = dq_flower.DQStrategy(model, seed=0)
    logged: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: logged.append(record.getMessage())  # type: ignore[method-assign]
    logging.getLogger("flwr").addHandler(handler)
    try:
        result = strategy.start(grid=grid, initial_arrays=ArrayRecord(model.state_dict()),
                                num_rounds=3, evaluate_fn=central)
    finally:
        logging.getLogger("flwr").removeHandler(handler)
    # the line docs/plugin.md quotes
    assert ("[dq] round 0: data: samples (12,) of ids below 60 (the model's embedding), coded "
            "losslessly, class targets, 3 classes") in logged
    assert any("probes on the held-out rows: adam" in line for line in logged)  # Adam first
    assert sent and all(c.get(ID_VOCAB_KEY) == VOCAB for c in sent)
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (1, 2, 3))
    assert strategy.data.spec == DataSpec((LENGTH,), "class", 1, VOCAB)
    store = strategy.data.store
    x, y = store._decode(store._rows)  # every stored row is a node's passage, exactly
    assert x.dtype == np.int64 and len(x) == strategy.stored > 0
    for node in range(NODES):
        mine = store.node_ids(store._rows) == node
        own_x, own_y = passages(ROWS, node)
        ids = store._rows.ids[mine]
        assert np.array_equal(x[mine], own_x[ids]) and np.array_equal(y[mine], own_y[ids])
    undecayed = [g for g in strategy.trainer.optimizer.param_groups if g["weight_decay"] == 0]
    assert [p is strategy.trainer.model.words.weight for g in undecayed for p in g["params"]] \
        == [True]
    accuracy = result.evaluate_metrics_serverapp[3]["accuracy"]
    assert accuracy > 0.8, accuracy  # chance is about 1/3
    resumed = dq_flower.DQStrategy(BagOfWords(), seed=0)  # a checkpoint keeps the ids
    resumed.load_state_dict(strategy.state_dict())
    assert resumed.data.spec == strategy.data.spec and resumed.stored == strategy.stored
    again = resumed.data.store
    assert np.array_equal(again._decode(again._rows)[0], x)


def test_federated_evaluation_reads_word_ids_and_binary_targets():
    InProcessGrid(lambda m, c: m, 1)  # acts as the server: messages can be built here
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})

    def message(model: nn.Module) -> Message:
        msg = Message(RecordDict({"arrays": ArrayRecord(model.state_dict())}), dst_node_id=5,
                      message_type=MessageType.EVALUATE)
        msg.metadata.__dict__["_message_id"] = "e1"
        return msg

    x, y = passages(40, 3)
    metrics = dq_flower.client.evaluate(message(BagOfWords()), ctx, (x, y), model=BagOfWords())
    assert 0.0 <= metrics.content["metrics"]["eval-acc"] <= 1.0  # ids reached the embedding
    torch.manual_seed(0)
    one_logit = nn.Sequential(nn.Linear(LENGTH, 1), nn.Flatten(0))
    labels = (x[:, 0] < 30).astype(np.float32)  # 0/1 float labels: scored on logits
    reply = dq_flower.client.evaluate(message(one_logit), ctx, (x.astype(np.float32), labels),
                                      model=one_logit)
    with torch.no_grad():
        logits = one_logit(torch.from_numpy(x.astype(np.float32)))
    expected = float(torch.nn.functional.binary_cross_entropy_with_logits(
        logits, torch.from_numpy(labels)))
    assert reply.content["metrics"]["eval-loss"] == pytest.approx(expected, rel=1e-5)


def _long_train(msg: Message, context: Context) -> Message:
    x, y = passages(ROWS, int(context.node_config["partition-id"]))
    return dq_flower.client.dq_train(msg, context, (np.tile(x, 4), y))  # 48 ids a row


@pytest.mark.parametrize("bits", [5, 6, 7])
def test_ids_are_stored_exactly_whatever_the_bits(bits):
    """Id rows are kept as whole bytes: the copy screen read them as ``bits``-bit codes, so
    a width that does not divide 8 refused rows of 32 codes or more ("packed buffer holds
    ... bytes but ... codes of 7 bits need ...")."""
    from dq_flower.dq.server.near_copies import CopyScreen
    from dq_flower.dq.server.token_intake import layout_of

    layout = layout_of(DataSpec((4 * LENGTH,), "class", 1, VOCAB))
    x = np.random.default_rng(bits).integers(0, VOCAB, (40, 4 * LENGTH))
    rows = layout.rows(layout.plain(x, VOCAB))
    screen = CopyScreen(0.1, bits=bits)
    assert not screen.copied(0, rows[0], rows[1], layout=layout).any()
    near = x[:3].copy()
    near[:, 0] = (near[:, 0] + 1) % VOCAB  # one id of 48 moved: a near-copy
    again = layout.rows(layout.plain(near, VOCAB))
    assert screen.copied(0, again[0], again[1], layout=layout).all()
    assert np.array_equal(layout.dequantize(*rows), x)
    strategy = dq_flower.DQStrategy(BagOfWords(), seed=0, bits=bits)
    strategy.start(grid=InProcessGrid(_long_train, NODES), num_rounds=2,
                   initial_arrays=ArrayRecord(BagOfWords().state_dict()))
    assert all(strategy.round_figures(r)["rejected"] == 0 for r in (1, 2))
    store = strategy.data.store
    stored = store._decode(store._rows)[0]
    assert len(stored) == strategy.stored > 0
    for node in range(NODES):
        mine = store.node_ids(store._rows) == node
        own = np.tile(passages(ROWS, node)[0], 4)
        assert np.array_equal(stored[mine], own[store._rows.ids[mine]])
