"""What the server knows of the federation: which node is which client, their data, asks.

Node ids change when a simulation or a SuperNode restarts, so per-client state is keyed by
the client's **identity**: its ``partition-id`` metric, else its node id
(:class:`ClientIdentities`). An identity claimed by two nodes in one round, or held by
another connected node, is granted to neither: the reply is kept under its own node id (and
so are its later ones), so a node claiming an honest client's identity locks no one out.

:class:`FederationData` holds the data's spec, layout, store and bounds, what each client
holds and sent, and how its nodes answered their asks; :class:`Asked`, what a round asked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Message

from dq_flower.codecs import PayloadError
from dq_flower.dq.server.store import RowLayout, SampleStore
from dq_flower.dq.server.token_intake import TokenLayout
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.targets import retypes_to

__all__ = ["FederationData", "ClientIdentities", "RoundClients", "Asked", "reply_identity",
           "IdentityTakenError", "reply_claims", "MAX_IDENTITY"]

@dataclass
class FederationData:
    """What the server knows of the federation's data; only its own methods write it.

    A spec or value bound learned from replies is provisional: :meth:`forget_unconfirmed`
    drops it while no row is stored.
    """

    num_classes: int | None = None
    value_bound: float | None = None  # largest absolute value an upload may decode to
    spec: DataSpec | None = None
    mode: str = "sample"  # range mode of the uploads: sample, channel or feature
    layout: RowLayout | TokenLayout | None = None
    store: SampleStore | None = None
    duplicates: int = 0  # rows of this round's replies the server already held
    model_outputs: int = 0  # the outputs nodes are asked to type their targets for
    label_base: int = 0  # class labels counted from it: nodes asked for labels less it
    pin_units: bool = False  # nodes are told the spec's mixed units (one measured otherwise)
    whole_vocab: int = 0  # ids asked of every node: the model reads its samples as such
    one_input: bool = False  # nodes asked for (x, y) of their tensors: the model takes one
    over_bound: set[int] = field(default_factory=set)  # nodes asked for rows within the bound
    #: per client (identity): ``[examples it holds, rows it sent]``, from its valid replies
    sent: dict[int, list[int]] = field(default_factory=dict)
    #: rows the clients' ``num-examples`` grew by from one reply to a later one (a stream)
    grown: int = 0
    #: a data round has asked the nodes for rows holding NaN (``nan-mask``)
    masked: bool = False
    #: per client: the ``num-examples`` it last reported, before any bound took it down
    claims: dict[int, int] = field(default_factory=dict)
    provisional: dict[str, bool] = field(default_factory=lambda: dict(spec=False, bound=False))
    can_score: set[int] = field(default_factory=set)  # clients whose replies hold the model
    #: node id -> (its asks failed in a row, the round of the last)
    failing: dict[int, tuple[int, int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._given_classes = self.num_classes  # what forgetting a learned spec goes back to

    @property
    def ranges(self) -> dict[int, tuple[np.ndarray, ...]]:
        """Each client's feature ranges ``(lo, span[, scale])``, kept by the store."""
        return {} if self.store is None else self.store.ranges

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return 0 if self.store is None else len(self.store)

    def adopt(self, spec: DataSpec, classes: int | None, mode: str,
              layout: RowLayout | TokenLayout, store: SampleStore,
              provisional: bool = False) -> None:
        """Take ``spec``, its layout and store (``provisional``: learned from replies)."""
        if spec.target == "class":  # ``classes``: what the model check gave
            self.num_classes = classes
        self.spec, self.mode, self.layout, self.store = spec, mode, layout, store
        self.provisional["spec"] = provisional

    def learn_bound(self, bound: float) -> None:
        """Take the value bound the round's replies agreed on (provisional)."""
        self.value_bound, self.provisional["bound"] = bound, True

    def ask_model_targets(self, outputs: int, base: int = 0) -> None:
        """Ask every node from the next round on to type its targets for ``outputs`` outputs."""
        self.model_outputs, self.label_base = outputs, max(base, self.label_base)

    def ask_within_bound(self, node: int) -> None:
        """Ask Flower node ``node`` from the next round on for its rows within the bound."""
        self.over_bound.add(int(node))

    def ask_one_input(self) -> None:
        """Ask every node from the next round on for ``(x, y)`` of its tensors, no more."""
        self.one_input = True

    def ask_ids(self, vocab: int) -> None:
        """Ask every node from the next round on for its samples as ids below ``vocab``."""
        self.whole_vocab = int(vocab)

    def retype_if(self, reply: DataSpec | None, outputs: int) -> None:
        """Ask for targets typed for the model where ``reply`` differs from the spec in that.

        A CSV's class labels read as floats beside integer ones (or integer targets beside
        float ones, one output) join retyped (:func:`~dq_flower.wire.targets.model_targets`);
        rows that alone measure other units (:func:`~.affine.mixed_scales`): the spec's told.
        """
        known = self.spec
        if (known is not None and reply is not None and reply != known and retypes_to(
                reply.target, known.target, outputs) and reply.sample_shape == known.sample_shape
                and reply.vocab == known.vocab and reply.target_dim == known.target_dim == 1):
            self.ask_model_targets(outputs)
        if known is not None and reply is not None and reply != known \
                and dataclasses.replace(reply, mixed_units=known.mixed_units) == known:
            self.pin_units = True  # its rows measured otherwise: tell every node the spec's

    def forget_unconfirmed(self) -> None:
        """Forget a spec and bound learned from replies while no row of them is stored."""
        if not self.stored and self.provisional["spec"]:
            self.spec, self.layout, self.store, self.mode = None, None, None, "sample"
            self.num_classes = self._given_classes
        if not self.stored and self.provisional["bound"]:
            self.value_bound = None
        self.provisional = {"spec": False, "bound": False}

    def record_sent(self, node: int, examples: int, rows: int, claimed: int | None = None) -> None:
        """A valid reply of ``node``: the examples it holds and ``rows`` more it sent.

        ``claimed``: its reported count where a bound took ``examples`` down (the bound moves).
        A reported count above the last is data that grew (:attr:`grown`): every client may
        then hold rows the server has not seen.
        """
        node, claimed = int(node), int(examples if claimed is None else claimed)
        before = self.sent.get(node, [0, 0])
        last = self.claims.get(node, before[0])
        if node in self.sent and claimed > last:  # a site that held none too
            self.grown += claimed - last
        self.claims[node] = claimed
        self.sent[node] = [int(examples), before[1] + int(rows)]

    def note_asks(self, server_round: int, fruitful: set[int], fruitless: list[int]) -> None:
        """Count each node's fruitless asks in a row (failed, refused, or no row held)."""
        for node in fruitful:
            self.failing.pop(int(node), None)
        for node in fruitless:
            self.failing[int(node)] = (self.failing.get(int(node), (0, 0))[0] + 1,
                                       int(server_round))

    def note_scorers(self, clients: dict[int, bool]) -> None:
        """Remember which clients hold the model (their replies' ``can-score``)."""
        self.can_score -= {int(i) for i, can in clients.items() if not can}
        self.can_score |= {int(i) for i, can in clients.items() if can}

    def count_duplicates(self, rows: int) -> None:
        """Count ``rows`` of a reply that the server already held (dropped)."""
        self.duplicates += rows

    def take_duplicates(self) -> int:
        """Rows of the round's replies the server already held (dropped); the count restarts."""
        out, self.duplicates = self.duplicates, 0
        return out

    def shaped(self, x: np.ndarray) -> np.ndarray:
        """Flat rows shaped as the data spec's samples (batch first)."""
        assert self.spec is not None
        return x.reshape(-1, *self.spec.sample_shape)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What was learned: spec, classes, feature ranges, the store, the value bound."""
        return {"spec": None if self.spec is None else dataclasses.asdict(self.spec),
                "num_classes": self.num_classes,
                "ranges": {int(k): tuple(a.copy() for a in r) for k, r in self.ranges.items()},
                "store": None if self.store is None else self.store.state(),
                "value_bound": self.value_bound, "provisional": dict(self.provisional),
                "model_outputs": self.model_outputs, "label_base": self.label_base,
                "pin_units": self.pin_units, "whole_vocab": self.whole_vocab,
                "one_input": self.one_input, "over_bound": sorted(self.over_bound),
                "sent": {k: list(v) for k, v in self.sent.items()}, "grown": self.grown,
                "masked": self.masked,
                "claims": dict(self.claims)}

    def load_state(self, state: dict[str, Any], fix_spec: Callable[[DataSpec], None]) -> None:
        """Inverse of :meth:`state`; ``fix_spec`` adopts the spec again (a new store)."""
        self.num_classes = state.get("num_classes", self.num_classes)
        self.model_outputs, self.label_base = (int(state.get(k, 0)) for k in ("model_outputs",
                                                                             "label_base"))
        self.pin_units = bool(state.get("pin_units", False))
        self.whole_vocab = int(state.get("whole_vocab", 0))
        self.one_input = bool(state.get("one_input", False))
        self.over_bound = {int(n) for n in state.get("over_bound", ())}
        sent = state.get("sent", state.get("planner", {}).get("clients", {}))  # older: planner's
        self.sent = {int(k): [int(a), int(b)] for k, (a, b) in sent.items()}
        self.grown = int(state.get("grown", 0))
        self.masked = bool(state.get("masked", False))
        self.claims = {int(k): int(v) for k, v in state.get("claims", {}).items()}
        if (spec := state.get("spec")) is not None:  # keys an older checkpoint lacks: defaults
            fix_spec(DataSpec(**{**spec, "sample_shape": tuple(spec["sample_shape"]),
                                 "inputs": tuple(spec.get("inputs", ())),
                                 "target_shape": tuple(spec.get("target_shape", ()))}))
        if self.store is not None:
            for node, ranges in state.get("ranges", {}).items():
                self.store.set_ranges(int(node), *ranges)
            if state.get("store") is not None:
                self.store.load_state(state["store"])
        self.value_bound = state.get("value_bound", self.value_bound)
        self.provisional = {"spec": False, "bound": False, **state.get("provisional", {})}


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


@dataclass(frozen=True)
class Asked:
    """The rows a round asked: of each node, or by the table of an unnamed node's identity."""

    of_node: dict[int, int] = field(default_factory=dict)
    by_table: frozenset[int] = frozenset()  # the unnamed nodes, asked by the table
    table: dict[int, int] = field(default_factory=dict)  # identity -> its ask
    default: int = 0  # the table's ask of any other identity
    budget: int = 0  # the ask of a node the round did not ask (not configured here)

    def rows(self, node: int, identity: int) -> int:
        """The rows a reply of ``node`` speaking for ``identity`` may carry."""
        if node in self.by_table:
            return self.table.get(identity, self.default)
        return self.of_node.get(node, self.budget)


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
