"""Majority vote's 1-bit downlink: the votes a client lacks instead of the whole model."""

from __future__ import annotations

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from dq_flower.codecs import Payload, make
from dq_flower.wire.gradient import VOTE_PREFIX, vote_from_payload
from dq_flower.wire.model import MODEL_KEY

__all__ = ["VoteDownlink", "MAX_VOTES_BEHIND"]

#: Most votes a client may be behind before the server sends the float32 model instead
#: (beyond 31 one-bit votes the 32-bit model is cheaper).
MAX_VOTES_BEHIND = 31


class VoteDownlink:
    """Which model version each node holds, and the recent votes to bring it up to date."""

    def __init__(self, dim: int) -> None:
        self.dim = int(dim)
        self.version = 0  # model updates applied so far
        self.node_version: dict[int, int] = {}
        self.votes: dict[int, ArrayRecord] = {}  # version v -> the vote taking v-1 to v

    def fill(self, node: int, content: RecordDict, full: ArrayRecord, full_bits: int,
             sign: bool) -> tuple[int | None, int]:
        """Put the model (or the votes the node lacks); ``(base version or None, bits)``."""
        held = self.node_version.get(node) if sign else None
        if (held is not None and 0 <= self.version - held <= MAX_VOTES_BEHIND
                and all(v in self.votes for v in range(held + 1, self.version + 1))):
            for v in range(held + 1, self.version + 1):
                content[f"{VOTE_PREFIX}{v}"] = self.votes[v]
            return held, self.dim * (self.version - held)
        content[MODEL_KEY] = full
        return None, full_bits

    def applied(self, record: ArrayRecord | None) -> None:
        """One model update applied; ``record`` is its vote where votes are broadcast."""
        self.version += 1
        if record is not None:
            self.votes[self.version] = record
            self.votes.pop(self.version - MAX_VOTES_BEHIND - 1, None)

    def replied(self, node: int, ok: bool) -> None:
        """A node that replied holds the current version; one that failed is unknown."""
        if ok:
            self.node_version[node] = self.version
        else:
            self.node_version.pop(node, None)

    def state_dict(self) -> dict:
        """Versions and the recent votes (as int8 signs)."""
        return {"version": self.version, "node_version": dict(self.node_version),
                "votes": {v: vote_from_payload(Payload.from_record(rec)).astype(np.int8)
                          for v, rec in self.votes.items()}}

    def load_state_dict(self, state: dict) -> None:
        """Inverse of :meth:`state_dict`."""
        self.version = int(state["version"])
        self.node_version = {int(k): int(v) for k, v in state["node_version"].items()}
        sign = make("sign")
        self.votes = {int(v): sign.encode(np.asarray(vote, np.float32)).to_record()
                      for v, vote in state["votes"].items()}
