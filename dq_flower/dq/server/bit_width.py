"""Raising ``bits = 0``'s width where the nodes report the model reads raw rows worse.

A node holding the model compares its loss on a sample of its rows raw and as the server
decodes them (:mod:`dq_flower.wire.raw_fit`) and reports only a clear gap. Where most of
a data round's replies from nodes holding the model report one, the server raises the
bits it chose (2 -> 4, then 4 -> 8) from the next round's uploads, said once with the
figures; where the user set ``bits``, it keeps them and says once that raw rows read
worse. The store keeps one width: its rows are re-laid exactly at the new one, a ``b``-bit
code ``c`` on a range the ``2b``-bit code ``c (2^b + 1)`` on the same range (each row's
step divided by ``2^b + 1``), so every stored row decodes to the value it had (up to the
float32 rounding of the step) and the checks of later replies ask for the new width.
Where the nodes hold no model, the server makes the check itself on a few rows at 8 bits
they send once (:mod:`.reference_rows`), and raises the bits by the same path. Rows that are
their own targets (an autoencoder's) are not re-laid: their codes are what the model learns
to give back, so they are dropped from the store and the nodes asked for them again at the
new width (the server's record of what it holds is what tells a node what to send). A
checkpoint keeps what the next round reads (the last data round's reports, the reference
rows) so that a resumed run decides as the run it resumes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from flwr.app import Message

from dq_flower.codecs.bitpack import pack, unpack
from dq_flower.dq.config import DQConfig, auto_bits
from dq_flower.dq.server.planner import first_estimates
from dq_flower.dq.server.reference_rows import ReferenceRows, reference_row_bytes
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.model_inputs import input_width
from dq_flower.model_ops import embedding_vocab
from dq_flower.server.common import largest_embedding, log_round
from dq_flower.wire.dq_batch import DataSpec
from dq_flower.wire.raw_fit import RawFit, raw_fit

__all__ = ["BitWidth", "auto_width", "relaid"]

#: The widest codes (a raise doubles the width up to it)
TOP_BITS = 8


def auto_width(cfg: DQConfig, model: torch.nn.Module,
               data_spec: DataSpec | None) -> tuple[DQConfig, str | None]:
    """``cfg`` with ``bits = 0`` resolved, and the note logged with the spec.

    :func:`~dq_flower.dq.config.auto_bits`; the note is ``None`` where the bits were set.
    """
    if cfg.bits != 0:
        return cfg, None
    flat = (data_spec.dim if data_spec is not None and len(data_spec.sample_shape) == 1
            else None if data_spec is not None else input_width(model))
    embedded = data_spec is None and flat is None and embedding_vocab(model) > 0
    rows = largest_embedding(model) if embedded else 0
    cfg = dataclasses.replace(cfg, bits=auto_bits(flat, rows))
    return cfg, (f"bits auto: {cfg.bits} per coordinate ("
                 + (f"flat samples of {flat} features" if flat is not None
                    else f"the model reads samples with embeddings of up to {rows} "
                    "rows: ids are sent exactly, a table's categories one code each"
                    if embedded else "samples that are not a small table") + ")")


def relaid(codes: np.ndarray, old: RowLayout, new: RowLayout) -> np.ndarray:
    """Packed rows of ``old`` (``bits`` b) as ``new`` (``2b``) codes: ``c (2^b + 1)``.

    Bytes a row holds after its codes (a :class:`~.nan_rows.NanRowLayout`'s NaN bits) stay.
    """
    n = codes.shape[0]
    head = np.ascontiguousarray(codes[:, :old.row_bytes])
    values = unpack(head.reshape(-1), old.bits, n * old.padded_dim)
    values = values.reshape(n, old.padded_dim)[:, :old.dim].astype(np.int64)
    values = np.pad(values * ((1 << old.bits) + 1), ((0, 0), (0, new.padded_dim - old.dim)))
    wide = pack(values.reshape(-1), new.bits).reshape(n, new.row_bytes)
    return np.concatenate([wide, codes[:, old.row_bytes:]], axis=1)


@dataclass
class BitWidth:
    """The run's data bits after the nodes' reports; ``auto``: chosen by ``bits = 0``."""

    auto: bool
    #: the last data round: its number, its replies and the uploads kept of them (read at
    #: the next round, or by a checkpoint taken before it: :meth:`digest`)
    last: tuple[int, Sequence[Message], Sequence[Any]] | None = None
    #: the last data round's reports of nodes holding the model and how many such nodes
    #: replied, once :meth:`digest` read them
    reports: tuple[list[RawFit], int] | None = None
    said: set[str] = field(default_factory=set)
    raised: int = 0  # the width raised to (0: never raised)
    #: the rows nodes holding no model sent, the server's own check (:mod:`.reference_rows`)
    references: ReferenceRows = field(default_factory=ReferenceRows)

    def digest(self, strategy: Any) -> None:
        """Read the last data round's replies: the nodes' reports, the reference rows kept."""
        if self.last is None:
            return
        server_round, replies, uploads = self.last
        self.last = None
        src = {int(m.metadata.src_node_id): m for m in replies if not m.has_error()}
        holding = [u for u in uploads if u.can_score]  # the nodes that could compare
        self.reports = ([f for u in holding
                         if (f := raw_fit(_metrics(src.get(int(u.source)))))], len(holding))
        self.references.take(strategy, server_round, src, uploads)

    def review(self, strategy: Any, server_round: int) -> None:
        """Read the last data round's reports; raise the bits from ``server_round`` on."""
        self.digest(strategy)
        if self.reports is None:
            return
        fits, holding = self.reports
        self.reports = None
        bits = int(strategy.cfg.bits)
        own = strategy.data.spec is not None and strategy.data.spec.target == "inputs"
        said = (_figures(fits, bits, own) if fits and 2 * len(fits) > holding
                else self.references.said(strategy, server_round, bits)
                if self.checks(strategy) else None)
        if said is None:
            return
        why = self._held(strategy, bits)
        if why is not None:
            if why not in self.said:
                self.said.add(why)
                log_round("dq", server_round - 1, f"{said}: {why}")
            return
        dropped = raise_bits(strategy, 2 * bits)
        log_round("dq", server_round - 1, f"{said}: bits {bits} -> {2 * bits} from round "
                  f"{server_round}" + (f"; the {dropped} rows stored at {bits} bits, their "
                                       "own targets, are dropped and asked for again"
                                       if dropped else ""))

    def checks(self, strategy: Any) -> bool:
        """Whether the server checks raw rows itself: bits auto that it may still raise."""
        return self.auto and self._held(strategy, int(strategy.cfg.bits)) is None \
            and self.references.comparable(strategy)

    def ask(self, strategy: Any, messages: list[Message]) -> list[Message]:
        """``messages``, those to nodes holding no model asking once for reference rows."""
        if self.checks(strategy):
            self.references.ask(messages, 4 * strategy.num_params,
                                reference_row_bytes(strategy.data.spec, strategy.data.mode),
                                strategy.identities.of)
        return messages

    def _held(self, strategy: Any, bits: int) -> str | None:
        """Why the bits stay (``None``: they are raised)."""
        cfg = strategy.cfg
        if not self.auto:
            return (f"bits stays {bits} as set; a higher `bits` (such as {min(2 * bits, 8)}) "
                    "may read them better" if bits < TOP_BITS else "bits is at its widest")
        if 2 * bits > TOP_BITS:
            return "bits is at its widest"
        if cfg.dither or cfg.store_dir or not isinstance(strategy.data.layout, RowLayout) \
                or strategy.data.layout.fixed:
            return (f"bits stays {bits} (the stored rows cannot be re-laid at another width "
                    "with dither, store-dir or a table's feature ranges); set a higher `bits`")
        return None

    def state(self, strategy: Any) -> dict[str, Any]:
        """What a checkpoint keeps, for a resumed run to decide as this one.

        The width raised to (where raised), the lines said once, the last data round's
        reports (read first: where the next round is still to read them) and the reference
        rows' state.
        """
        self.digest(strategy)
        refs = self.references
        return ({"raised-bits": self.raised} if self.raised else {}) | (
            {"said": sorted(self.said)} if self.said else {}) | (
            {"raw-reports": ([tuple(f) for f in self.reports[0]], self.reports[1])}
            if self.reports is not None else {}) | (
            {"reference-rows": refs.state()} if refs.wanted or refs.received else {})

    def load(self, strategy: Any, state: dict) -> None:
        """Take a checkpoint's raised width (before its layout is checked) and the rest."""
        if "raised-bits" in state and self.auto:
            raise_bits(strategy, int(state["raised-bits"]))
        self.said |= set(state.get("said", ()))  # each "bits stays" line once a run
        if "raw-reports" in state:
            fits, holding = state["raw-reports"]
            self.reports = ([RawFit(*f) for f in fits], int(holding))
        if "reference-rows" in state:
            self.references = ReferenceRows.from_state(state["reference-rows"])


def _metrics(msg: Message | None):
    return None if msg is None else msg.content.metric_records.get("metrics")


def _figures(fits: list[RawFit], bits: int, own: bool = False) -> str:
    """The reports in one sentence: losses (``own``: shares passed on) pooled over the rows."""
    rows = sum(f.rows for f in fits)
    raw = sum(f.raw * f.rows for f in fits) / rows
    coded = sum(f.coded * f.rows for f in fits) / rows
    if own:
        return (f"the model passes on {raw:.0%} of the nodes' {bits}-bit codes' error (over "
                f"{coded:.0%} on {rows} rows of {len(fits)} nodes): the rows are their own "
                "targets and it learns the codes' error as data")
    return (f"the model reads nodes' raw rows worse than their {bits}-bit codes (the nodes' "
            f"loss {raw:.3g} vs {coded:.3g} on {rows} rows of {len(fits)} nodes)")


def raise_bits(strategy: Any, bits: int) -> int:
    """Every part of ``strategy`` on ``bits``; the stored rows re-laid (:func:`relaid`).

    Rows that are their own targets are dropped instead; returns how many (0: none).
    """
    old_cfg = strategy.cfg
    if bits == old_cfg.bits:
        return 0
    cfg = dataclasses.replace(old_cfg, bits=bits)
    intake = strategy.intake
    for part in (strategy, intake, strategy.asks, strategy.trainer, strategy.metrics,
                 strategy.compensations, strategy.gradients):
        if getattr(part, "cfg", None) is old_cfg:
            part.cfg = cfg
    intake._rules = dataclasses.replace(intake._rules, bits=bits)
    strategy.widths.raised = bits
    data, old = strategy.data, strategy.data.layout
    if not isinstance(old, RowLayout) or data.store is None:
        return 0  # no rows yet: the store is laid at ``bits`` when the spec is adopted
    new = dataclasses.replace(old, bits=bits)  # a NaN-keeping layout stays one
    state, dropped = data.store.state(), 0
    if data.spec is not None and data.spec.target == "inputs":  # asked for again
        dropped = len(data.store)
        state = {k: v for k, v in state.items()
                 if k not in {f.name for f in dataclasses.fields(StoredRows)}}
    if "codes" in state:
        state["codes"] = relaid(state["codes"], old, new)
        side = np.array(state["side"], dtype=np.float32)
        side[:, old.groups:] /= np.float32((1 << old.bits) + 1)  # the steps; minimums stay
        state["side"] = side
    store = SampleStore(new.dequantize, data.store.max_samples, data.store.eviction)
    store.load_state(state)
    store.ranges, store.inputs_are_targets = data.store.ranges, data.store.inputs_are_targets
    data.layout, data.store = new, store
    if dropped:
        _ask_again(strategy, dropped)
    near = intake.copies.near
    if near is not None:  # the near-copy screen's reservoir, at the new width too
        near.reference = {n: relaid(r, old, new) for n, r in near.reference.items()}
        near.bits = bits
    if intake.measuring and data.spec is not None:
        est = first_estimates(cfg, data.mode, data.spec.dim, data.spec.channels,
                              data.num_classes or 2, intake.comp_codec, intake.num_params,
                              intake.seed)
        strategy.planner.sample_bits = est["sample_bits"]
        strategy.planner.reply_bits = est["reply_bits"]
    return dropped


def _ask_again(strategy: Any, dropped: int) -> None:
    """The ``dropped`` rows are the nodes' to send again.

    They are no longer counted as sent (rows evicted before stay received), and the schedule
    asks for at least as many.
    """
    data = strategy.data
    for node, counts in data.sent.items():
        counts[1] = int(data.store.received(node).size)
    schedule = strategy.trainer.schedule
    if schedule is not None:  # asking again, whatever stopped it (every row was sent)
        schedule.done, schedule.reason = False, ""
        schedule.next_total = max(schedule.next_total or 0, dropped)
