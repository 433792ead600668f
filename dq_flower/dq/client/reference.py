"""A node's reference rows: a few of its rows at 8 bits, sent once where the server asks.

A node not given the model cannot compare the model's loss on its raw rows with that on
their codes; the server asks it once (round config ``reference-rows``) for a small seeded
sample of its rows at the finest width (:mod:`dq_flower.wire.reference_rows`) and compares
itself (:mod:`dq_flower.dq.server.reference_rows`). Rows coded per sample or per channel
only, as :mod:`.fidelity` compares; id rows send none, rows that are their own targets
(an autoencoder's) no targets.
No PyTorch: a node without the model runs it in every data round (it sends rows only where
asked).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
from flwr.app import ArrayRecord

from dq_flower.dq.config import DQConfig
from dq_flower.seeding import Purpose, round_rng
from dq_flower.wire.dq_batch import DataSpec, range_mode
from dq_flower.wire.reference_rows import (
    MAX_ROWS,
    MIN_ROWS,
    REFERENCE_BITS,
    REFERENCE_KEY,
    reference_records,
)

__all__ = ["reference_rows"]


def reference_rows(cfg: DQConfig, spec: DataSpec, x_flat: np.ndarray, y: np.ndarray,
                   config: dict[str, Any], key: int,
                   num_classes: int) -> dict[str, ArrayRecord]:
    """The reply records of the reference rows the round asks for (their bytes count).

    Empty where none are asked or the rows are not compared (ids, a table's feature
    ranges, fewer than :data:`MIN_ROWS` rows). The draw and the rounding
    take a stream of their own (:attr:`Purpose.FIDELITY`), so the reply's other draws are
    untouched.
    """
    asked, n = min(int(config.get(REFERENCE_KEY, 0) or 0), MAX_ROWS), int(x_flat.shape[0])
    mode = range_mode(cfg.ranges, spec.sample_shape, spec.mixed_units)
    if asked < MIN_ROWS or n < MIN_ROWS or spec.vocab or mode == "feature":
        return {}
    rng = round_rng(int(config.get("round-seed", 0)), int(config["server-round"]), key,
                    Purpose.FIDELITY)
    idx = np.sort(rng.choice(n, size=min(asked, n), replace=False))
    quantizer = dataclasses.replace(cfg, bits=REFERENCE_BITS, dither=False).sample_quantizer(
        mode, spec.channels, sample_shape=spec.sample_shape)
    return reference_records(quantizer.encode(x_flat[idx], rng),
                             None if spec.target == "inputs" else y[idx], num_classes,
                             spec.target == "binary")
