"""Which client sent each DQ reply: node ids bound to client identities.

Node ids change when a simulation or a SuperNode restarts, so per-client state is keyed by
the client's **identity**: its ``partition-id`` metric, else its node id
(:class:`ClientIdentities`). An identity claimed by two nodes in one round is contested
and granted to neither; an identity another connected node holds is not granted either.
Such a claimant is no liar the server can tell: its reply is kept under its own node id
(and so are its later ones), so a node that claims an honest client's identity first
locks no one out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import Message

from dq_flower.codecs import PayloadError

__all__ = ["ClientIdentities", "RoundClients", "reply_identity", "IdentityTakenError",
           "reply_claims", "MAX_IDENTITY"]

#: Identities are non-negative and fit Flower's unsigned 64-bit node ids.
MAX_IDENTITY = (1 << 64) - 1


def reply_identity(metrics: Mapping[str, Any] | None, node: int) -> int:
    """The identity a reply claims: its ``partition-id`` metric (``[0, 2**64)``), else its node."""
    value = None if metrics is None else metrics.get("partition-id")
    if value is None:
        return int(node)
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_IDENTITY:
        raise PayloadError(f"'partition-id'={value!r} is not a client identity (an int in "
                           "[0, 2**64))")
    return int(value)


def reply_claims(replies: Iterable[Message]) -> list[tuple[int, int]]:
    """``(node, identity)`` each reply claims (replies with an error or a bad claim: none)."""
    out = []
    for msg in replies:
        if msg.has_error():
            continue
        src = int(msg.metadata.src_node_id)
        try:
            out.append((src, reply_identity(msg.content.metric_records.get("metrics"), src)))
        except PayloadError:
            continue
    return out


@dataclass
class RoundClients:
    """A round's sampled nodes: ``known`` (node id -> identity) and ``unknown`` node ids.

    An unknown node may be any ``free`` identity (bound to no connected node) or a
    ``spare`` placeholder (negative ints).
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


class IdentityTakenError(PayloadError):
    """The identity a node claims is another node's, or contested, this round."""


class ClientIdentities:
    """``node id <-> identity`` bindings, with the connected nodes of the current round.

    ``permanent``: an identity stays with its first node id for good (``identity-binding``
    ``node``), not only while that node is connected.
    """

    def __init__(self, permanent: bool = False) -> None:
        self.permanent = permanent
        self.identity_of: dict[int, int] = {}
        self.node_of: dict[int, int] = {}
        self.connected: set[int] = set()
        self._round = 0  # the round of the claims and contests below
        self._claims: dict[int, int] = {}
        self._contests: set[int] = set()
        #: identities two unbound nodes claim in the round's replies (:meth:`prescan`)
        self._disputed: set[int] = set()
        #: nodes kept under their own node id because a claim of theirs failed
        self.as_itself: set[int] = set()

    def _in_round(self, server_round: int) -> None:  # a new round's claims start afresh
        if self._round != server_round:
            self._round, self._claims, self._contests = server_round, {}, set()
            self._disputed = set()

    def prescan(self, server_round: int, claims: Iterable[tuple[int, int]]) -> None:
        """The round's ``(node, identity)`` claims, read before any reply is checked.

        An identity that two nodes bound to no identity claim is disputed: :meth:`resolve`
        grants it to neither, whichever reply is read first.
        """
        self._in_round(server_round)
        claimants: dict[int, set[int]] = {}
        for node, identity in claims:
            if int(node) not in self.identity_of:
                claimants.setdefault(int(identity), set()).add(int(node))
        self._disputed = {i for i, nodes in claimants.items() if len(nodes) > 1}

    def resolve(self, server_round: int, node: int, identity: int) -> tuple[int, str]:
        """The identity ``node``'s reply is kept under, and why not the one it claims ("").

        The claimed identity where :meth:`check` grants it; the node's own id where the
        identity is another node's or disputed (then, and in every later round, the node
        is itself: its replies keep arriving). A bound node claiming another identity
        (hopping) raises ``PayloadError``.
        """
        node, identity = int(node), int(identity)
        current = self.identity_of.get(node)
        if current == node and node in self.as_itself:
            return node, ""
        try:
            self._in_round(server_round)
            if current is None and identity in self._disputed:
                raise IdentityTakenError(f"client identity {identity} is claimed by two or "
                                         "more nodes this round: granted to none")
            self.check(server_round, node, identity)
        except IdentityTakenError as exc:
            holder = self.node_of.get(node)
            if holder is not None and holder != node:
                raise PayloadError(f"{exc}; and node id {node} is itself the identity of "
                                   f"node {holder}") from exc
            self.as_itself.add(node)
            return node, f"{exc}: its reply is kept under its own node id {node}"
        return identity, ""

    def of(self, node: int) -> int | None:
        """The identity bound to ``node``, or ``None``."""
        return self.identity_of.get(int(node))

    def observe(self, connected: Iterable[int]) -> None:
        """The nodes connected when a round is configured (a new round's claims start)."""
        self.connected = {int(n) for n in connected}

    def split(self, sampled: Iterable[int], known: Iterable[int]) -> RoundClients:
        """:class:`RoundClients` of ``sampled``; ``known``: identities the server has state of."""
        of = {int(node): self.of(node) for node in sampled}
        out = RoundClients({n: i for n, i in of.items() if i is not None},
                           [n for n, i in of.items() if i is None])
        if out.unknown:
            out.free = sorted(i for i in set(known) | set(self.node_of)
                              if self.node_of.get(i) is None
                              or (not self.permanent and self.node_of[i] not in self.connected))
            out.spare = [-1 - i for i in range(max(len(out.unknown) - len(out.free), 0))]
        return out

    def check(self, server_round: int, node: int, identity: int) -> None:
        """Raise ``PayloadError`` where ``node`` may not speak for ``identity`` this round.

        A second claim makes the identity contested (both claimants' replies rejected).
        """
        node, identity = int(node), int(identity)
        current = self.identity_of.get(node)
        if current is not None and current != identity:
            raise PayloadError(f"node {node} is client {current}: a node cannot change its "
                               f"client identity (it claimed {identity})")
        bound = self.node_of.get(identity)
        if bound is not None and bound != node and self.permanent:
            raise IdentityTakenError(f"client identity {identity} belongs to node {bound} for "
                                     "good (identity-binding 'node')")
        if bound is not None and bound != node and bound in self.connected:
            raise IdentityTakenError(f"client identity {identity} belongs to node {bound}, "
                                     "which is still connected")
        self._in_round(server_round)
        claimed = self._claims.get(identity)
        if claimed is not None and claimed != node:
            self._contests.add(identity)
            raise IdentityTakenError(f"client identity {identity} is contested this round by "
                                     f"nodes {claimed} and {node}: granted to neither")

    def contested(self, server_round: int) -> set[int]:
        """Identities two or more nodes claimed in ``server_round`` (granted to none)."""
        return set(self._contests) if self._round == server_round else set()

    def claim(self, server_round: int, node: int, identity: int) -> None:
        """Record a valid reply's claim (later claims of the identity this round fail)."""
        self._in_round(server_round)
        self._claims[int(identity)] = int(node)

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
        return {"identity_of": dict(self.identity_of), "as_itself": sorted(self.as_itself)}

    def load_state(self, state: Mapping[str, Any] | None) -> None:
        """Inverse of :meth:`state` (``None``: no bindings, an older checkpoint)."""
        self.identity_of, self.node_of = {}, {}
        for node, identity in (state or {}).get("identity_of", {}).items():
            self.bind(int(node), int(identity))
        self.as_itself = {int(n) for n in (state or {}).get("as_itself", [])}
