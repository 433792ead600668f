"""A table whose label-encoded categorical columns feed embeddings (``x[:, j].long()``).

Its codes were quantized like any value and read as other categories; now, where the
server's model reads samples with an embedding, whole-number columns of few values get
one code per value (exact), ``bits = auto`` gives such tables 4 bits or as many as the
largest embedding's rows take (up to 8), and a model that raises on stored rows has the
round's steps rolled back instead of ending the run.
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch
from flwr.app import ArrayRecord, MetricRecord
from torch import nn

import dq_flower
from dq_flower.codecs import make
from dq_flower.codecs.affine import denormalise, feature_ranges, normalise
from dq_flower.dq.client.sent import node_ranges
from dq_flower.harness.inprocess import InProcessGrid
from dq_flower.server.robust import StepGuard
from tests.apps.runner import docs_text


def _table(rng: np.random.Generator, n: int = 400) -> np.ndarray:
    codes = np.stack([rng.integers(0, c, n) for c in (8, 5, 12)], 1)
    numbers = np.stack([rng.normal(40, 12, n), rng.normal(50_000, 20_000, n)], 1)
    return np.concatenate([codes, numbers], 1).astype(np.float32)


def test_whole_number_columns_of_few_values_are_coded_exactly():
    rng = np.random.default_rng(0)
    x = _table(rng)
    quantizer = make("uniform", bits=4, stochastic=True, entropy="zlib", fixed_range=True)
    lo, span = feature_ranges(x, 16)
    back = denormalise(quantizer.decode(quantizer.encode(normalise(x, lo, span), rng))
                       .reshape(x.shape), lo, span)
    assert np.array_equal(back[:, :3], x[:, :3])  # every category as it was
    assert not np.array_equal(back[:, 3:], x[:, 3:])  # the numbers quantized as before
    assert np.array_equal(feature_ranges(x, 16)[1][3:], feature_ranges(x)[1][3:])
    plain = denormalise(quantizer.decode(quantizer.encode(normalise(x, *feature_ranges(x)),
                                                          rng)).reshape(x.shape),
                        *feature_ranges(x))
    assert (plain[:, :3].astype(np.int64) != x[:, :3]).mean() > 0.3  # .long() before


def test_only_a_model_reading_an_embedding_turns_it_on():
    x = _table(np.random.default_rng(1))
    aligned = node_ranges({"sample-vocab": 8}, x, 4)[1]
    assert aligned[:3].tolist() == [15.0, 15.0, 15.0]
    assert np.array_equal(node_ranges({}, x, 4)[1], feature_ranges(x)[1])
    assert node_ranges({"sample-vocab": 8}, x, 2)[1][1] == 4.0  # 5 values, 4 codes: as before


class _ManyCategories(nn.Module):
    """A state column of 50 categories and a product one of 200, each with an embedding."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embeddings = nn.ModuleList([nn.Embedding(c, 3) for c in (50, 200)])
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ids = x[:, :2].long()
        codes = [e(ids[:, i]) for i, e in enumerate(self.embeddings)]
        return self.head(torch.cat([*codes, x[:, 2:]], 1))


def _many_categories(node: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(node)
    x = np.stack([rng.integers(0, 50, 120), rng.integers(0, 200, 120),
                  rng.normal(40, 12, 120), rng.normal(0, 1, 120)], 1).astype(np.float32)
    return x, (x[:, 3] > 0).astype(np.int64)


def test_categories_past_16_arrive_exactly_at_the_bits_auto_gives():
    """4 bits gave a 50-category column 16 codes, which ``.long()`` read as other states."""
    from dq_flower.dq.config import auto_bits

    assert [auto_bits(None, c) for c in (5, 16, 17, 50, 200, 256, 257, 30_000)] == [
        4, 4, 5, 6, 8, 8, 8, 8]
    assert dq_flower.DQStrategy(_ManyCategories()).cfg.bits == 8  # the largest, 200 rows
    assert dq_flower.DQStrategy(_ManyCategories(), bits=4).cfg.bits == 4  # as given
    strategy = dq_flower.DQStrategy(_ManyCategories(), seed=0)

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, _many_categories(node))

    strategy.start(grid=InProcessGrid(train, 3), num_rounds=1,
                   initial_arrays=ArrayRecord(_ManyCategories().state_dict()))
    store = strategy.data.store
    stored = store._decode(store._rows)[0]
    assert len(stored) == strategy.stored > 0
    for node in range(3):
        mine = store.node_ids(store._rows) == node
        sent = _many_categories(node)[0][store._rows.ids[mine]]
        assert np.array_equal(stored[mine][:, :2], sent[:, :2])  # every category exactly
        assert not np.array_equal(stored[mine][:, 2:], sent[:, 2:])  # numbers quantized


def test_a_model_that_raises_on_its_rows_is_rolled_back_not_fatal():
    model = nn.Embedding(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    before = model.weight.detach().clone()
    guard = StepGuard(model, optimizer)

    def steps() -> float:
        model(torch.tensor([1])).sum().backward()
        optimizer.step()  # a first step moves the weights, the next row is out of range
        return float(model(torch.tensor([9])).sum())

    loss, failure = guard.run(steps)
    assert np.isnan(loss) and failure.startswith("raised IndexError")
    assert torch.equal(model.weight, before)
    assert guard.run(lambda: 1.5) == (1.5, None)


def test_the_user_app_quoted_on_the_user_app_page():
    from tests.apps.test_zoo import runs  # the zoo's runs, made once per session

    fedavg, dq = runs("tab_embeddings")["fedavg"], runs("tab_embeddings")["dq"]
    page = docs_text("experiments", "user-apps.md")
    quoted = (f"DQ ends at {dq.final:.2%} with {dq.up_bytes:,} B against FedAvg's "
              f"{fedavg.final:.2%} with {fedavg.up_bytes:,} B")
    assert quoted in page, quoted


def test_the_simulation_engine_tables_on_the_user_app_page_are_the_runs_own():
    regen = Path(__file__).parents[2] / "results" / "regen"
    page = docs_text("experiments", "user-apps.md")
    for run in ("user-apps-2026-12-06d", "user-apps-not-won-2026-12-06b"):
        rows = (regen / run / "table.md").read_text()
        assert " ".join(rows.split()) in page, run
    for later in "abcdef":  # apps added since, each run alone: their rows below the table's
        for row in (regen / f"user-apps-2026-12-07{later}" / "table.md").read_text(
                ).splitlines()[2:]:
            assert " ".join(row.split()) in page, row
    table = (regen / "user-apps-readme-2026-12-06d" / "table.md").read_text()
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    assert " ".join(table.split()) in " ".join(readme.split())


def test_a_reply_whose_codes_the_models_embeddings_lack_is_refused_each_time(caplog):
    from tests.apps import tab_embeddings as app  # the zoo's table, one node's rows altered

    x, x_test, y, y_test = app._arrays()
    x = x.copy()
    x[3::5][:40, 0] = 9.0  # node 3 holds a category the first embedding (8 rows) lacks

    def train(msg, context):
        node = int(context.node_config["partition-id"])
        return dq_flower.client.dq_train(msg, context, (x[node::5], y[node::5]))

    def evaluate(server_round: int, arrays: ArrayRecord) -> MetricRecord:
        model = app.Net()
        model.load_state_dict(arrays.to_torch_state_dict())
        return MetricRecord({"accuracy": app.score(model, x_test, y_test)})

    model = app.Net()
    with caplog.at_level(logging.INFO, logger="flwr"):
        result = dq_flower.DQStrategy(model, seed=0).start(
            grid=InProcessGrid(train, 5), num_rounds=3, evaluate_fn=evaluate,
            initial_arrays=ArrayRecord(model.state_dict()))
    rounds = [result.evaluate_metrics_serverapp[r] for r in (1, 2, 3)]
    assert [m["rejected"] for m in rounds] == [1, 1, 0]  # node 3, then it rests a round
    assert [m["rolled-back"] for m in rounds] == [0, 0, 0]  # were rolled back from round 2
    unread = [r.getMessage() for r in caplog.records if "cannot read its rows" in r.getMessage()]
    assert len(unread) == 1 and "IndexError" in unread[0]  # round 2 (round 1: the spec's)
    assert rounds[-1]["accuracy"] > rounds[0]["accuracy"]  # stayed at round 1's before
