"""What the server knows of the federation's data: its spec, layout, store and bounds.

Which of a client's rows are held out is drawn here too (:func:`choose_holdout`), and a
checkpoint of another seed, secret or row layout is refused (:func:`refuse_other_run`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dq_flower.dq.config import DQConfig
from dq_flower.dq.server.store import RowLayout, SampleStore, strata_of
from dq_flower.dq.server.token_intake import TokenLayout
from dq_flower.wire.dq_batch import DataSpec, range_mode
from dq_flower.wire.targets import retypes_to

__all__ = ["FederationData", "choose_holdout", "row_hash", "holdout_key", "holdout_digest",
           "SECRET_ENV", "stored_layout", "refuse_other_run"]

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


#: Held-out rows are ``round(fraction * rows)`` of each (client, class) stratum after every
#: upload: the rows with the smallest hash of ``(key, client, local id)``
#: (:func:`choose_holdout`), whatever the replies' order; with a server secret in the key
#: no client can compute which of its rows are held out.
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser, vectorised (uint64 in, uint64 out)."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _M1
        z = (z ^ (z >> np.uint64(27))) * _M2
        return z ^ (z >> np.uint64(31))


def row_hash(seed: int, node: int, ids: np.ndarray) -> np.ndarray:
    """A seeded 64-bit hash of each ``(seed, node, local id)``: the held-out draw order."""
    with np.errstate(over="ignore"):
        base = _mix(np.array([int(seed) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) + _GOLDEN)
        base = _mix(base ^ np.array([int(node) & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
        return _mix(base ^ (np.asarray(ids).astype(np.uint64) * _GOLDEN))


def choose_holdout(labels: np.ndarray, ids: np.ndarray, node: int, fraction: float,
                   seed: int, stored_counts) -> np.ndarray:
    """Boolean mask over client ``node``'s new rows (``labels``, ``ids``): the held-out ones.

    ``fraction`` of each stratum is held out, in ``[0, 1)``; ``seed`` is the hash's key;
    ``stored_counts(node, strata) -> (rows, held_out)`` counts the stored ones
    (:meth:`SampleStore.counts`).
    """
    ids = np.asarray(ids)
    mask = np.zeros(ids.shape[0], dtype=bool)
    if fraction <= 0 or not ids.size:
        return mask
    strata = strata_of(labels)
    keys = np.unique(strata)
    stored, held = stored_counts(node, keys)
    order = row_hash(seed, node, ids)
    for key, before, kept in zip(keys, stored, held, strict=True):
        rows = np.flatnonzero(strata == key)
        target = int(np.floor(fraction * (int(before) + rows.size) + 0.5)) - int(kept)
        take = min(max(target, 0), rows.size)
        if take:
            mask[rows[np.argsort(order[rows], kind="stable")[:take]]] = True
    return mask


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
    pin_units: bool = False  # nodes are told the spec's mixed units (one measured otherwise)
    whole_vocab: int = 0  # ids asked of every node: the model reads its samples as such
    one_input: bool = False  # nodes asked for (x, y) of their tensors: the model takes one
    over_bound: set[int] = field(default_factory=set)  # nodes asked for rows within the bound
    #: per client (identity): ``[examples it holds, rows it sent]``, from its valid replies
    sent: dict[int, list[int]] = field(default_factory=dict)
    #: rows the clients' ``num-examples`` grew by from one reply to a later one (a stream)
    grown: int = 0
    #: per client: the ``num-examples`` it last reported, before any bound took it down
    claims: dict[int, int] = field(default_factory=dict)
    provisional: dict[str, bool] = field(default_factory=lambda: {"spec": False,
                                                                  "bound": False})

    def __post_init__(self) -> None:
        self._given_classes = self.num_classes  # what forgetting a learned spec goes back to

    @property
    def ranges(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each client's feature ranges ``(lo, span)``, kept by the store."""
        return {} if self.store is None else self.store.ranges

    @property
    def stored(self) -> int:
        """Samples in the store."""
        return 0 if self.store is None else len(self.store)

    def adopt(self, spec: DataSpec, classes: int | None, mode: str,
              layout: RowLayout | TokenLayout, store: SampleStore,
              provisional: bool = False) -> None:
        """Take ``spec`` (``classes``: what the model check gave) with its layout and store.

        ``provisional``: learned from replies (forgotten while none of its rows is stored).
        """
        if spec.target == "class":
            self.num_classes = classes
        self.spec, self.mode, self.layout, self.store = spec, mode, layout, store
        self.provisional["spec"] = provisional

    def learn_bound(self, bound: float) -> None:
        """Take the value bound the round's replies agreed on (provisional)."""
        self.value_bound, self.provisional["bound"] = bound, True

    def ask_model_targets(self, outputs: int) -> None:
        """Ask every node from the next round on to type its targets for ``outputs`` outputs."""
        self.model_outputs = outputs

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

        A node that read its CSV's class labels as floats beside nodes with integer labels
        (or integer targets beside float ones, for one output) is refused by the spec;
        retyped for the model's outputs (:func:`~dq_flower.wire.targets.model_targets`),
        its targets join the federation's from the next round on. A node whose rows alone
        measure other units (:func:`~dq_flower.codecs.affine.mixed_scales`) is told the spec's.
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

    def held_none(self, client: int) -> bool:
        """Whether ``client`` has reported no row: a site that joins empty may hold some now."""
        return int(client) in self.sent and self.sent[int(client)][0] == 0

    def record_sent(self, node: int, examples: int, rows: int, claimed: int | None = None
                    ) -> None:
        """A valid reply of ``node``: the examples it holds and ``rows`` more it sent.

        ``claimed``: the count it reported where a bound took ``examples`` down. A reported
        count above the node's last one is data that grew (:attr:`grown`); from then on every
        client may hold rows the server has not seen. (A bound moves with the other nodes'
        counts and the rows sent: a large site reporting the same count is not growing.)
        """
        node, claimed = int(node), int(examples if claimed is None else claimed)
        before = self.sent.get(node, [0, 0])
        last = self.claims.get(node, before[0])
        if node in self.sent and claimed > last:  # a site that held none too
            self.grown += claimed - last
        self.claims[node] = claimed
        self.sent[node] = [int(examples), before[1] + int(rows)]

    def count_duplicates(self, rows: int) -> None:
        """Count ``rows`` of a reply that the server already held (dropped)."""
        self.duplicates += rows

    def take_duplicates(self) -> int:
        """Rows of the round's replies the server already held (dropped); the count restarts."""
        out, self.duplicates = self.duplicates, 0
        return out

    def may_use_feature_ranges(self, ranges: str) -> bool:
        """Whether replies may carry feature ranges under the ``ranges`` knob."""
        if self.spec is None:
            return ranges in ("auto", "feature")
        return self.mode == "feature"

    def shaped(self, x: np.ndarray) -> np.ndarray:
        """Flat rows shaped as the data spec's samples (batch first)."""
        assert self.spec is not None
        return x.reshape(-1, *self.spec.sample_shape)

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> dict[str, Any]:
        """What was learned: spec, classes, feature ranges, the store, the value bound."""
        return {"spec": None if self.spec is None else dataclasses.asdict(self.spec),
                "num_classes": self.num_classes,
                "ranges": {int(k): (lo.copy(), span.copy())
                           for k, (lo, span) in self.ranges.items()},
                "store": None if self.store is None else self.store.state(),
                "value_bound": self.value_bound, "provisional": dict(self.provisional),
                "model_outputs": self.model_outputs, "pin_units": self.pin_units,
                "whole_vocab": self.whole_vocab, "one_input": self.one_input,
                "over_bound": sorted(self.over_bound),
                "sent": {k: list(v) for k, v in self.sent.items()}, "grown": self.grown,
                "claims": dict(self.claims)}

    def load_state(self, state: dict[str, Any], fix_spec: Callable[[DataSpec], None]) -> None:
        """Inverse of :meth:`state`; ``fix_spec`` adopts the spec again (a new store)."""
        self.num_classes = state.get("num_classes", self.num_classes)
        self.model_outputs = int(state.get("model_outputs", 0))
        self.pin_units = bool(state.get("pin_units", False))
        self.whole_vocab = int(state.get("whole_vocab", 0))
        self.one_input = bool(state.get("one_input", False))
        self.over_bound = {int(n) for n in state.get("over_bound", ())}
        sent = state.get("sent", state.get("planner", {}).get("clients", {}))  # older: planner's
        self.sent = {int(k): [int(a), int(b)] for k, (a, b) in sent.items()}
        self.grown = int(state.get("grown", 0))
        self.claims = {int(k): int(v) for k, v in state.get("claims", {}).items()}
        if state.get("spec") is not None:
            spec = state["spec"]
            fix_spec(DataSpec(tuple(spec["sample_shape"]), spec["target"],
                              int(spec["target_dim"]), int(spec.get("vocab", 0)),
                              bool(spec.get("mixed_units", False)),
                              tuple(spec.get("inputs", ())), bool(spec.get("column", False))))
        if self.store is not None:
            for node, (lo, span) in state.get("ranges", {}).items():
                self.store.set_ranges(int(node), lo, span)
            if state.get("store") is not None:
                self.store.load_state(state["store"])
        self.value_bound = state.get("value_bound", self.value_bound)
        self.provisional = {"spec": False, "bound": False, **state.get("provisional", {})}
