"""What a client keeps in ``Context.state`` between rounds, replayable round by round.

A client owns the entries under its prefix; :func:`end_round` snapshots them after a round
(the last :data:`STATE_HISTORY` rounds) and :func:`begin_round` restores them as they were
after the latest round before, so a round sent again gets the same reply.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context

from dq_flower.codecs import ErrorFeedback, Payload

__all__ = ["STATE_HISTORY", "save_state_dict", "load_state_dict", "begin_round",
           "end_round", "encode_keeping_state", "encode_with_feedback"]

#: Rounds of state snapshots a client keeps: a server resuming from a checkpoint up to
#: this many served rounds old replays them from the state each started from.
STATE_HISTORY = 8


def save_state_dict(context: Context, key: str, state: Mapping[str, Any]) -> None:
    """Store a state dict of arrays and scalars (``None`` left out) in ``context.state``."""
    arrays, scalars = {}, {}
    for name, value in state.items():
        if value is None:
            continue
        if isinstance(value, np.ndarray):
            arrays[name] = Array(np.ascontiguousarray(value))
        elif isinstance(value, (bool, int, float, str, np.integer, np.floating)):
            scalars[name] = value.item() if isinstance(value, np.generic) else value
        else:
            arrays[name] = Array(np.ascontiguousarray(np.asarray(value)))
    context.state[key] = ArrayRecord(arrays)
    context.state[key + "-meta"] = ConfigRecord(scalars)


def load_state_dict(context: Context, key: str) -> dict[str, Any] | None:
    """Inverse of :func:`save_state_dict`; ``None`` when nothing is stored under ``key``."""
    rec = context.state.array_records.get(key)
    if rec is None:
        return None
    out: dict[str, Any] = {name: arr.numpy() for name, arr in rec.items()}
    meta = context.state.config_records.get(key + "-meta")
    if meta is not None:
        out.update(dict(meta.items()))
    return out


def _copy_record(record: Any) -> Any:
    return type(record)(dict(record.items()))


def _keys(context: Context, head: str) -> list[str]:
    return [k for k in list(context.state.keys()) if k.startswith(head)]


def _live_keys(context: Context, prefix: str) -> list[str]:
    return [k for k in _keys(context, prefix)
            if not k.startswith(prefix + "after@") and k != prefix + "rounds"]


def _snapshot_rounds(context: Context, prefix: str) -> list[int]:
    meta = context.state.config_records.get(prefix + "rounds")
    return [] if meta is None else [int(r) for r in cast(list, meta["rounds"])]


def _drop_snapshot(context: Context, rnd: int, prefix: str) -> None:
    for key in _keys(context, f"{prefix}after@{rnd}/"):
        del context.state[key]


def begin_round(context: Context, server_round: int, prefix: str) -> bool:
    """Restore the ``prefix`` entries as they were before ``server_round``; True if repeated."""
    rounds = _snapshot_rounds(context, prefix)
    repeated = server_round in rounds
    for rnd in rounds:
        if rnd >= server_round:
            _drop_snapshot(context, rnd, prefix)
    earlier = [r for r in rounds if r < server_round]
    context.state[prefix + "rounds"] = ConfigRecord({"rounds": earlier})
    for key in _live_keys(context, prefix):
        del context.state[key]
    if earlier:
        head = f"{prefix}after@{max(earlier)}/"
        for key in _keys(context, head):
            context.state[key[len(head):]] = _copy_record(context.state[key])
    return repeated


def end_round(context: Context, server_round: int, prefix: str) -> None:
    """Snapshot the live ``prefix`` entries after ``server_round`` (keeps the last few)."""
    rounds = ([r for r in _snapshot_rounds(context, prefix) if r < server_round]
              + [server_round])
    for key in _live_keys(context, prefix):
        context.state[f"{prefix}after@{server_round}/{key}"] = _copy_record(
            context.state[key])
    for rnd in rounds[:-STATE_HISTORY]:
        _drop_snapshot(context, rnd, prefix)
    context.state[prefix + "rounds"] = ConfigRecord({"rounds": rounds[-STATE_HISTORY:]})


def encode_keeping_state(coder: Any, vector: np.ndarray, rng: np.random.Generator,
                         context: Context, key: str | None) -> Payload:
    """``coder.encode(vector, rng)``, its state kept in entry ``key`` (``None``: stateless)."""
    state = load_state_dict(context, key) if key else None
    if state is not None:
        coder.load_state_dict(state)
    payload = coder.encode(vector, rng)
    if key:
        save_state_dict(context, key, coder.state_dict())
    return payload


def encode_with_feedback(codec: Any, vector: np.ndarray, rng: np.random.Generator,
                         context: Context, key: str) -> Payload:
    """Encode ``vector``, through error feedback kept under ``key`` for a biased codec."""
    if not codec.biased:
        return codec.encode(vector, rng)
    return encode_keeping_state(ErrorFeedback(codec), vector, rng, context, key)
