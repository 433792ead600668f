"""Child process of ``tests/dq/test_store_on_disk.py``: a store larger than the memory limit.

``python -m tests.dq.store_limit_child MODE DIR LIMIT_MB STORE_MB`` caps the process's
data memory at ``LIMIT_MB`` (``RLIMIT_DATA``: heap and every private mapping, so every
numpy array; a shared file mapping such as the disk store's is backed by its file and not
counted), fills a store (``MODE`` ``disk``: codes in ``DIR``; ``memory``: in memory) with
``STORE_MB`` of packed 2-bit rows of 3,072 coordinates, 10 classes, each class lighting its
own block of coordinates under random noise, then trains a softmax regression in numpy
on minibatches drawn and dequantized from the store and prints a JSON line of what it saw.
It imports no PyTorch, whose import alone maps more than such a limit allows.
"""

from __future__ import annotations

import json
import os
import resource
import sys

# one BLAS thread: each further thread's buffers take tens of MB of the data limit
os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

import numpy as np  # noqa: E402

from dq_flower.codecs.bitpack import pack  # noqa: E402
from dq_flower.dq.server.disk_store import DiskSampleStore  # noqa: E402
from dq_flower.dq.server.store import (  # noqa: E402
    RowLayout,  # noqa: E402
    SampleStore,
    StoredRows,
)

DIM, BITS, CLASSES, CHUNK_MB, SEED = 3072, 2, 10, 8, 0


def _templates(layout: RowLayout) -> np.ndarray:
    """Per class, the packed row lighting the class's block of coordinates (code 3)."""
    block = DIM // CLASSES
    codes = np.zeros((CLASSES, layout.padded_dim), dtype=np.uint8)
    for c in range(CLASSES):
        codes[c, c * block:(c + 1) * block] = 3
    return pack(codes.reshape(-1), BITS).reshape(CLASSES, layout.row_bytes)


def _fill(store: SampleStore, layout: RowLayout, store_mb: int,
          rng: np.random.Generator) -> None:
    templates = _templates(layout)
    rows = (CHUNK_MB << 20) // layout.row_bytes
    for start in range(0, (store_mb << 20) // layout.row_bytes, rows):
        labels = rng.integers(0, CLASSES, rows)
        noise = rng.integers(0, 256, (rows, layout.row_bytes), dtype=np.uint8) & 0x55
        store.add(StoredRows(
            codes=templates[labels] ^ noise,  # each code's low bit flipped at random
            side=np.tile(np.array([[0.0, 1 / 3]], dtype=np.float32), (rows, 1)),
            labels=labels, weights=np.ones(rows, np.float32),
            node=np.full(rows, 1, dtype=np.uint64),
            ids=np.arange(start, start + rows, dtype=np.int64),
            dither=np.zeros((rows, 0), np.int64)))


def _train(store: SampleStore, rng: np.random.Generator, steps: int = 60,
           batch: int = 256) -> float:
    """Softmax regression from the store's minibatches; accuracy on 4 fresh ones."""
    w = np.zeros((DIM, CLASSES), dtype=np.float32)
    for _ in range(steps):
        x, y, _ = store.draw(batch, rng)
        logits = x @ w
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        p[np.arange(len(y)), y] -= 1
        w -= 0.5 * (x.T @ p) / len(y)
    hits = 0
    for _ in range(4):
        x, y, _ = store.draw(batch, rng)
        hits += int(((x @ w).argmax(1) == y).sum())
    return hits / (4 * batch)


def _status(key: str) -> int:
    """A ``/proc/self/status`` figure in kB."""
    with open("/proc/self/status") as fh:
        return next(int(line.split()[1]) for line in fh if line.startswith(key + ":"))


def main(argv: list[str]) -> None:
    mode, directory, limit_mb, store_mb = argv[0], argv[1], int(argv[2]), int(argv[3])
    assert "torch" not in sys.modules
    resource.setrlimit(resource.RLIMIT_DATA, (limit_mb << 20, limit_mb << 20))
    layout = RowLayout(DIM, BITS)
    store = (DiskSampleStore(layout.dequantize, directory) if mode == "disk"
             else SampleStore(layout.dequantize))
    rng = np.random.default_rng(SEED)
    _fill(store, layout, store_mb, rng)
    accuracy = _train(store, rng)
    print(json.dumps({"rows": len(store), "store_mb": store.nbytes / 2**20,
                      "limit_mb": limit_mb, "accuracy": accuracy,
                      "vm_data_mb": _status("VmData") / 1024,
                      "rss_anon_mb": _status("RssAnon") / 1024}))


if __name__ == "__main__":
    main(sys.argv[1:])
