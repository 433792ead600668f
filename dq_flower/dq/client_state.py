"""Per-round state a DQ client keeps in ``Context.state``, replayable round by round.

An entry keeps its arrays as they were after each of the last :data:`STATE_HISTORY`
rounds it served, so a round the server sends again (also after resuming from an older
checkpoint) starts from the state it started from the first time and gets the same reply.
The error-feedback memory of a biased codec (:func:`encode_with_feedback`) lives here.
"""

from __future__ import annotations

from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from dq_flower.codecs import ErrorFeedback

__all__ = ["STATE_HISTORY", "state_before", "save_state", "encode_with_feedback"]

#: Rounds of per-round state a client keeps, so that a server resuming from a checkpoint
#: up to this many served rounds old replays them from the right state.
STATE_HISTORY = 8


def _state_rounds(context: Context, key: str) -> list[int]:
    meta = context.state.config_records.get(key + "-rounds")
    return [] if meta is None else [int(r) for r in cast(list, meta["rounds"])]


def state_before(context: Context, key: str, server_round: int) -> dict[str, np.ndarray]:
    """Arrays of state entry ``key`` as they were before ``server_round``.

    The entry keeps its arrays as they were after each of the last ``STATE_HISTORY`` rounds
    it served; the state before round ``r`` is the one after the latest served round before
    ``r``. So a round the server replays, also after resuming from an older checkpoint,
    gets the same reply as the first time.
    """
    earlier = [r for r in _state_rounds(context, key) if r < server_round]
    if not earlier:
        return {}
    rec = context.state.array_records.get(f"{key}@{max(earlier)}")
    return {} if rec is None else {name: arr.numpy().copy() for name, arr in rec.items()}


def save_state(context: Context, key: str, server_round: int,
               after: dict[str, np.ndarray]) -> None:
    """Record ``key``'s arrays after ``server_round``; later rounds' records are dropped."""
    rounds = [r for r in _state_rounds(context, key) if r < server_round]
    for r in _state_rounds(context, key):
        if r >= server_round:
            context.state.array_records.pop(f"{key}@{r}", None)
    rounds.append(server_round)
    for r in rounds[:-STATE_HISTORY]:
        context.state.array_records.pop(f"{key}@{r}", None)
    rounds = rounds[-STATE_HISTORY:]
    context.state[f"{key}@{server_round}"] = ArrayRecord(
        {k: Array(np.ascontiguousarray(v)) for k, v in after.items()})
    context.state[key + "-rounds"] = ConfigRecord({"rounds": rounds})


def encode_with_feedback(codec: Any, vector: np.ndarray, rng: np.random.Generator,
                         context: Context, key: str, server_round: int) -> Any:
    """Encode ``vector``, through error feedback kept under ``key`` for a biased codec."""
    if not codec.biased:
        return codec.encode(vector, rng)
    ef = ErrorFeedback(codec)
    ef_before = state_before(context, key, server_round)
    if ef_before:
        ef.load_state_dict(ef_before)
    payload = ef.encode(vector, rng)
    save_state(context, key, server_round, ef.state_dict())
    return payload
