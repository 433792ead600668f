"""What a client keeps in ``Context.state`` between rounds, replayable round by round.

One protocol for every client of the package (DQ's, the gradient baselines',
:func:`dq_flower.compression_mod`): a client owns the ``Context.state`` entries whose keys
start with its prefix. It calls :func:`begin_round` before a round's work and
:func:`end_round` once the reply is built. :func:`end_round` snapshots the live entries
(``<prefix>after@<round>/<key>``, the last :data:`STATE_HISTORY` served rounds, listed in
``<prefix>rounds``); :func:`begin_round` puts the live entries back as they were after the
latest served round before this one. So a round the server sends again (a retry, or a
replay after the server resumed from an older checkpoint) starts from the same state and
gets the same reply as the first time; a round that failed half-way leaves nothing behind.

Entries are state dicts of arrays and scalars (:func:`save_state_dict`,
:func:`load_state_dict`); :func:`encode_keeping_state` runs a stateful coder (error
feedback, PowerSGD's warm start) through one of them.
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
    """Store a state dict of arrays and scalars in ``context.state`` under ``key``.

    Arrays go to ``ArrayRecord`` ``key`` (dtype and shape kept), scalars to ``ConfigRecord``
    ``key + "-meta"``; ``None`` values are left out.
    """
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
    """A new record of the same type holding the same (immutable) items."""
    return type(record)(dict(record.items()))


def _live_keys(context: Context, prefix: str) -> list[str]:
    return [k for k in list(context.state.keys()) if k.startswith(prefix)
            and not k.startswith(prefix + "after@") and k != prefix + "rounds"]


def _snapshot_rounds(context: Context, prefix: str) -> list[int]:
    meta = context.state.config_records.get(prefix + "rounds")
    return [] if meta is None else [int(r) for r in cast(list, meta["rounds"])]


def _drop_snapshot(context: Context, rnd: int, prefix: str) -> None:
    head = f"{prefix}after@{rnd}/"
    for key in [k for k in list(context.state.keys()) if k.startswith(head)]:
        del context.state[key]


def begin_round(context: Context, server_round: int, prefix: str) -> bool:
    """Put the ``prefix`` entries where they were before ``server_round``; True if repeated.

    The live entries are restored from the snapshot taken after the latest served round
    before ``server_round`` (:func:`end_round`; none before the first), and snapshots of
    that round or later are dropped.
    """
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
        for key in [k for k in list(context.state.keys()) if k.startswith(head)]:
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
    """``coder.encode(vector, rng)``, its state loaded from and saved to entry ``key``.

    ``key`` ``None``: a stateless coder, nothing is kept.
    """
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
