"""A ``DataLoader`` with a ``collate_fn`` of its own is read through it.

Its data set was read directly, the ``collate_fn`` passed by: sentences of word ids a
``collate_fn`` padded per batch failed every round (``the samples have different shapes
((4,) and (40,))``), and a ``collate_fn`` that tokenised strings or built dicts was never
called. The items are now collated in index order, in batches of the loader's size; where
the batches come out of different lengths (padded each to its own longest) every item is
collated at once, padded by the ``collate_fn`` to one length. Nodes whose longest rows
differ send rows of different lengths: the server pads the shorter ones with the model's
embedding's ``padding_idx`` (they were refused every round).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn
from torch.utils.data import DataLoader, Dataset, IterableDataset

import dq_flower
from dq_flower.codecs import PayloadError
from dq_flower.data_input import as_arrays, as_inputs
from dq_flower.dq.server.token_intake import pad_id, shorter_ids
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.wire.dq_batch import DataSpec
from tests.plugin.test_dict_inputs import two_rounds

VOCAB, LONGEST = 24, 9


def sentences(n: int, seed: int) -> list[tuple[np.ndarray, int]]:
    """Word ids of 2 to 9 words: class 1 draws words 2..12, class 0 words 13..23."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        label = int(i % 2)
        words = rng.integers(2, 13, rng.integers(2, LONGEST + 1)) + 11 * (1 - label)
        out.append((words.astype(np.int64), label))
    out[0] = (np.full(LONGEST, 2 + 11 * (1 - out[0][1]), np.int64), out[0][1])  # the longest
    return out


class Sentences(Dataset):
    def __init__(self, rows: list[tuple[np.ndarray, int]]) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.from_numpy(self.rows[i][0]), self.rows[i][1]


def pad_batch(batch):
    """Pad to the batch's own longest with 0, as Flower's text tutorials do."""
    ids, labels = zip(*batch, strict=True)
    return nn.utils.rnn.pad_sequence(ids, batch_first=True), torch.tensor(labels)


def padded(rows: list[tuple[np.ndarray, int]], length: int = LONGEST) -> np.ndarray:
    out = np.zeros((len(rows), length), np.int64)
    for i, (words, _) in enumerate(rows):
        out[i, :len(words)] = words
    return out


def test_batches_padded_each_to_its_own_longest_are_read_padded_to_one_length():
    rows = sentences(30, seed=0)
    loader = DataLoader(Sentences(rows), batch_size=4, shuffle=True, collate_fn=pad_batch)
    x, y, parts = as_inputs(loader)
    assert parts == () and x.shape == (30, LONGEST)  # index order, not the shuffled one
    np.testing.assert_array_equal(x, padded(rows))
    assert y.tolist() == [label for _, label in rows]


def test_a_collate_fn_that_tokenises_or_builds_dicts_is_what_is_read():
    words = {"the": 1, "cat": 2, "sat": 3, "dog": 4, "ran": 5}
    text = [("the cat sat", 0), ("the dog ran", 1), ("cat ran", 1)]

    def tokenise(batch):  # strings to ids padded to 4, in a dict as a tokenizer gives them
        ids = torch.zeros(len(batch), 4, dtype=torch.long)
        for i, (line, _) in enumerate(batch):
            tokens = [words[w] for w in line.split()]
            ids[i, :len(tokens)] = torch.tensor(tokens)
        return {"input_ids": ids, "labels": torch.tensor([label for _, label in batch])}

    x, y = as_arrays(DataLoader(text, batch_size=2, collate_fn=tokenise))
    assert x.tolist() == [[1, 2, 3, 0], [1, 4, 5, 0], [2, 5, 0, 0]] and y.tolist() == [0, 1, 1]

    def one(item):  # batch_size=None: the collate_fn maps one item at a time
        return torch.tensor([words[w] for w in item[0].split()][:2]), item[1]

    x, y = as_arrays(DataLoader(text, batch_size=None, collate_fn=one))
    assert x.tolist() == [[1, 2], [1, 4], [2, 5]] and y.tolist() == [0, 1, 1]


class Stream(IterableDataset):
    def __iter__(self):
        yield from ((torch.from_numpy(w), label) for w, label in sentences(12, seed=1))


def test_a_stream_padded_per_batch_is_refused_saying_to_pad_to_one_length():
    with pytest.raises(ValueError, match=r"batches have different shapes.*pad every sample "
                                         r"to one length"):
        as_arrays(DataLoader(Stream(), batch_size=4, collate_fn=pad_batch))


class MeanOfWords(nn.Module):
    """An embedding averaged over the words that are not padding, a linear head."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.emb, self.head = nn.Embedding(VOCAB, 8, padding_idx=0), nn.Linear(8, 2)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        m = (ids != 0).float().unsqueeze(-1)
        return self.head((self.emb(ids) * m).sum(1) / m.sum(1).clamp(min=1))


def accuracy_on_test(server_round: int, arrays: ArrayRecord) -> MetricRecord:
    test = sentences(200, seed=9)
    model = MeanOfWords()
    model.load_state_dict(arrays.to_torch_state_dict())
    with torch.no_grad():
        pred = model(torch.from_numpy(padded(test))).argmax(1).numpy()
    return MetricRecord({"accuracy": float((pred == [label for _, label in test]).mean())})


def test_dq_trains_on_sentences_a_loader_pads_per_batch():
    accuracy = accuracy_on_test

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        loader = DataLoader(Sentences(sentences(120, seed=10 + part)), batch_size=16,
                            shuffle=True, collate_fn=pad_batch)
        return dq_flower.client.dq_train(msg, context, loader)

    first, last = two_rounds(MeanOfWords(), train, accuracy)
    assert first["rejected"] == 0 and first["stored"] > 0  # every reply failed before
    assert last["accuracy"] > 0.9


def test_nodes_of_shorter_longest_rows_are_padded_with_the_embeddings_padding_idx():
    """Node 0's longest sentence has 9 words, the three others' 5: each pads to its own."""

    def train(msg, context):
        part = int(context.node_config["partition-id"])
        rows = sentences(120, seed=10 + part)
        rows = [(w[:5], label) for w, label in rows] if part else rows
        loader = DataLoader(Sentences(rows), batch_size=16, shuffle=True, collate_fn=pad_batch)
        return dq_flower.client.dq_train(msg, context, loader)

    strategy = dq_flower.DQStrategy(MeanOfWords(), seed=0)
    result = strategy.start(grid=InProcessGrid(train, 4), num_rounds=2,
                            initial_arrays=ArrayRecord(MeanOfWords().state_dict()),
                            evaluate_fn=accuracy_on_test)
    metrics = result.evaluate_metrics_serverapp
    # the longest is the federation's even where most nodes' rows are shorter
    assert [metrics[r]["rejected"] for r in (1, 2)] == [0, 0]  # before: the long node, every round
    assert strategy.spec is not None and strategy.spec.sample_shape == (LONGEST,)
    held = np.concatenate([x for x, *_ in strategy.store.holdout_batches()])
    words = (held != 0).sum(1)
    assert (held[:, :5] != 0).sum(1).tolist() == np.minimum(words, 5).tolist()  # pads last
    assert (words <= 5).any() and (words > 5).any() and metrics[2]["accuracy"] > 0.9


def test_id_rows_longer_than_the_federations_or_with_no_pad_id_are_refused_saying_why():
    known, short, long = (DataSpec((n,), vocab=VOCAB) for n in (LONGEST, 5, 12))
    assert pad_id(MeanOfWords()) == 0 and pad_id(nn.Sequential(nn.Embedding(5, 2))) is None
    assert shorter_ids(short, known, 0) and not shorter_ids(known, known, 0)
    assert not shorter_ids(DataSpec((5,)), DataSpec((LONGEST,)), 0)  # values, not ids
    with pytest.raises(PayloadError, match="its rows hold 12 ids, more than the federation's 9"):
        shorter_ids(long, known, 0)
    with pytest.raises(PayloadError, match="no padding_idx to pad them with: pad token ids to 9"):
        shorter_ids(short, known, None)
