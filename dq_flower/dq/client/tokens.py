"""A DQ data round's reply of token windows: chosen uniformly, sent losslessly.

Token windows have no quantizer (ids are sent exactly, :mod:`dq_flower.wire.token_batch`)
and so nothing to compensate; the importance filter draws uniformly among the windows the
server does not hold, under the round's budget and selection rule. Knobs that need the
model on the node (model scorers, compensation, gradient rounds) are refused, named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from dq_flower.dq.client.selection import select
from dq_flower.dq.config import DQConfig
from dq_flower.dq.scorer_choice import CAN_SCORE_KEY, model_knob
from dq_flower.wire.node_errors import NodeConfigError
from dq_flower.wire.token_batch import encode_token_batch

__all__ = ["check_token_round", "token_upload"]


def check_token_round(config: Mapping[str, Any], cfg: DQConfig) -> None:
    """Refuse, naming the knob, a round that token windows cannot answer."""
    knob = model_knob({**config, "scorer": "uniform"})
    if cfg.scorer not in ("uniform", "auto"):
        knob = f"scorer={cfg.scorer!r}"
    if knob is not None:
        raise NodeConfigError(f"{knob} is not supported for token windows (they are chosen "
                              "uniformly and sent exactly: no model on the node, nothing "
                              "to compensate)")


def token_upload(windows: np.ndarray, vocab: int, cfg: DQConfig, candidates: np.ndarray,
                 rng: np.random.Generator) -> tuple[RecordDict, int, dict[str, int]]:
    """The records of the round's upload, its payload bits and its metrics."""
    sel = select(np.ones(candidates.size), cfg.budget, cfg.selection_rule, rng,
                 cfg.score_threshold)
    chosen = candidates[sel.indices]
    represents = sel.weights * max(int(candidates.size), 1)  # 1 / pi_i per window
    content, bits = encode_token_batch(windows[chosen], chosen, represents, vocab,
                                       int(windows.shape[0]))
    return content, bits, {"candidates": int(candidates.size), "selected": int(chosen.size),
                           CAN_SCORE_KEY: 0}
