"""A user's own text app: their tokenizer, their model, their text as ``datasets.Dataset``.

The text: the docstrings of Python's standard library modules (real English that ships
with every Python), one device per group of modules, a fixed set of modules held out for
the server's evaluation. Only ``DQStrategy`` and ``dq_train`` come from ``dq_flower``.
"""

from __future__ import annotations

import importlib
import math
import string

import numpy as np
import torch
from datasets import Dataset
from flwr.app import ArrayRecord, Context, Message, MetricRecord
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from torch import nn

import dq_flower

WINDOW = 32
DEVICES = (("json", "csv", "argparse"), ("logging", "textwrap", "fractions"),
           ("decimal", "heapq", "bisect"))
HELD_OUT = ("statistics", "difflib", "shlex")


class CharTokenizer:
    """The user's tokenizer: printable characters, everything else one unknown id."""

    def __init__(self) -> None:
        self.table = {c: i for i, c in enumerate(string.printable)}

    def __len__(self) -> int:
        return len(self.table) + 1

    def encode(self, text: str) -> list[int]:
        return [self.table.get(c, len(self.table)) for c in text]


class CharRNN(nn.Module):
    """The user's model: embedding, a GRU, next-token logits ``(n, length, vocab)``."""

    def __init__(self, vocab: int = 101) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embed = nn.Embedding(vocab, 24)
        self.rnn = nn.GRU(24, 64, batch_first=True)
        self.head = nn.Linear(64, vocab)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.rnn(self.embed(x.long()))
        return self.head(h)


def _docs(modules: tuple[str, ...]) -> list[str]:
    return [importlib.import_module(m).__doc__ or "" for m in modules]


def device_text(partition_id: int) -> Dataset:
    """The device's own text: a ``datasets.Dataset`` of strings."""
    return Dataset.from_dict({"text": _docs(DEVICES[partition_id])})


def held_out_windows() -> torch.Tensor:
    ids = CharTokenizer().encode("".join(_docs(HELD_OUT)))
    ids = ids[:len(ids) // WINDOW * WINDOW]
    return torch.tensor(ids, dtype=torch.long).reshape(-1, WINDOW)


def perplexity(arrays: ArrayRecord) -> float:
    model = CharRNN()
    model.load_state_dict(arrays.to_torch_state_dict())
    windows = held_out_windows()
    with torch.no_grad():
        logits = model(windows)
        loss = nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                           windows[:, 1:].reshape(-1))
    return math.exp(float(loss))


def make_server_app(rounds: int, out: dict, **knobs) -> ServerApp:
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        model = CharRNN()
        strategy = dq_flower.DQStrategy(model, seed=0, **knobs)
        measured = dq_flower.MeasuredGrid(grid)
        result = strategy.start(
            grid=measured, initial_arrays=ArrayRecord(model.state_dict()), num_rounds=rounds,
            evaluate_fn=lambda rnd, arrays: MetricRecord({"perplexity": perplexity(arrays)}))
        out["perplexity"] = [float(m["perplexity"])
                             for _, m in sorted(result.evaluate_metrics_serverapp.items())]
        out["up_bytes"] = measured.up_bytes
        out["down_bytes"] = measured.down_bytes
        out["stored"] = strategy.stored

    return app


def train(msg: Message, context: Context) -> Message:
    """The user's ``@app.train()``: their text, their tokenizer, windows of 32 tokens."""
    text = device_text(int(context.node_config["partition-id"]))
    return dq_flower.client.dq_train(msg, context, text, window=WINDOW,
                                     tokenizer=CharTokenizer())


def make_client_app() -> ClientApp:
    app = ClientApp()
    app.train()(train)
    return app


def text_bytes() -> int:
    """Every device's text, as UTF-8: what uploading all of it would send raw."""
    return sum(len(t.encode()) for d in DEVICES for t in _docs(d))


__all__ = ["CharRNN", "CharTokenizer", "device_text", "held_out_windows", "make_client_app",
           "make_server_app", "perplexity", "text_bytes", "train", "np"]
