"""text_dq: the tokenizer, the model and the text (Jane Austen's novels, offline)."""

from __future__ import annotations

import string
from functools import lru_cache

import torch
from datasets import Dataset

from dq_flower.harness.tasks.char_lm import CharTransformer, perplexity
from dq_flower.harness.tasks.data.austen import TextFederation, load_austen

__all__ = ["CharTokenizer", "Net", "held_out_windows", "load_device_text", "perplexity"]


class CharTokenizer:
    """Characters to ids: Python's printable ASCII characters, anything else one unknown id.

    Any tokenizer works the same way: an object with ``encode(str) -> ids`` and ``len``
    (the vocabulary size), as Hugging Face tokenizers are.
    """

    def __init__(self) -> None:
        self.table = {c: i for i, c in enumerate(string.printable)}

    def __len__(self) -> int:
        return len(self.table) + 1  # 100 characters and the unknown id

    def encode(self, text: str) -> list[int]:
        """The ids of ``text``'s characters."""
        unknown = len(self.table)
        return [self.table.get(c, unknown) for c in text]


def Net(window: int) -> CharTransformer:  # noqa: N802 (named as Flower's templates name it)
    """A tiny decoder-only transformer: windows ``(n, window)`` of ids to next-id logits."""
    return CharTransformer(len(CharTokenizer()), window)


@lru_cache(maxsize=4)
def _federation(data_dir: str, chapters_per_device: int) -> TextFederation:
    """The novels' chapters as devices, a seeded tenth of each device's chapters held out."""
    return load_austen(data_dir or None, chapters_per_device=chapters_per_device or None,
                       seed=0)


def load_device_text(partition_id: int, num_partitions: int, chars: int,
                     data_dir: str = "", chapters_per_device: int = 0) -> Dataset:
    """The training text of node ``partition_id``, a ``datasets.Dataset`` of strings.

    The federation's devices (one per novel, or per ``chapters_per_device`` chapters) are
    dealt round-robin to the ``num_partitions`` nodes; each keeps the first ``chars``
    characters of each of its devices' training chapters (0: all of them).
    """
    devices = _federation(data_dir, chapters_per_device).devices
    if num_partitions > len(devices):
        raise ValueError(f"{num_partitions} nodes but {len(devices)} devices of text: run "
                         "fewer SuperNodes or set chapters-per-device")
    mine = devices[partition_id::num_partitions]
    return Dataset.from_dict({"text": [d.train[:chars] if chars else d.train for d in mine]})


def held_out_windows(window: int, per_device: int, data_dir: str = "",
                     chapters_per_device: int = 0) -> torch.Tensor:
    """The first ``per_device`` windows of every device's held-out chapters, as ids."""
    tokenizer = CharTokenizer()
    rows = []
    for device in _federation(data_dir, chapters_per_device).devices:
        ids = tokenizer.encode(device.test[:window * per_device])
        ids = ids[:len(ids) // window * window]
        rows.append(torch.tensor(ids, dtype=torch.long).reshape(-1, window))
    return torch.cat(rows)
