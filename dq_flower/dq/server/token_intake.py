"""The server's side of samples of ids: a reply's checks and the store's row layout.

A token reply (``DataSpec((length,), "tokens", vocab)``) is decoded by
:func:`~dq_flower.wire.token_batch.decode_token_batch` (shape, vocabulary, counts and
budget checked before its stream is decoded, ids after), then its counts and weights are
checked as any data reply's. Its rows are the windows' ids: the store keeps them once, as
``width`` big-endian bytes per token (:class:`TokenLayout`), decodes them to int64 ids
(which the model reads as they are: ``model_ops.model_input``) and gives the same ids as
the rows' targets (``SampleStore.inputs_are_targets``). Labelled id samples
(``DataSpec(shape, "class", 1, vocab)``, a text classifier's) travel as a ``tokens``
payload beside their labels (:func:`check_id_samples`) and are stored the same way. A
table whose label-encoded columns the model reads with embeddings is quantized as any
table; :func:`table_reader` reads every reply's rows with the model. A model that casts
its samples to whole numbers itself (``one_hot(x.long(), C)``) is asked for them as ids
(:func:`whole_number_vocab`). Id rows shorter than the federation's (a ``collate_fn`` that
pads to a node's longest) are padded with the embedding's ``padding_idx`` (:func:`pad_id`,
:func:`read_padded`, :func:`padded_to_longest`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, ClassVar, cast

import numpy as np
import torch
from flwr.app import RecordDict
from torch import nn

from dq_flower.codecs import Payload, PayloadError
from dq_flower.codecs.tokens import token_width
from dq_flower.dq.scorer_choice import CAN_SCORE_KEY
from dq_flower.losses import model_output
from dq_flower.model_inputs import layers
from dq_flower.model_ops import LossFn, embedding_vocab, float_dtype, per_sample_results
from dq_flower.wire.dq_batch import MAX_VOCAB, SPEC_KEY, DataSpec, SampleBatch, spec_from_record
from dq_flower.wire.token_batch import TOKENS_CODEC, decode_token_batch, decode_windows

__all__ = ["TokenLayout", "PLAIN_BUFFER", "check_token_upload", "check_id_samples",
           "table_reader", "whole_number_vocab", "PROBE_ROWS", "pad_id", "shorter_ids",
           "padded_ids", "padded_to_longest", "read_padded"]

#: Rows of a round's uploads :func:`whole_number_vocab` reads the model on, at most.
PROBE_ROWS = 256

#: The buffer of a decoded (plain) tokens payload: the ids' bytes, never on the wire.
PLAIN_BUFFER = "id-bytes"


@dataclass(frozen=True)
class TokenLayout:
    """Rows of ``length`` token ids of ``width`` bytes each: how the store keeps windows."""

    length: int
    width: int
    #: bits per stored code: whole bytes (what the copy screen compares), whatever ``bits``
    bits: ClassVar[int] = 8

    @property
    def row_bytes(self) -> int:
        """Bytes per stored row."""
        return self.length * self.width

    def plain(self, windows: np.ndarray, vocab: int) -> Payload:
        """The checked windows as the store's rows will hold them (a server-side payload)."""
        shifts = np.arange(self.width - 1, -1, -1, dtype=np.int64) * 8
        data = ((windows.astype(np.int64)[:, :, None] >> shifts) & 0xFF).astype(np.uint8)
        return Payload(TOKENS_CODEC, tuple(windows.shape), {"vocab": int(vocab)},
                       {PLAIN_BUFFER: data.reshape(-1)}, nbits=8 * data.size)

    def rows(self, p: Payload) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(codes, side, dither)`` of a :meth:`plain` payload: no side, no dither."""
        if p.codec != TOKENS_CODEC or PLAIN_BUFFER not in p.buffers:
            raise PayloadError("token rows are stored from their checked (plain) payload")
        n = int(p.shape[0])
        codes = p.buffers[PLAIN_BUFFER].reshape(n, self.row_bytes)
        return codes, np.zeros((n, 0), np.float32), np.zeros((n, 0), np.int64)

    def dequantize(self, codes: np.ndarray, side: np.ndarray, dither: np.ndarray) -> np.ndarray:
        """Int64 ids ``(n, length)`` of stored rows."""
        n = codes.shape[0]
        parts = codes.reshape(n, self.length, self.width).astype(np.int64)
        shifts = np.arange(self.width - 1, -1, -1, dtype=np.int64) * 8
        return (parts << shifts).sum(axis=2)


def layout_of(spec: DataSpec) -> TokenLayout:
    """The store's layout of a federation's token windows or id samples."""
    return TokenLayout(spec.dim, token_width(spec.vocab or spec.target_dim))


def check_id_samples(batch: SampleBatch, spec: DataSpec, max_rows: int
                     ) -> tuple[np.ndarray, Payload]:
    """The int64 ids ``(n, dim)`` of a labelled id batch and the store's plain payload."""
    x = decode_windows(batch.samples, spec.vocab, spec.dim, max_rows)
    return x, layout_of(spec).plain(x, spec.vocab)


def check_token_upload(content: RecordDict, spec: DataSpec, max_rows: int, id_upper: int):
    """``(batch, x, plain, can_score)`` of a token reply: checked windows and float ids."""
    if len(spec.sample_shape) != 1 or spec.sample_shape[0] < 2:
        raise PayloadError(f"token windows must be (length,) with length >= 2, got "
                           f"{spec.sample_shape}")
    batch = decode_token_batch(content, spec.target_dim, spec.sample_shape[0], max_rows,
                               id_upper)
    plain = layout_of(spec).plain(batch.labels, spec.target_dim)
    metrics = content.metric_records.get("metrics")
    can_score = metrics is not None and metrics.get(CAN_SCORE_KEY) == 1
    return batch, batch.labels.astype(np.float32), plain, can_score


def table_reader(model: Any, loss_fn: LossFn | None
                 ) -> Callable[[DataSpec, Any], object] | None:
    """Where the model reads samples with an embedding, a reader of a reply's every row.

    A table's label-encoded code past an embedding's rows makes the model raise, in
    training as in this read, so the reply that carries one is refused (the model check of
    the spec reads only a round's first rows). ``None`` for every other model.
    """
    if not embedding_vocab(model):
        return None
    return lambda spec, upload: per_sample_results(
        model, upload.x.reshape(-1, *spec.sample_shape), upload.batch.labels, loss_fn)


def whole_number_vocab(model: torch.nn.Module, spec: DataSpec, rows: list[np.ndarray]) -> int:
    """Ids to ask for where the model reads its samples only as whole numbers; else 0.

    A model that casts its input (``one_hot(x.long(), C)``, an index) reads a quantized
    code of category 7 as 6 or 8. Read on the round's ``rows`` rounded (none negative),
    in eval mode: its outputs equal those a quarter up and differ where every value one
    down (at least 0). The ids asked lie below twice the largest whole number seen.
    """
    if spec.vocab or spec.target == "tokens" or embedding_vocab(model) or not rows:
        return 0
    whole = np.rint(np.concatenate([r[:PROBE_ROWS] for r in rows])[:PROBE_ROWS]
                    ).reshape(-1, *spec.sample_shape)
    if whole.size == 0 or whole.min() < 0 or whole.max() < 1:
        return 0
    x = torch.as_tensor(whole, dtype=float_dtype(model))
    training = model.training
    model.eval()
    try:
        with torch.no_grad():
            base, up, down = (model_output(model(v)) for v in (x, x + 0.25, (x - 1).clamp(0)))
    except Exception:  # noqa: BLE001 - a model that cannot read such rows is not one of these
        return 0
    finally:
        model.train(training)
    if not torch.equal(base, up) or torch.equal(base, down):
        return 0
    top = max(float(r.max()) for r in rows if r.size)
    return int(min(MAX_VOCAB, 2 * (round(top) + 1)))


def pad_id(model: Any) -> int | None:
    """The ``padding_idx`` of the embedding the model reads its samples with (else ``None``)."""
    first = next(layers(model), None)
    pad = getattr(first, "padding_idx", None) if isinstance(
        first, (nn.Embedding, nn.EmbeddingBag)) else None
    return None if pad is None else int(pad)


def _id_rows(spec: DataSpec | None) -> bool:
    """Whether ``spec``'s samples are one row of ids each (a text classifier's)."""
    return spec is not None and spec.vocab > 0 and len(spec.sample_shape) == 1 and not spec.inputs


def shorter_ids(reply: DataSpec | None, known: DataSpec | None, pad: int | None) -> bool:
    """Whether a reply of ``reply``'s spec is read as such and padded to ``known``'s length.

    Id rows that only differ in length: shorter ones where the embedding has a ``pad``;
    longer ones are refused, saying so (a spec that differs otherwise: ``False``).
    """
    if not (_id_rows(reply) and _id_rows(known)) or reply == known:
        return False
    assert reply is not None and known is not None
    if replace(reply, sample_shape=known.sample_shape) != known:
        return False
    if reply.dim > known.dim:
        raise PayloadError(f"its rows hold {reply.dim} ids, more than the federation's "
                           f"{known.dim}: cut token ids to at most {known.dim}")
    if pad is None:
        raise PayloadError(f"its rows hold {reply.dim} ids, the federation's {known.dim}, and "
                           "the model's embedding has no padding_idx to pad them with: pad "
                           f"token ids to {known.dim}")
    return True


def padded_ids(upload: Any, spec: DataSpec, pad: int) -> Any:
    """A checked upload of shorter id rows, padded with ``pad`` to ``spec``'s (its spec then)."""
    own: DataSpec = upload.spec
    more = ((0, 0), (0, spec.dim - own.dim))
    plain = upload.plain
    if plain is not None:  # every payload row, the kept ones picked out when stored
        ids = layout_of(own).dequantize(*layout_of(own).rows(plain))
        plain = layout_of(spec).plain(np.pad(ids, more, constant_values=pad), spec.vocab)
    return replace(upload, x=np.pad(upload.x, more, constant_values=pad), plain=plain,
                   spec=spec)


def padded_to_longest(uploads: list[Any], pad: int | None) -> list[Any]:
    """A first round's uploads, id rows padded to the longest of their kind (:func:`padded_ids`)."""
    def kind(spec: DataSpec) -> DataSpec:
        return replace(spec, sample_shape=(1,))

    longest: dict[DataSpec, DataSpec] = {}
    for spec in (u.spec for u in uploads if _id_rows(u.spec) and pad is not None):
        longest[kind(spec)] = max(longest.get(kind(spec), spec), spec, key=lambda s: s.dim)
    return [padded_ids(u, longest[kind(u.spec)], pad) if pad is not None and _id_rows(u.spec)
            and u.spec != longest[kind(u.spec)] else u for u in uploads]


def read_padded(check: Callable[[DataSpec | None], Any], content: RecordDict,
                known: DataSpec | None, pad: int | None) -> Any:
    """``check(spec)``'s upload: by ``known``, or shorter id rows by their own spec, padded.

    Rows longer than ``known``'s, or shorter without a ``pad``: refused (:func:`shorter_ids`).
    """
    try:
        own: DataSpec | None = spec_from_record(content.config_records.get(SPEC_KEY))
    except PayloadError:  # check() says what is wrong
        own = None
    if known is None or not shorter_ids(own, known, pad):
        return check(known)
    return padded_ids(check(own), known, cast(int, pad))
