"""A DQ data round's reply of token windows: chosen by the importance filter, sent losslessly.

Token windows have no quantizer (ids are sent exactly, :mod:`dq_flower.wire.token_batch`)
and so nothing to compensate. A device given no model draws uniformly among the windows
the server does not hold, under the round's budget and selection rule. A device given
``model=`` says so (``can-score``); under ``scorer="auto"`` the server then sends it the
model each round it scores, and it scores its candidate windows by the model
(:data:`WINDOW_SCORERS`: ``entropy``, the mean entropy of the next-token distributions,
or ``loss``, the mean next-token cross-entropy) and draws them with probability in
proportion to the score (``sample``, each window weighted ``1/(n p)``), as image rows are
drawn. Knobs that token windows cannot answer (compensation, gradient rounds, the other
model scorers) are refused, named.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import RecordDict

from dq_flower.data_input import ids_below
from dq_flower.dq.client.selection import select
from dq_flower.dq.config import DQConfig
from dq_flower.dq.scorer_choice import CAN_SCORE_KEY, model_knob
from dq_flower.wire.dq_batch import ID_VOCAB_KEY
from dq_flower.wire.node_errors import NodeConfigError
from dq_flower.wire.token_batch import encode_token_batch

__all__ = ["WINDOW_SCORERS", "check_token_round", "token_upload", "id_vocab"]

#: The model scorers a token window answers (with ``uniform``, which needs no model).
WINDOW_SCORERS = ("entropy", "loss")


def check_token_round(config: Mapping[str, Any], cfg: DQConfig, has_model: bool) -> None:
    """Refuse, naming the knob, a round that token windows cannot answer.

    ``cfg.scorer`` is resolved for this node; a model scorer needs ``has_model``.
    """
    knob = model_knob({**config, "scorer": "uniform"})
    if knob is None and cfg.scorer not in ("uniform", *WINDOW_SCORERS):
        knob = f"scorer={cfg.scorer!r}"
    if knob is not None:
        raise NodeConfigError(f"{knob} is not supported for token windows (they are sent "
                              "exactly, scored by uniform, entropy or loss: nothing to "
                              "compensate)")
    if cfg.scorer != "uniform" and not has_model:
        raise NodeConfigError(f"scorer={cfg.scorer!r} needs the model: pass model= (your "
                              "nn.Module) to dq_train")


def token_upload(windows: np.ndarray, vocab: int, cfg: DQConfig, candidates: np.ndarray,
                 rng: np.random.Generator, scores: np.ndarray | None = None,
                 can_score: bool = False) -> tuple[RecordDict, int, dict[str, int]]:
    """The records of the round's upload, its payload bits and its metrics.

    ``scores``: the candidates' importance (``None``: uniform).
    """
    weights = np.ones(candidates.size) if scores is None else scores
    sel = select(weights, cfg.budget, cfg.selection_rule, rng, cfg.score_threshold)
    chosen = candidates[sel.indices]
    represents = sel.weights * max(int(candidates.size), 1)  # 1 / pi_i per window
    content, bits = encode_token_batch(windows[chosen], chosen, represents, vocab,
                                       int(windows.shape[0]))
    return content, bits, {"candidates": int(candidates.size), "selected": int(chosen.size),
                           CAN_SCORE_KEY: int(can_score)}


def id_vocab(config: Mapping[str, Any], x: np.ndarray) -> int:
    """The vocabulary the node's samples are ids of, sent exactly; 0: values, quantized.

    The server names one (``sample-vocab``) where its model reads samples with an
    embedding; the samples are its ids where every value is a whole number below it.
    """
    vocab = int(config.get(ID_VOCAB_KEY, 0) or 0)
    return vocab if ids_below(x, vocab) else 0
