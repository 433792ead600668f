"""The server's own check of raw rows, on the reference rows of nodes without the model.

A node given the model compares the model's loss on its rows raw and coded and reports a
clear gap (:mod:`dq_flower.dq.server.bit_width`); a node without it cannot, and the rows
the server holds are codes. The server asks each node whose reply said it holds no model
(a few such nodes, their rows costing no more than the model nor half the samples received
before, :meth:`ReferenceRows.ask`), once, for a few of its rows at 8 bits
(:mod:`dq_flower.wire.reference_rows`), keeps them (in checkpoints too, :meth:`state`),
and after each data round compares its model's loss on them against the same rows recoded
at the run's width as a node codes them (drawn from the run seed): pooled over every such
node's rows, the rule a node reads its own gap by (:attr:`~dq_flower.dq.raw_gap.Gap.clear`),
and more than half of those nodes' rows read worse raw on average. Since the rows are kept,
checks at later widths (4 -> 8 bits) cost no more bytes. Rows that do not read are refused
with the reason; the reply's upload is taken as before. Their bits count in the round's
``up-payload-bits`` (:func:`reference_bits`), kept or refused.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from logging import WARNING
from typing import Any

import numpy as np
from flwr.app import Message
from flwr.common.logger import log

from dq_flower.codecs import PayloadError
from dq_flower.dq.raw_gap import GAIN_MAX, Gain, Gap, gained, paired, row_gains, row_losses
from dq_flower.seeding import Purpose, round_rng
from dq_flower.server.common import log_round
from dq_flower.wire.raw_fit import ROWS_COMPARED
from dq_flower.wire.reference_rows import (
    MAX_ROWS,
    REFERENCE_INFO_KEY,
    REFERENCE_KEY,
    read_reference,
)

#: The records of reference rows in a reply
REFERENCE_KEYS = (REFERENCE_KEY, REFERENCE_INFO_KEY)
#: The most nodes asked: their rows pooled, half as many as a node holding the model
#: compares (the insurance is paid where no gap is found: 2 x 16 rows at 8 bits)
NODES = ROWS_COMPARED // (2 * MAX_ROWS)
#: The rows of every node asked cost at most this share of the samples' payload the server
#: received before the ask (at most a third of the uplink up to them, less as the run goes on)
RECEIVED_SHARE = 0.5

__all__ = ["ReferenceRows", "reference_row_bytes", "reference_bits"]


@dataclass
class ReferenceRows:
    """Who is asked for reference rows and the rows kept, by client identity."""

    wanted: set[int] = field(default_factory=set)  # identities that said they hold no model
    asked: set[int] = field(default_factory=set)  # identities asked (once)
    rows: dict[int, tuple[np.ndarray, np.ndarray]] = field(default_factory=dict)
    received: int = 0  # bits of the samples' payload of the data rounds' kept uploads

    @staticmethod
    def comparable(strategy: Any) -> bool:
        """Whether the federation's rows are compared: values coded by sample or channel."""
        spec = strategy.data.spec
        return (spec is not None and not spec.vocab and spec.target != "tokens"
                and strategy.data.mode != "feature")

    def take(self, strategy: Any, server_round: int, replies: Mapping[int, Message],
             uploads: Sequence[Any]) -> None:
        """Keep the reference rows of the round's kept ``uploads`` (``replies`` by node id)."""
        data, kept, clients, nbytes = strategy.data, 0, 0, 0
        for upload in uploads:
            self.received += int(upload.batch.payload_bits)
            (self.wanted.discard if upload.can_score else self.wanted.add)(int(upload.node))
            msg = replies.get(int(upload.source))
            if msg is None or not self.comparable(strategy):
                continue
            try:
                if int(upload.node) not in self.asked and _carries(msg):
                    raise PayloadError("sent unasked")
                found = read_reference(msg.content, data.spec, data.num_classes,
                                       data.spec.channels if data.mode == "channel" else 0)
            except (PayloadError, ValueError) as exc:
                log(WARNING, "[dq] round %d: reference rows of client %d refused: %s",
                    server_round, upload.node, exc)
                continue
            if found is not None:
                self.rows[int(upload.node)] = found
                kept, clients, nbytes = kept + len(found[0]), clients + 1, nbytes + _bytes(msg)
        if kept:
            log_round("dq", server_round, "reference rows kept from nodes without the model: "
                      f"{kept} rows ({clients} nodes), {nbytes:,} B")

    def ask(self, messages: Sequence[Message], model_bytes: int, row_bytes: int,
            identity: Callable[[int], int | None]) -> None:
        """Ask the data round's nodes that hold no model, not asked before, for their rows.

        At most :data:`NODES` nodes in a run, in the order of their node ids within a round
        (``identity``: a node id's client identity), and only as many as the rows of all
        cost at most ``model_bytes`` (one float32 copy of the model, a FedAvg upload) and at
        most :data:`RECEIVED_SHARE` of the samples' payload received so far, at
        ``row_bytes`` a row: none where one node's 16 rows cost more, more nodes as the
        uplink grows.
        """
        budget = min(model_bytes, int(RECEIVED_SHARE * self.received) // 8)
        nodes = min(NODES, budget // max(MAX_ROWS * row_bytes, 1))
        for msg in sorted(messages, key=lambda m: int(m.metadata.dst_node_id)):
            who, config = identity(int(msg.metadata.dst_node_id)), \
                msg.content.config_records["config"]
            if who is not None and who in self.wanted - self.asked \
                    and config.get("round-mode") == "data" and len(self.asked) < nodes:
                config[REFERENCE_KEY] = MAX_ROWS
                self.asked.add(who)

    def gap(self, strategy: Any, server_round: int) -> tuple[Gap | Gain, int] | None:
        """The pooled :class:`Gap` at the run's bits and the nodes whose rows read worse raw.

        Rows that are their own targets: the pooled :class:`Gain` and the nodes whose rows
        pass on over :data:`GAIN_MAX`. ``None``: no rows kept, or a figure not finite.
        """
        if not self.rows or not self.comparable(strategy):
            return None
        spec, mode = strategy.data.spec, strategy.data.mode
        quantizer = strategy.cfg.sample_quantizer(mode, spec.channels,
                                                  sample_shape=spec.sample_shape)
        raw, coded, worse, own = [], [], 0, spec.target == "inputs"
        for identity, (rows, y) in sorted(self.rows.items()):
            rng = round_rng(strategy.seed, server_round, identity, Purpose.FIDELITY)
            recoded = quantizer.decode(quantizer.encode(rows, rng)).astype(np.float32)
            losses = ([g] if (g := row_gains(strategy.model, rows, recoded, spec.sample_shape))
                      is not None else None) if own else row_losses(
                strategy.model, (rows, recoded), y, spec.sample_shape, strategy.trainer.loss_fn)
            if losses is None:
                return None
            raw.append(losses[0])
            worse += int(losses[0].mean() > (GAIN_MAX if own else losses[1].mean()))
            coded.extend(losses[1:])
        if own:
            return gained(np.concatenate(raw)), worse
        return paired(np.concatenate(raw), np.concatenate(coded)), worse

    def said(self, strategy: Any, server_round: int, bits: int) -> str | None:
        """The figures of a clear gap on the rows kept (``None``: no clear gap)."""
        found = self.gap(strategy, server_round)
        if found is None or not found[0].clear or 2 * found[1] <= len(self.rows):
            return None
        gap = found[0]
        if isinstance(gap, Gain):
            return (f"the model passes on {gap.gain:.0%} of the {bits}-bit codes' error on the "
                    f"reference rows of nodes without the model ({gap.rows} rows of "
                    f"{len(self.rows)} nodes, t {gap.t:.1f} against {GAIN_MAX:.0%}): the "
                    "rows are their own targets and it learns the codes' error as data")
        return (f"the model reads the reference rows of nodes without the model worse than "
                f"their {bits}-bit codes (loss {gap.raw:.3g} vs {gap.coded:.3g} on {gap.rows} "
                f"rows of {len(self.rows)} nodes, paired t {gap.t:.1f})")

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: who was asked and wanted, the rows, the bits received."""
        return {"wanted": sorted(self.wanted), "asked": sorted(self.asked),
                "received": self.received,
                "rows": {k: (rows.copy(), y.copy()) for k, (rows, y) in self.rows.items()}}

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ReferenceRows:
        """Inverse of :meth:`state`."""
        return cls({int(i) for i in state["wanted"]}, {int(i) for i in state["asked"]},
                   {int(k): (np.asarray(rows, np.float32), np.asarray(y))
                    for k, (rows, y) in state["rows"].items()}, int(state["received"]))


def reference_row_bytes(spec: Any, mode: str) -> int:
    """A reference row's bytes: a byte a value, a float32 minimum and step a range, a target.

    Rows that are their own targets (an autoencoder's) send none.
    """
    return spec.dim + 8 * (spec.channels if mode == "channel" else 1) + (
        0 if spec.target == "inputs" else 4 * spec.target_dim)


def reference_bits(replies: Sequence[Message], uploads: Sequence[Any]) -> int:
    """Bits of the reference rows the replies of ``uploads`` carried, kept or refused.

    As their nodes count them in their own ``up-payload-bits``.
    """
    sources = {int(u.source) for u in uploads}
    return sum(8 * _bytes(m) for m in replies
               if not m.has_error() and int(m.metadata.src_node_id) in sources)


def _carries(msg: Message) -> bool:
    """Whether a reply carries a record of reference rows."""
    return any(name in msg.content.array_records for name in REFERENCE_KEYS)


def _bytes(msg: Message) -> int:
    """Bytes of the arrays of the reference rows a reply carries (0: none)."""
    records = msg.content.array_records
    return sum(len(a.data) for name in REFERENCE_KEYS if name in records
               for a in records[name].values())
