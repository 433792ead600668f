"""What ties a checkpoint to the run resuming it: the seed, the held-out key, the row layout.

The held-out key (:func:`holdout_key`) comes from the seed and the server's secret; a
checkpoint of another seed, secret or row layout is refused (:func:`refuse_other_run`).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from typing import Any

from dq_flower.dq.config import DQConfig
from dq_flower.wire.dq_batch import range_mode

__all__ = ["holdout_key", "holdout_digest", "SECRET_ENV", "stored_layout", "refuse_other_run"]

#: Environment variable of the server process that holds the held-out secret, where the
#: strategy is given none (the clients never see the server's environment).
SECRET_ENV = "DQ_FLOWER_HOLDOUT_SECRET"


def holdout_key(seed: int, secret: str | None) -> int:
    """The held-out hash's key: ``seed`` without a secret, else a 64-bit digest of both.

    ``secret`` ``None`` reads :data:`SECRET_ENV` (unset or empty: none). The secret never
    leaves the server (no knob, no message).
    """
    if secret is None:
        secret = os.environ.get(SECRET_ENV) or None
    if secret is None:
        return int(seed)
    digest = hashlib.blake2b(f"{int(seed)}\0{secret}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def holdout_digest(key: int) -> str:
    """A digest of the held-out key, kept in checkpoints (another key holds out other rows)."""
    return hashlib.blake2b(str(key).encode(), digest_size=8).hexdigest()


def stored_layout(cfg: DQConfig, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The knobs that lay out the stored rows of ``spec`` (a :class:`DataSpec` as a dict).

    ``ranges`` as it resolves for ``spec``; none without a spec or for samples of ids (sent
    exactly, no quantizer).
    """
    if spec is None or spec["target"] == "tokens" or spec.get("vocab", 0):
        return {}
    return {"bits": cfg.bits, "dither": cfg.dither, "ranges": range_mode(
        cfg.ranges, tuple(spec["sample_shape"]), bool(spec.get("mixed_units", False)))}


def refuse_other_run(state: Mapping[str, Any], seed: int, digest: str,
                     layout: Mapping[str, Any]) -> None:
    """Refuse a checkpoint of another ``seed``, held-out key ``digest`` or row ``layout``.

    ``ValueError`` naming the knob and both values: its held-out rows and stored rows
    could not go on under this run's.
    """
    afresh = "or start afresh without this checkpoint"
    if int(state.get("seed", seed)) != seed:
        raise ValueError(f"seed: the checkpoint was written with seed {state['seed']}, this "
                         f"run has seed {seed}: resume with seed {state['seed']}, {afresh}")
    if state.get("holdout-check", digest) != digest:
        raise ValueError("holdout_secret: the checkpoint was written under another held-out "
                         f"secret{'' if 'seed' in state else ' or seed'} (give the run's "
                         f"secret, or the same {SECRET_ENV}, {afresh})")
    for key, saved in state.get("layout", {}).items():
        if layout.get(key, saved) != saved:
            raise ValueError(f"{key}: the checkpoint's stored rows are laid out with {key} "
                             f"{saved!r}, this run has {key} {layout[key]!r} (its rows could "
                             f"not join them): resume with {key} = {saved!r}, {afresh}")
