"""Which client a Flower node is: the stable identity DQ keys its per-client state by.

Flower's node ids are not stable: the simulation engine draws new ones when it restarts,
and so may a SuperNode that restarts. DQ therefore keys everything it keeps per client
(store rows, held-out choice, feature ranges, the planner's and the adaptive schedule's
records, control-variate entries) by the client's **identity**: its
:func:`dq_flower.node.node_key`, the ``partition-id`` of its node config (which simulation
sets and a SuperNode may set with ``--node-config``), else its node id. Each reply reports
it as its ``partition-id`` metric.

The server learns ``node id -> identity`` from each accepted reply (:meth:`bind`). An
identity bound to a node id that is still connected (``grid.get_node_ids()`` when the
round was configured) cannot be taken over by another node id, and a node bound to an
identity cannot speak for another: such replies are rejected (:meth:`check`). An
identity no connected node holds that two node ids claim in the same round is
**contested**: granted to neither that round (:meth:`contested`; both replies are
rejected and the contest is logged), so a node that answers first cannot squat an honest
client's identity. Once the old node id is gone (a restart), another node id may claim
it. What this does not stop: a node claiming, before its owner has ever replied, an
identity nobody holds yet keeps it (without SuperNode authentication the server has
nothing else to tell nodes apart by).

:class:`RoundClients` splits a round's sampled nodes into those the server can name and
those it cannot (new node ids: the first round, or after any restart). The latter get a
table of every identity they may be (:mod:`dq_flower.wire.held`), and pick their own entry.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dq_flower.codecs import PayloadError

__all__ = ["ClientIdentities", "RoundClients", "reply_identity", "MAX_IDENTITY"]

#: Identities are non-negative and fit Flower's unsigned 64-bit node ids.
MAX_IDENTITY = (1 << 64) - 1


def reply_identity(metrics: Mapping[str, Any] | None, node: int) -> int:
    """The identity a reply claims: its ``partition-id`` metric, else its node id.

    ``PayloadError`` where the metric is not an int in ``[0, 2**64)``.
    """
    value = None if metrics is None else metrics.get("partition-id")
    if value is None:
        return int(node)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_IDENTITY:
        raise PayloadError(f"'partition-id'={value!r} is not a client identity (an int in "
                           "[0, 2**64))")
    return int(value)


@dataclass
class RoundClients:
    """A round's sampled nodes, split by whether the server knows which client each is.

    ``known`` maps node ids to identities; ``unknown`` lists the other node ids; ``free``
    are the identities an unknown node may be (known to the server, bound to no connected
    node); ``spare`` are placeholder keys (negative ints) for unknown nodes beyond them.
    """

    known: dict[int, int] = field(default_factory=dict)
    unknown: list[int] = field(default_factory=list)
    free: list[int] = field(default_factory=list)
    spare: list[int] = field(default_factory=list)

    @property
    def keys(self) -> list[int]:
        """The identities (and placeholders) the round's asks are shared out over."""
        named = sorted(set(self.known.values()))
        return named + (self.free + self.spare if self.unknown else [])


class ClientIdentities:
    """``node id <-> identity`` bindings, with the connected nodes of the current round.

    ``permanent``: an identity stays with the node id that first held it for good, not only
    while that node is connected (``identity-binding = "node"``).
    """

    def __init__(self, permanent: bool = False) -> None:
        self.permanent = permanent
        self.identity_of: dict[int, int] = {}
        self.node_of: dict[int, int] = {}
        self.connected: set[int] = set()
        self._claims: tuple[int, dict[int, int]] = (0, {})
        self._contests: tuple[int, set[int]] = (0, set())

    def of(self, node: int) -> int | None:
        """The identity bound to ``node``, or ``None``."""
        return self.identity_of.get(int(node))

    def observe(self, connected: Iterable[int]) -> None:
        """The nodes connected when a round is configured (a new round's claims start)."""
        self.connected = {int(n) for n in connected}

    def split(self, sampled: Iterable[int], known: Iterable[int]) -> RoundClients:
        """:class:`RoundClients` of ``sampled``; ``known``: identities the server has state of."""
        out = RoundClients()
        for node in sampled:
            identity = self.of(node)
            if identity is None:
                out.unknown.append(int(node))
            else:
                out.known[int(node)] = identity
        if out.unknown:
            out.free = sorted(i for i in set(known) | set(self.node_of)
                              if self.node_of.get(i) is None
                              or (not self.permanent and self.node_of[i] not in self.connected))
            out.spare = [-1 - i for i in range(max(len(out.unknown) - len(out.free), 0))]
        return out

    def check(self, server_round: int, node: int, identity: int) -> None:
        """Raise ``PayloadError`` where ``node`` may not speak for ``identity`` this round.

        A second node claiming an identity this round makes it contested (see the module
        docstring): this reply is rejected here, the first claimant's by the round.
        """
        node, identity = int(node), int(identity)
        current = self.identity_of.get(node)
        if current is not None and current != identity:
            raise PayloadError(f"node {node} is client {current}: a node cannot change its "
                               f"client identity (it claimed {identity})")
        bound = self.node_of.get(identity)
        if bound is not None and bound != node and self.permanent:
            raise PayloadError(f"client identity {identity} belongs to node {bound} for good "
                               "(identity-binding 'node')")
        if bound is not None and bound != node and bound in self.connected:
            raise PayloadError(f"client identity {identity} belongs to node {bound}, which is "
                               "still connected")
        rnd, claims = self._claims
        claimed = claims.get(identity) if rnd == server_round else None
        if claimed is not None and claimed != node:
            if self._contests[0] != server_round:
                self._contests = (server_round, set())
            self._contests[1].add(identity)
            raise PayloadError(f"client identity {identity} is contested this round by nodes "
                               f"{claimed} and {node}: granted to neither")

    def contested(self, server_round: int) -> set[int]:
        """Identities two or more nodes claimed in ``server_round`` (granted to none)."""
        rnd, contests = self._contests
        return set(contests) if rnd == server_round else set()

    def claim(self, server_round: int, node: int, identity: int) -> None:
        """Record a valid reply's claim (later claims of the identity this round fail)."""
        rnd, claims = self._claims
        if rnd != server_round:
            self._claims = (server_round, {})
        self._claims[1][int(identity)] = int(node)

    def bind(self, node: int, identity: int) -> None:
        """An accepted reply: ``node`` is ``identity`` (dropping either side's old binding)."""
        node, identity = int(node), int(identity)
        old_identity = self.identity_of.pop(node, None)
        if old_identity is not None and self.node_of.get(old_identity) == node:
            del self.node_of[old_identity]
        old_node = self.node_of.get(identity)
        if old_node is not None:
            self.identity_of.pop(old_node, None)
        self.identity_of[node] = identity
        self.node_of[identity] = node

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps (the bindings)."""
        return {"identity_of": dict(self.identity_of)}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Inverse of :meth:`state` (``None``: no bindings, an older checkpoint)."""
        self.identity_of, self.node_of = {}, {}
        for node, identity in (state or {}).get("identity_of", {}).items():
            self.bind(int(node), int(identity))
