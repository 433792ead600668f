"""What each round asks of whom: the round's plan, per-client asks and held sets.

Asks are per client identity; a client known to have uploaded everything is not asked in a
data round. Each message names the client's rows the server holds (``held``), or, to a node
the server cannot name yet, the table of every identity it may be (``held-table``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from logging import INFO
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.common.logger import log

from dq_flower.config import write
from dq_flower.dq.config import CLIENT_KEYS, DQConfig
from dq_flower.dq.scorer_choice import (
    AUTO,
    AUTO_SCORER_KEY,
    RUN_MODEL_KNOB_KEY,
    model_knob,
    node_rule,
    node_scorer,
    run_model_knob,
)
from dq_flower.dq.server.federation import Asked, ClientIdentities, FederationData, RoundClients
from dq_flower.dq.server.planner import RoundPlan, UploadPlanner
from dq_flower.dq.server.schedule import allocate
from dq_flower.dq.server.training import ServerTrainer
from dq_flower.model_inputs import input_asks
from dq_flower.model_ops import embedding_vocab, float_buffers, output_width, reads_windows
from dq_flower.seeding import Purpose, round_rng
from dq_flower.wire.dq_batch import ID_VOCAB_KEY, MIXED_UNITS_KEY
from dq_flower.wire.held import (
    EMPTY,
    HELD_KEY,
    TABLE_KEY,
    VALUE_BOUND_KEY,
    encode_held,
    encode_table,
)
from dq_flower.wire.input_parts import NAN_MASK_KEY
from dq_flower.wire.model import MODEL_KEY
from dq_flower.wire.model_buffers import BUFFERS_KEY, buffers_record
from dq_flower.wire.targets import LABEL_BASE_KEY, MODEL_OUTPUTS_KEY

__all__ = ["RoundAsks", "ALL_ROWS"]

#: The ``all`` schedule's ask of a client whose row count the server does not know yet.
ALL_ROWS = 1 << 24
#: Asks failed in a row after which a node rests from asks (:meth:`RoundAsks.resting`):
#: never heard from, one failing every round took the whole ask, starving the others.
FAILED_ASKS = 2


class RoundAsks:
    """Each round's plan and asks, kept until the round's replies are aggregated.

    ``trainer``: the adaptive schedule and per-client fit; ``data``: the store whose held
    rows the messages name.
    """

    def __init__(self, cfg: DQConfig, planner: UploadPlanner, identities: ClientIdentities,
                 data: FederationData, model: torch.nn.Module, trainer: ServerTrainer,
                 seed: int) -> None:
        self.cfg, self.planner, self.identities, self.seed = cfg, planner, identities, seed
        self.data, self.model, self.trainer = data, model, trainer
        #: per round configured here, its plan and asks (taken by the round's replies)
        self.plans: dict[int, RoundPlan] = {}
        self.asked: dict[int, Asked] = {}
        self.held_bytes = 0  # bytes of held sets and tables the last round sent
        self._reads_windows: bool | None = None  # the model's answer (holds_windows)

    def plan(self, server_round: int, nodes: list[int],
             rounds_left: int) -> tuple[RoundClients, RoundPlan]:
        """The sampled nodes' clients and the round's plan (kept for its replies)."""
        store = self.data.store  # every client identity the server keeps state of:
        known = (set(self.data.sent) | set(self.identities.node_of)
                 | set(store.clients if store is not None else ()))
        clients = self.identities.split([int(n) for n in nodes], known)
        plan = self.planner.plan(clients.keys, rounds_left)
        self.plans[server_round] = plan
        return clients, plan

    def scorer(self) -> str:
        """The round's scorer (``uniform``: adaptive with an empty store, or fixed ``auto``)."""
        adaptive = self.trainer.schedule is not None
        if (adaptive and self.data.stored == 0) or (not adaptive and self.cfg.scorer == AUTO):
            return "uniform"
        return self.cfg.scorer

    def node_choice(self, identity: int | None, free: list[int]) -> tuple[str, str]:
        """``(scorer, selection rule)`` a node is sent this round (``auto`` resolved).

        An unnamed node (``identity`` None) is sent ``auto`` where any ``free`` identity
        holds the model.
        """
        scorer = self.scorer()
        if scorer == AUTO and identity is None:
            if any(i in self.data.can_score for i in free):
                return AUTO, self.cfg.selection_rule
            return "uniform", node_rule(self.cfg.selection_rule, "uniform")
        scorer = node_scorer(scorer, identity in self.data.can_score)
        return scorer, node_rule(self.cfg.selection_rule, scorer)

    def refresh_round(self, server_round: int) -> bool:
        """Whether clients send refreshed residuals this round (``compensation-mode``)."""
        return (self.cfg.compensation_mode == "refresh" and server_round > 1
                and server_round % self.cfg.refresh_every == 0)

    def round_config(self, server_round: int, config: ConfigRecord, plan: RoundPlan,
                     refresh: bool) -> ConfigRecord:
        """The config every node of the round gets: the client knobs and the round's own."""
        cfg = ConfigRecord(dict(config.items()))
        cfg.update(write(self.cfg, changed_only=True, keys=CLIENT_KEYS))
        cfg["server-round"] = server_round
        seed_rng = round_rng(self.seed, server_round, 0, Purpose.ROUND_SEED)
        cfg["round-seed"] = int(seed_rng.integers(2**31))
        cfg["round-mode"] = plan.mode
        if self.data.num_classes:
            cfg["num-classes"] = int(self.data.num_classes)
        if vocab := self.id_vocab():  # the samples may be ids an embedding reads
            cfg[ID_VOCAB_KEY] = vocab
        spec = self.data.spec
        if spec is not None and (spec.mixed_units or self.data.pin_units):  # its ranges, kept
            cfg[MIXED_UNITS_KEY] = spec.mixed_units  # whatever a node's rows alone say
        cfg.update(input_asks(self.model, self.data.one_input, spec))  # which inputs to send
        if self.data.model_outputs:  # the nodes' targets are typed otherwise than it reads
            cfg[MODEL_OUTPUTS_KEY] = self.data.model_outputs
            if self.data.label_base:  # labels counted from 1: each less it
                cfg[LABEL_BASE_KEY] = self.data.label_base
        if refresh:
            cfg["refresh"] = 1
        if self.cfg.scorer == AUTO:
            cfg[AUTO_SCORER_KEY] = 1
        needed = run_model_knob(self.cfg.scorer, self.cfg.compensation, self.cfg.upload_mode)
        if needed is not None:
            cfg[RUN_MODEL_KNOB_KEY] = needed
        return cfg

    def held_of(self, identity: int) -> bytes | None:
        """The held-set bytes of ``identity`` (``None`` with ``resend``: nothing to say)."""
        if self.cfg.resend:
            return None
        store = self.data.store
        return EMPTY if store is None else encode_held(store.received(identity))

    def round_asks(self, server_round: int, nodes: list[int], clients: RoundClients,
                   plan: RoundPlan, refresh: bool) -> tuple[list[int], bytes | None]:
        """The nodes asked this round, their :class:`Asked` (kept), and the unnamed nodes' table.

        The table lists each identity an unnamed node may be with its held set and ask, and
        the ask of any other; ``None`` where no such node is asked or no identity is free.
        """
        keys = clients.keys
        asks = dict.fromkeys(keys, self.cfg.budget)
        adaptive = self.trainer.schedule is not None
        screened = plan.mode == "data" and not refresh  # a refresh round asks every node
        if screened:  # adaptive: none beyond what a client has left, or may have by now
            asks = (self.adaptive_asks(keys, server_round) if adaptive
                    else {k: a if self.planner.samples_left(k, 1) > 0 else 0
                          for k, a in asks.items()})
        default = self.unknown_ask(asks, clients) if screened and adaptive else (
            asks.get(clients.spare[0], 0) if clients.spare else self.cfg.budget)
        table_asks = {i: asks.get(i, 0) for i in clients.free}
        unknown_asked = default > 0 or any(a > 0 for a in table_asks.values())
        if screened:
            nodes = [n for n in nodes if (asks.get(clients.known[int(n)], 0) > 0
                                          if int(n) in clients.known else unknown_asked)]
        unknown = {int(n) for n in nodes} - set(clients.known)
        self.asked[server_round] = Asked(
            {int(n): (asks.get(clients.known[int(n)], 0) if int(n) in clients.known
                      else default) for n in nodes},
            frozenset(unknown), table_asks, default, self.cfg.budget)
        if not unknown or not clients.free or plan.mode != "data":
            return nodes, None
        table = encode_table({i: (a, self.held_of(i) or EMPTY) for i, a in table_asks.items()},
                             default)
        return nodes, table

    @staticmethod
    def unknown_ask(asks: dict[int, int], clients: RoundClients) -> int:
        """The adaptive ask of an unnamed node: the mean ask rounded up (1+ if any is asked)."""
        shares = [asks.get(k, 0) for k in clients.spare] or list(asks.values())
        if not any(a > 0 for a in asks.values()):
            return 0
        return max(math.ceil(sum(shares) / max(len(shares), 1)), 1)

    def adaptive_asks(self, keys: list[int], server_round: int = 0) -> dict[int, int]:
        """Per-client asks of the adaptive schedule over ``keys`` (:attr:`RoundClients.keys`)."""
        schedule = self.trainer.schedule
        assert schedule is not None
        empty = {k for k in keys if self.held_none(k)  # held none: as unheard, unless
                 and not self.resting(self.identities.node_of.get(int(k), -1), server_round)}
        if self.cfg.uploads_all:
            return self.all_rows(keys, empty)
        if schedule.next_total is None:
            return dict.fromkeys(keys, self.first_ask(len(keys)))
        if schedule.exhausted and self.data.grown:  # a probe found rows: the data grows
            schedule.resume(self.data.stored)
        total = schedule.round_ask(self.data.stored)
        if total <= 0:
            return {}
        left: dict[int, int | None] = {  # an excluded client's rows disagree: it is not asked
            key: 0 if int(key) in self.trainer.excluded  # one that held none counts as unheard
            else None if (known := self.data.sent.get(int(key))) is None or key in empty
            else known[0] if self.cfg.resend else self.capped_left(int(key), *known)
            for key in keys}
        left = self.may_have_grown(left, schedule.probes if schedule.exhausted else None)
        if all(v == 0 for v in left.values()) and self.all_heard_of(keys):
            schedule.stop("exhausted")  # nothing left anywhere: the store holds it all
            return {}
        # a client the server has not heard from is counted as holding what a known
        # client holds on average (not what known ones have left: they may be exhausted)
        held = [v[0] for v in self.data.sent.values() if v[0] > 0]
        typical = float(np.mean(held)) if held else None
        return allocate(total, left, self.trainer.node_fit, unknown=typical)

    def may_have_grown(self, left: dict[int, int | None], probe: int | None
                       ) -> dict[int, int | None]:
        """``left``, clients that sent every row counted as unheard where they may have more.

        Once a client's ``num-examples`` has grown (:attr:`FederationData.grown`), or in the
        round that first asks for rows holding NaN (:meth:`mask_news`), every such client
        may hold new rows; before, only a probe while exhausted (``probe``:
        the schedule's count of them) asks one, each probe the next in identity order.
        """
        sent = self.data.sent  # every row sent (not held back by ``node-rows-cap``)
        spent = sorted(k for k, v in left.items() if v == 0 and int(k) not in self.trainer.excluded
                       and int(k) in sent and sent[int(k)][1] >= sent[int(k)][0])
        if self.data.grown or self.mask_news():
            return {k: None if k in spent else v for k, v in left.items()}
        if probe is None or not spent:
            return left
        return {**left, spent[(probe - 1) % len(spent)]: None}

    def all_rows(self, keys: list[int], empty: set[int]) -> dict[int, int]:
        """The ``all`` schedule's asks: every row a client has not uploaded yet.

        A client the server has not heard from, or one whose data may have grown
        (:meth:`may_have_grown`), is asked for :data:`ALL_ROWS`; the schedule stops once
        every known client is exhausted and no other is left.
        """
        schedule = self.trainer.schedule
        assert schedule is not None
        if schedule.exhausted and self.data.grown:
            schedule.resume(self.data.stored)
        left: dict[int, int | None] = {
            key: 0 if int(key) in self.trainer.excluded
            else None if (known := self.data.sent.get(int(key))) is None or key in empty
            else known[0] if self.cfg.resend else max(known[0] - known[1], 0) for key in keys}
        probe = (schedule.probes if schedule.exhausted
                 and schedule.round_ask(self.data.stored) > 0 else None)
        asks = {k: ALL_ROWS if v is None else v
                for k, v in self.may_have_grown(left, probe).items()}
        if not any(asks.values()) and self.all_heard_of(keys) and not schedule.exhausted:
            schedule.stop("exhausted")
        return asks

    def all_heard_of(self, keys: list[int]) -> bool:
        """Whether no client outside ``keys`` may still hold rows the server lacks.

        Every client the server knows and did not sample has sent all its rows (or is left
        out by the agreement screen), and every connected node is a known client: a node
        never heard from may hold anything.
        """
        others = set(self.data.sent) - {int(k) for k in keys}
        return (all(int(c) in self.trainer.excluded
                    or (self.planner.samples_left(c, 1) == 0 and not self.data.grown
                        and not self.mask_news()) for c in others)
                and all(self.identities.of(n) is not None for n in self.identities.connected))

    def held_none(self, client: int) -> bool:
        """Whether ``client`` has reported no row: a site that joins empty may hold some now."""
        return int(client) in self.data.sent and self.data.sent[int(client)][0] == 0

    def resting(self, node: int, server_round: int) -> bool:
        """Whether ``node`` sits this round out: its last asks were fruitless (doubling)."""
        count, last = self.data.failing.get(int(node), (0, 0))
        return count >= FAILED_ASKS and server_round - last < 2 ** (count - FAILED_ASKS + 1)

    def worth_asking(self, node: int) -> bool:
        """Whether a data round's ask of ``node`` can bring rows the server lacks.

        A node never heard from may, and one that held no row (a site that joins empty); a
        known client only while it holds rows not uploaded (or with ``resend``, or once
        clients' data has grown) and the agreement screen has not left it out.
        """
        if self.data.failing.get(int(node), (0, 0))[0] >= FAILED_ASKS:
            return False  # drawn only to fill a sample (:meth:`resting`)
        identity = self.identities.of(node)
        if identity is None:
            return True
        if identity in self.trainer.excluded:
            return False
        return (self.cfg.resend or bool(self.data.grown) or self.held_none(identity)
                or self.planner.samples_left(identity, 1) > 0 or self.mask_news())

    def mask_news(self) -> bool:
        """Whether this data round is the first to ask for rows holding NaN (``nan-mask``).

        A node left those rows out of every earlier upload and of its ``num-examples``; one
        that sent all the others is asked again (the ``all`` schedule asked no more before
        a probe found them, rounds later).
        """
        spec = self.data.spec
        return (not self.data.masked and spec is not None
                and NAN_MASK_KEY in input_asks(self.model, self.data.one_input, spec))

    def rows_cap(self, uploaded: int = 0) -> float:
        """Rows one client is asked for in all (see ``node-rows-cap``).

        ``node-rows-cap`` times the larger of the median client's ``num-examples`` and the
        rows the client has ``uploaded``; infinite with the knob at 0 or no client known.
        Honest Dirichlet(0.1) splits measured up to 3.5 times the median ``num-examples``; a
        large client not left out by the agreement screen earns its rows in steps of
        ``node-rows-cap`` times what it has sent, so the cap slows, but never stops, an
        honest large site.
        """
        held = [v[0] for v in self.data.sent.values() if v[0] > 0]
        if not self.cfg.node_rows_cap or not held:
            return math.inf
        return self.cfg.node_rows_cap * max(float(np.median(held)), float(uploaded))

    def capped_left(self, identity: int, examples: int, uploaded: int) -> int:
        """Rows the client may still be asked for under :meth:`rows_cap` (logged where it binds)."""
        cap = self.rows_cap(uploaded)
        left = max(int(min(examples, cap)) - uploaded, 0)
        if cap < examples:
            log(INFO, f"[dq] node-rows-cap binds for client {identity}: {left:,} of its "
                      f"{examples - uploaded:,} rows left may be asked this round ({cap:,.0f} "
                      f"in all: {self.cfg.node_rows_cap:g} times the larger of the median "
                      f"client's rows and the {uploaded:,} it has sent)")
        return left

    def first_ask(self, clients: int) -> int:
        """The first round's ask per client: enough rows to hold out for the stop rule.

        ``min-holdout-rows`` per class (known, else the model's output width, at least 2)
        over ``holdout-fraction``, shared by ``clients``, at least ``budget`` each. A store
        of token windows (:meth:`holds_windows`) has no classes: each window is one
        held-out score, and the stop rule counts ``min-holdout-rows`` held-out windows in
        all, so it is one stratum here (the floor of two applies: 200 windows by default),
        not its vocabulary.
        """
        spec = self.data.spec  # float targets: one stratum, whatever the model's outputs
        classes = (1 if self.holds_windows() or (spec is not None and spec.target != "class")
                   else self.data.num_classes or output_width(self.model) or 2)
        rows = self.cfg.min_holdout_rows * max(int(classes), 2) / self.cfg.holdout_fraction
        return max(self.cfg.budget, math.ceil(rows / max(clients, 1)))

    def holds_windows(self) -> bool:
        """Whether the store holds token windows: the spec says so, else the model reads them.

        Before any reply (the first ask) the spec is unknown unless given: a model mapping
        a window of ids to next-token logits (:func:`~dq_flower.model_ops.reads_windows`)
        is taken to train on windows. Asked once.
        """
        if self.data.spec is not None:
            return self.data.spec.target == "tokens"
        if self._reads_windows is None:
            self._reads_windows = reads_windows(self.model)
        return self._reads_windows

    def id_vocab(self) -> int:
        """The vocabulary of id samples: the spec's, else the model's embedding's.

        A model whose first layer is an embedding reads ids below its rows (a language
        model's too, unless its nodes send token windows): nodes whose samples are such ids
        send them exactly, and nodes whose samples are a table (ids beside other values)
        code its whole-number columns exactly, every round alike. A model that casts its
        samples to whole numbers itself is asked for ids once its first round's rows show
        it (:func:`~dq_flower.dq.server.token_intake.whole_number_vocab`).
        """
        spec = self.data.spec
        if spec is not None and (spec.vocab or spec.target == "tokens"):
            return spec.vocab  # a tokens spec's: 0 (windows are sent exactly as they are)
        return embedding_vocab(self.model) or self.data.whole_vocab

    def asks_all_left(self, server_round: int, node: int, identity: int | None) -> bool:
        """Whether a known client's ask covers every row it has not sent (no choice to score).

        Then the node draws uniformly and gets no model for scoring: every row goes, each
        with the same weight, whatever the scores.
        """
        known = None if identity is None else self.data.sent.get(identity)
        if known is None or self.trainer.schedule is None or self.cfg.resend:
            return False
        return self.asked[server_round].of_node.get(int(node), 0) >= known[0] - known[1]

    def messages(self, server_round: int, nodes: list[int], clients: RoundClients,
                 plan: RoundPlan, table: bytes | None, config: ConfigRecord,
                 model: Callable[[], ArrayRecord]) -> list[Message]:
        """One train message per asked node; ``model()`` is built once, sent where used."""
        messages = []
        self.held_bytes = 0
        shared_model: dict[str, ArrayRecord] = {}  # built once: the model, its statistics
        for node in nodes:
            node_cfg = ConfigRecord(dict(config.items()))
            identity = clients.known.get(int(node))
            scorer, rule = self.node_choice(identity, clients.free)
            if scorer != "uniform" and self.asks_all_left(server_round, node, identity):
                scorer, rule = "uniform", node_rule(self.cfg.selection_rule, "uniform")
            node_cfg["scorer"], node_cfg["selection-rule"] = scorer, rule
            shared: dict[str, Any] = {}
            knob = model_knob({"round-mode": plan.mode, "scorer": scorer,
                               "compensation": self.cfg.compensation})
            if scorer == AUTO or knob is not None:  # its round may use the model
                if not shared_model:  # with its batch norms' statistics, to score with
                    found = float_buffers(self.model)
                    shared_model = {MODEL_KEY: model(), **(
                        {BUFFERS_KEY: buffers_record(found)} if found else {})}
                shared.update(shared_model)
            if self.trainer.schedule is not None:
                node_cfg["budget"] = max(self.asked[server_round].of_node[int(node)], 1)
            if plan.mode == "data":
                self.data.masked = self.data.masked or NAN_MASK_KEY in node_cfg
                held = table if identity is None else self.held_of(identity)
                if held is not None:
                    node_cfg[TABLE_KEY if identity is None else HELD_KEY] = held
                    self.held_bytes += len(held)
                if (self.data.mode == "feature" if self.data.spec is not None
                        else self.cfg.ranges in ("auto", "feature")):  # may carry feature ranges
                    node_cfg["send-ranges"] = (identity is None
                                               or identity not in self.data.ranges)
                if int(node) in self.data.over_bound and self.data.value_bound is not None:
                    node_cfg[VALUE_BOUND_KEY] = float(self.data.value_bound)
            content = RecordDict({"config": node_cfg, **shared})
            messages.append(Message(content=content, message_type=MessageType.TRAIN,
                                    dst_node_id=node))
        return messages
