"""The server's intake of DQ data replies: what it learns from them, the checks, the store.

:class:`UploadIntake` checks each reply alone (under the identity :mod:`.federation` grants
it), then with the round's others; a spec or bound learned from replies stays provisional
until rows are stored. :class:`Compensations` screens compensations and refreshed residuals.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import suppress
from dataclasses import replace
from logging import ERROR, WARNING
from operator import attrgetter
from typing import Any

import numpy as np
import torch
from flwr.app import Message
from flwr.common.logger import log

from dq_flower.codecs import Codec, Payload, PayloadError
from dq_flower.dq.config import DQConfig
from dq_flower.dq.server import token_intake
from dq_flower.dq.server.control_variate import ControlVariate
from dq_flower.dq.server.disk_store import DiskSampleStore, StoreDiskError
from dq_flower.dq.server.federation import Asked, ClientIdentities, FederationData, reply_identity
from dq_flower.dq.server.holdout import choose_holdout
from dq_flower.dq.server.nan_rows import NanRowLayout
from dq_flower.dq.server.near_copies import CopyScreen
from dq_flower.dq.server.planner import UploadPlanner, first_estimates
from dq_flower.dq.server.round_metrics import spec_text
from dq_flower.dq.server.store import RowLayout, SampleStore, StoredRows
from dq_flower.dq.server.store_lock import lock_store_dir
from dq_flower.dq.server.token_intake import layout_of, table_reader, whole_number_vocab
from dq_flower.dq.server.validation import (
    SHARE_FACTOR,
    VALUE_FACTOR,
    History,
    OverBoundError,
    Rules,
    Upload,
    agree,
    check_upload,
    keep_rows,
    kept_rows,
)
from dq_flower.losses import follow_targets
from dq_flower.model_check import check_model, placeholder_rows
from dq_flower.model_inputs import keeps_nan, nan_refusal, one_input_reason
from dq_flower.model_ops import LossFn, output_width
from dq_flower.server.common import log_rejected, log_round
from dq_flower.server.robust import NormScreen, bound_vectors
from dq_flower.wire.dq_batch import DataSpec, SampleBatch, as_float_targets, range_mode, reply_spec
from dq_flower.wire.targets import label_base, model_targets, retyped

__all__ = ["UploadIntake", "Compensations"]

Packed = tuple[np.ndarray, np.ndarray, np.ndarray]  # a batch's stored rows: codes, side, dither


class UploadIntake:
    """Check data replies, learn the data spec from them, and store their rows.

    ``comp_codec`` decodes compensations and refreshed residuals of ``num_params`` values;
    with ``measuring`` (gradient and auto modes) reply sizes feed the planner.
    """

    def __init__(self, cfg: DQConfig, model: torch.nn.Module, data: FederationData, *,
                 loss_fn: LossFn | None, seed: int, planner: UploadPlanner,
                 identities: ClientIdentities, comp_codec: Codec | None, num_params: int,
                 measuring: bool, holdout_key: int | None = None) -> None:
        self.cfg, self.model, self.loss_fn, self.seed = cfg, model, loss_fn, seed
        self.adaptive = cfg.adaptive  # whether stored rows are held out (read once)
        self.holdout_key = seed if holdout_key is None else holdout_key  # strategy.holdout_key
        self.planner, self.identities = planner, identities
        self.comp_codec, self.num_params, self.measuring = comp_codec, num_params, measuring
        self.data, self.noted = data, set[tuple[int, str]]()  # nodes told of a bound
        #: the knobs every reply is checked against (:meth:`rules` adds what was learned)
        self._rules = Rules(cfg.bits, cfg.dither, cfg.selection_rule, cfg.ranges, cfg.resend,
                            comp_codec=comp_codec, num_params=num_params, measuring=measuring,
                            refresh=cfg.compensation_mode != "first-step")
        #: the model on each reply's table rows (one reading embeddings); its pad id for short rows
        self.read_rows, self.pad = table_reader(model, loss_fn), token_intake.pad_id(model)
        #: how ``bits = 0`` was resolved, logged once the samples are known not to be tokens
        self.bits_note: str | None = None
        #: each client's rows that copy rows it sent before (dq.server.node_screen)
        self.copies = CopyScreen(cfg.copy_margin, bits=cfg.bits)
        #: one run per store-dir: a second process's run is refused here, before any round
        self.store_lock = lock_store_dir(cfg.store_dir) if cfg.store_dir else None

    # ------------------------------------------------------------------ the data spec
    def fix_spec(self, spec: DataSpec, classes: int | None = None,
                 provisional: bool = False) -> None:
        """Adopt ``spec`` and set up the store.

        ``classes``: from the model check of the replies' rows (``None``: checked on zero
        rows here); ``provisional``: agreed by a round's replies (``forget_unconfirmed``).
        """
        follow_targets(self.loss_fn, spec)  # the default loss, a column the user's reads
        if classes is None:
            classes = check_model(self.model, spec, *placeholder_rows(spec),
                                  self.data.num_classes, self.loss_fn)
        cfg = self.cfg
        tokens = spec.target == "tokens"  # token windows: ids as bytes, no ranges
        id_rows = tokens or spec.vocab > 0  # id samples too
        mode = "sample" if id_rows else range_mode(cfg.ranges, spec.sample_shape, spec.mixed_units)
        groups = spec.channels if mode == "channel" else 1
        layout = layout_of(spec) if id_rows else (  # rows keeping NaN: where, beside them
            NanRowLayout if keeps_nan(self.model, spec) else RowLayout)(
            spec.dim, cfg.bits, groups, mode == "feature", groups > 1 and spec.channels_last)
        limits: dict[str, Any] = {"max_samples": cfg.max_store_samples,
                                  "eviction": cfg.store_eviction, "seed": self.seed}
        store = (DiskSampleStore(layout.dequantize, cfg.store_dir, **limits)
                 if cfg.store_dir  # the codes on disk, the rest in memory
                 else SampleStore(layout.dequantize, **limits))
        store.inputs_are_targets = tokens  # a window is its own target
        self.data.adopt(spec, classes, mode, layout, store, provisional)
        if self.measuring and self.planner.sample_bits == 0.0:
            est = first_estimates(cfg, mode, spec.dim, spec.channels,
                                  self.data.num_classes or 2, self.comp_codec, self.num_params,
                                  self.seed)
            self.planner.sample_bits = est["sample_bits"]
            self.planner.reply_bits = est["reply_bits"]
        if tokens:  # no quantizer: bits and ranges are not used
            log_round("dq", 0, f"data: token windows of {spec.sample_shape[0]} ids, vocabulary "
                      f"{spec.target_dim}, coded losslessly (no quantizer: bits and value "
                      "bounds do not apply)")
        else:
            if self.bits_note and not id_rows:
                log_round("dq", 0, self.bits_note)
            log_round("dq", 0, spec_text(spec, mode, self.data.num_classes, self.data.whole_vocab,
                                         getattr(self.loss_fn, "user", 0) is None))

    # ------------------------------------------------------------------ one reply
    def rules(self) -> Rules:
        """What a reply is checked against (a provisional spec or bound is not enforced)."""
        data = self.data
        unconfirmed, provisional = data.stored == 0, data.provisional
        return replace(self._rules, num_classes=data.num_classes,
                       spec=None if unconfirmed and provisional["spec"] else data.spec,
                       value_bound=(None if unconfirmed and provisional["bound"]
                                    else data.value_bound),
                       refresh=self._rules.refresh and data.store is not None)

    def history(self, node: int) -> History:
        """What the server holds about ``node``: examples, rows, feature ranges, ids, weight."""
        known, store, spec = self.data.sent.get(int(node)), self.data.store, self.data.spec
        if store is None or spec is None:
            return History(known[0] if known else 0)
        strata = np.arange((self.data.num_classes or 1) if spec.target == "class" else 1)
        stored, received, weight = store.holding(node, strata)
        return History(known[0] if known else 0, stored, store.ranges.get(int(node)),
                       received, weight)

    def validate_reply(self, msg: Message, server_round: int, asked: Asked,
                       rules: Rules | None = None) -> Upload:
        """:meth:`validate` a data reply under the identity it claims; ``rules``: the round's."""
        src = int(msg.metadata.src_node_id)
        claimed = reply_identity(msg.content.metric_records.get("metrics"), src)
        identity, why = self.identities.resolve(server_round, src, claimed)
        if why:
            log(WARNING, "[dq] round %d: %s", server_round, why)
        checked = rules or self.rules()
        def check(spec: DataSpec | None) -> Upload:  # by ``spec`` (a short id row's own)
            return check_upload(msg.content, identity, replace(checked, spec=spec),
                                self.history(identity), asked.rows(src, identity), src)

        try:  # id rows shorter than the spec's (a model with padding_idx): read, then padded
            upload = (check(checked.spec) if self.pad is None
                      else token_intake.read_padded(check, msg.content, checked.spec, self.pad))
        except PayloadError as exc:  # targets typed otherwise, values over the bound: ask
            with suppress(PayloadError, KeyError, TypeError, ValueError):
                self.data.retype_if(reply_spec(msg.content, None), output_width(self.model) or 0)
            if isinstance(exc, OverBoundError):
                self.data.ask_within_bound(src)
            raise
        if upload.batch.nan is not None and (refusal := nan_refusal(self.model, upload.spec)):
            raise PayloadError(refusal)  # a NaN mask where no row may keep its NaN values
        self.identities.claim(server_round, src, identity)
        if upload.resent:  # rows the server already held: dropped
            self.data.count_duplicates(upload.resent)
            log_round("dq", server_round, f"client {identity} (node {src}) re-sent "
                      f"{upload.resent} rows the server holds: those rows are dropped")
        return upload

    # ------------------------------------------------------------------ the round's replies
    def adopt(self, uploads: list[Upload], rejected: int) -> tuple[list[Upload], int]:
        """The uploads the round agrees on (:func:`~.validation.agree`), ``rejected`` + others."""
        self.data.forget_unconfirmed()
        if self.data.spec is None:  # targets typed as the loss reads them, id rows padded
            base = 0 if getattr(self.loss_fn, "user", None) is not None else label_base(
                [u.batch.labels for u in uploads if u.spec], output_width(self.model) or 0)
            uploads = token_intake.padded_to_longest([self._typed(u, base) for u in uploads],
                                                     self.pad)
            uploads = [replace(u, spec=s) for u, s in zip(  # 0/1 floats beside floats
                uploads, as_float_targets([u.spec for u in uploads]), strict=True)]
        known = {int(n): int(v[0]) for n, v in self.data.sent.items() if v[0] > 0}
        sent = {int(n): int(v[1]) for n, v in self.data.sent.items()}
        verdict = agree(uploads, self.rules(), known, self._check, sent, self.read_rows)
        for upload, reason in verdict.refused:
            log_rejected(upload.source, reason)
            if verdict.value_bound is not None and upload.scale > verdict.value_bound:
                self.data.ask_within_bound(upload.source)  # its rows within it, next round
        reasons = {reason for _, reason in verdict.refused}
        if len(verdict.refused) > 1 and not verdict.accepted and len(reasons) == 1 and \
                self.data.spec is None and not (self.data.model_outputs or self.data.one_input):
            log(ERROR, "every reply of the round failed the server's model check the same way "
                "(%s): the model (or loss_fn) the strategy was given, not the nodes' data, is "
                "the likely cause (see docs/plugin.md, your own model and data)", reasons.pop())
        if verdict.spec is not None and not self.data.whole_vocab and (vocab := whole_number_vocab(
                self.model, verdict.spec, [u.x for u in verdict.accepted])):
            self.data.ask_ids(vocab)
            for upload in verdict.accepted:
                log_rejected(upload.source, "the model casts its samples to whole numbers: they "
                             f"are asked as ids below {vocab}, exactly, from the next round")
            return [], rejected + len(verdict.refused) + len(verdict.accepted)
        said = list(verdict.counted) + [
            (u, f"its weight is clipped to {SHARE_FACTOR:g} times the median node's examples or "
                f"the rows it has sent, the larger (x{u.weight_scale:.3g})")
            for u in verdict.accepted if u.weight_scale < 1.0]
        for upload, why in said:  # an honest large site's count and weight: each said once
            if (upload.source, why[:12]) not in self.noted:
                self.noted.add((upload.source, why[:12]))
                log(WARNING, "reply from node %d: %s; said once", upload.source, why)
        if verdict.spec is not None:
            self.fix_spec(verdict.spec, verdict.classes, provisional=True)
        for upload, _ in verdict.refused:  # targets typed otherwise than the agreed spec's
            self.data.retype_if(upload.spec, output_width(self.model) or 0)
        if verdict.value_bound is not None:
            self.data.learn_bound(verdict.value_bound)
            log_round("dq", 0, f"data values bounded by {self.data.value_bound:g} (max-abs-value: "
                      f"{VALUE_FACTOR:g} times the median upload's largest)")
        return verdict.accepted, rejected + len(verdict.refused)

    def _typed(self, u: Upload, base: int = 0) -> Upload:
        """``u``'s targets typed as the loss reads them (labels less ``base``); asked so."""
        outputs = output_width(self.model) or 0
        got = (retyped(u.spec, u.batch.labels, outputs, getattr(self.loss_fn, "user", None),
                       base) if u.spec and len(u.batch) else None)
        if got is None:
            return u
        if base > self.data.label_base:  # said once
            log(WARNING, "[dq] labels run from 1 to %d, the model's outputs: read as counted "
                "from 1, as cross_entropy(out, y - 1) reads them (else pass loss_fn)", outputs)
        self.data.ask_model_targets(outputs, base)
        return replace(u, batch=replace(u.batch, labels=got[0]), spec=got[1])

    def _check(self, spec: DataSpec, upload: Upload) -> int:
        """The model check (:func:`check_model`): classes; a refusal may ask nodes otherwise."""
        follow_targets(self.loss_fn, spec)  # the spec on trial
        try:
            return check_model(self.model, spec, upload.x, upload.batch.labels,
                               self.data.num_classes, self.loss_fn)
        except PayloadError as exc:
            if (why := one_input_reason(self.model, spec.inputs)) is not None:
                self.data.ask_one_input()
                raise PayloadError(f"{exc}: {why}") from exc
            outputs = output_width(self.model) or 0
            labels = np.asarray(upload.batch.labels)
            if spec.target == "tokens" or (typed := model_targets(labels, outputs)) is labels:
                raise
            self.data.ask_model_targets(outputs)
            raise PayloadError(f"{exc}: its targets fit the model's {outputs} output(s) as "
                               + ("float targets" if typed.dtype.kind == "f" else
                                  "class labels") + "; the next rounds ask for them so") from exc

    def store_uploads(self, uploads: list[Upload],
                      server_round: int = 0) -> tuple[list[Upload], int]:
        """Store the accepted uploads' rows: the uploads stored, and the number that failed.

        A failure rejects the upload; a copying client's copies are not stored. The server's
        own disk refusing rows (:class:`StoreDiskError`) stops the run, every row kept.
        """
        packed: list[tuple[Upload, Packed | None, np.ndarray | None]] = []

        for upload in uploads:
            try:
                rows = self.packed(upload.batch, upload.plain) if len(upload.batch) else None
                copied = (None if rows is None else self.copies.copied(
                    upload.node, rows[0], rows[1], upload.batch.labels, self.data.layout))
            except Exception as exc:  # noqa: BLE001
                log_rejected(upload.source, f"store insertion failed: {type(exc).__name__}: {exc}")
                continue
            packed.append((upload, rows, copied))
        copying = self.copies.review(server_round)
        means = [float(u.batch.weights.mean()) for u, _, c in packed
                 if c is not None and u.node not in copying]  # copied: of stored rows
        cap = float(np.median(means)) if means else None
        fresh: list[Upload] = []
        for upload, rows, copied in packed:
            try:
                if rows is not None:
                    assert self.data.store is not None and copied is not None
                    if upload.node in copying:
                        upload, rows = self.drop_copies(upload, rows, copied, cap)
                    stored = self.rows(upload.batch, upload.node, packed=rows)
                    if len(stored):
                        self.data.store.add(stored)
                    upload = replace(upload, holdout=stored.holdout)
            except StoreDiskError as exc:
                log(ERROR, "[dq] round %d: the server's disk: %s", server_round, exc)
                raise
            except Exception as exc:  # noqa: BLE001
                log_rejected(upload.source, f"store insertion failed: {type(exc).__name__}: {exc}")
                continue
            if upload.ranges is not None and self.data.store is not None:
                self.data.store.set_ranges(upload.node, *upload.ranges)
            fresh.append(upload)
        return fresh, len(uploads) - len(fresh)  # every other upload failed

    def drop_copies(self, upload: Upload, rows: Packed, copied: np.ndarray,
                    cap: float | None) -> tuple[Upload, Packed]:
        """A copying client's ``upload`` and packed ``rows`` without the ``copied`` ones.

        The copies count as received; the rest weigh at most ``cap`` (the median client's).
        """
        assert self.data.store is not None
        self.data.store.note_received(upload.node, upload.batch.ids[copied])
        self.data.count_duplicates(int(copied.sum()))
        keep = ~copied
        batch = keep_rows(upload.batch, keep)
        if cap is not None:
            batch = replace(batch, weights=np.minimum(batch.weights, np.float32(cap)))
        upload = replace(upload, batch=batch, x=upload.x[keep],
                         copies=upload.copies + int(copied.sum()))
        return upload, (rows[0][keep], rows[1][keep], rows[2][keep])

    def packed(self, batch: SampleBatch, samples: Payload | None = None) -> Packed:
        """The batch's rows (``samples``: as checked) in the store's layout, kept rows only."""
        assert self.data.layout is not None
        codes, side, dither = self.data.layout.rows(batch.samples if samples is None else samples)
        if isinstance(self.data.layout, NanRowLayout):  # where each row holds NaN, after it
            codes = self.data.layout.with_holes(codes, batch.nan)
        kept = kept_rows(batch)  # a reply whose rows the server already held lost those
        return (codes, side, dither) if kept is None else (codes[kept], side[kept], dither[kept])

    def rows(self, batch: SampleBatch, node: int, packed: Packed) -> StoredRows:
        """The store's rows of a checked batch of client ``node``, ``packed`` by :meth:`packed`."""
        assert self.data.store is not None
        codes, side, dither = packed
        n = codes.shape[0]  # the batch's rows
        holdout = None
        if self.adaptive:
            holdout = choose_holdout(batch.labels, batch.ids, node, self.cfg.holdout_fraction,
                                     self.holdout_key, self.data.store.counts)
        labels = np.zeros(n, np.int64) if self.data.store.inputs_are_targets else batch.labels
        return StoredRows(codes, side, labels, batch.weights,
                          np.full(n, node, dtype=np.uint64), batch.ids, dither, holdout)

    def measure_data(self, fresh: list[Upload]) -> None:
        """Record what the replies carried (the planner: what they cost); bind their node ids."""
        for u in fresh:
            self.identities.bind(u.source, u.node)
            self.data.record_sent(u.node, u.examples, len(u.batch) + u.copies, u.claimed)
        if not self.measuring:
            return
        if full := [u for u in fresh if len(u.batch)]:
            samples = [u.batch.samples.nbits + u.batch.info_nbits for u in full]
            rest = [u.reply_bits - s for u, s in zip(full, samples, strict=True)]
            self.planner.measured(sample_bits=sum(samples) / sum(len(u.batch) for u in full),
                                  reply_bits=float(np.median(rest)))

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What was learned (:meth:`FederationData.state`) and the copy screen."""
        return {**self.data.state(), "copy_screen": self.copies.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict` (a spec is adopted again, checked on zero rows)."""
        self.data.load_state(state, self.fix_spec)
        self.copies.load_state(state.get("copy_screen"))


# ------------------------------------------------------------------ compensations
class Compensations:
    """The norm screens of compensations and refreshed residuals, and the control variate.

    Each kind is screened against its round's others and clipped; with ``compensation-mode``
    ``store`` or ``refresh`` the accepted ones enter the control variate.
    """

    def __init__(self, cfg: DQConfig, num_params: int, data: FederationData) -> None:
        self.cfg, self.data = cfg, data
        self.cv = (ControlVariate(num_params, cfg.compensation_decay)
                   if cfg.compensation_mode != "first-step" else None)
        self.comp_norms = NormScreen(cfg.norm_bound_factor, round_first=True)
        self.refresh_norms = NormScreen(cfg.norm_bound_factor, round_first=True)

    def _screen(self, uploads: list[Upload], get: Callable[[Upload], np.ndarray | None],
                put: Callable[[Upload, np.ndarray | None], Upload], screen: NormScreen,
                what: str) -> tuple[list[Upload], list[int]]:
        """The uploads' vectors (``get``, ``put``) clipped (``None``: rejected); the rejected."""
        vectors = [get(u) for u in uploads]
        having = [i for i, v in enumerate(vectors) if v is not None]
        out = list(uploads)
        if not having:
            return out, []
        bounded = bound_vectors([v for v in vectors if v is not None], [1.0] * len(having),
                                screen, clip_factor=self.cfg.clip_factor,
                                clip_norm=self.cfg.clip_norm)
        kept, rejected = iter(bounded.vectors), []
        for i, k in zip(having, bounded.keep, strict=True):
            out[i] = put(uploads[i], next(kept) if k else None)
            if not k:
                rejected.append(i)
                log_rejected(uploads[i].node, f"{what} is implausibly large against the "
                             "other clients' (norm-bound-factor)")
        return out, rejected

    def screen_deltas(self, uploads: list[Upload]) -> tuple[list[Upload], int]:
        """Drop uploads whose compensation norm is implausible; clip the others'."""
        screened, bad = self._screen(uploads, attrgetter("delta"), lambda u, v: replace(u, delta=v),
                                     self.comp_norms, "compensation norm")
        return [u for i, u in enumerate(screened) if i not in set(bad)], len(bad)

    def update_control_variate(self, fresh: list[Upload]) -> tuple[int, int]:
        """Age the control variate, enter the round's screened refreshes and deltas.

        Called before the round's rows are stored (a refresh replaces the share of exactly
        the node's earlier rows). Returns ``(refreshed, rejected refreshes)``.
        """
        if self.cv is None:
            return 0, 0
        self.cv.age()
        fresh, bad = self._screen(fresh, attrgetter("refresh"), lambda u, v: replace(u, refresh=v),
                                  self.refresh_norms, "refreshed residual's norm")
        refreshed, store = 0, self.data.store
        for u in fresh:
            if u.refresh is not None and store is not None:
                self.cv.replace(u.node, u.refresh, store.node_weight(u.node))
                refreshed += 1
            if u.delta is not None and len(u.batch):
                self.cv.add(u.node, u.delta, float(u.batch.weights.sum()))
        return refreshed, len(bad)

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The two norm screens' histories and the control variate."""
        return {"refresh_norms": self.refresh_norms.state_dict(),
                "comp_norms": self.comp_norms.state_dict(),
                "control_variate": None if self.cv is None else self.cv.state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state_dict`."""
        self.refresh_norms.load_state_dict(state.get("refresh_norms", {}))
        self.comp_norms.load_state_dict(state.get("comp_norms", {}))
        if self.cv is not None and state.get("control_variate") is not None:
            self.cv.load_state(state["control_variate"])
