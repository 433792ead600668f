"""What a node keeps of its uploads, the per-feature ranges they are coded in, its data spec.

Under ``compensation-mode="refresh"`` a node keeps the samples payload it sent in round r
(``dq-sent-<r>``) and its row ids and weights (``dq-sent-rows-<r>``) in ``Context.state``,
to recompute residuals later (:func:`sent_rows`); :func:`forget_from` drops what the
server serves again. :func:`coding_ranges` gives the ranges both the upload and that
recomputation use (kept once sent); :func:`spec_of`, the spec its rows carry, and
:func:`num_classes_of`, their classes; :func:`holes_of` and :func:`send_holes`, where its
flat rows hold NaN and how that travels.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, RecordDict

from dq_flower.codecs import Payload
from dq_flower.codecs.affine import denormalise, feature_ranges, log_scales, mixed_scales
from dq_flower.input_arrays import fill_holes
from dq_flower.wire.dq_batch import (
    ID_VOCAB_KEY,
    INFO_KEY,
    DataSpec,
    payload_quantizer,
    raw_array,
    sensor_window,
)
from dq_flower.wire.input_parts import NAN_KEY, nan_bytes, nan_mode
from dq_flower.wire.targets import binary_targets
from dq_flower.wire.token_batch import TOKENS_CODEC

__all__ = ["SENT_PREFIX", "SENT_ROWS_PREFIX", "RANGES_STATE", "coding_ranges", "keep_sent",
           "sent_rounds", "sent_rows", "forget_from", "node_ranges", "spec_of",
           "num_classes_of",
           "row_names", "row_hashes", "holes_of", "send_holes", "with_nan"]

SENT_PREFIX = "dq-sent-"
SENT_ROWS_PREFIX = "dq-sent-rows-"
#: the feature ranges the node last sent, in ``Context.state`` (:func:`coding_ranges`)
RANGES_STATE = "dq-ranges"
#: the hash of every row the node has named, in the order named (:func:`row_names`)
NAMES_STATE = "dq-row-names"


def node_ranges(config: Mapping[str, Any], x_flat: np.ndarray, bits: int
                ) -> tuple[np.ndarray, ...]:
    """The node's per-feature ``(lo, span)`` for ``bits``-bit codes, ``scale`` besides.

    ``scale``: where some feature is heavy-tailed (:func:`.log_scales`: log-coded).

    Where the server's model reads samples with an embedding (``sample-vocab`` in the
    round config) but the samples are not all its ids (a table whose label-encoded columns
    feed embeddings), every column of whole numbers spanning fewer than ``2**bits`` values
    gets one code per whole number, so its categories arrive exactly.
    """
    table = int(config.get(ID_VOCAB_KEY, 0) or 0) > 0
    lo, span = feature_ranges(x_flat, 2 ** bits if table else 0)
    scale = log_scales(x_flat, lo, span, 2 ** bits)
    return (lo, span) if scale is None else (lo, span, scale)


def coding_ranges(context: Context, config: Mapping[str, Any], x_flat: np.ndarray, bits: int,
                  send: bool) -> tuple[np.ndarray, ...]:
    """The ``(lo, span[, scale])`` the node codes its rows against this round.

    Where it sends them (``send``), its data's own ranges (:func:`node_ranges`), kept in
    ``Context.state``; else the ones it sent, which the server decodes its rows with, for
    as long as it keeps them: rows of data that grew since fall outside them and are
    clipped to their ends.
    """
    kept = context.state.array_records.get(RANGES_STATE)
    if (not send and kept is not None and int(kept["bits"].numpy()[0]) == int(bits)
            and kept["lo"].shape == (x_flat.shape[1],)):
        return tuple(kept[k].numpy() for k in ("lo", "span", "scale") if k in kept)
    ranges = node_ranges(config, x_flat, bits)
    if send:
        context.state[RANGES_STATE] = ArrayRecord({
            **{k: Array(np.asarray(a))
               for k, a in zip(("lo", "span", "scale"), ranges, strict=False)},
            "bits": Array(np.array([bits], dtype=np.int64))})
    return ranges


def row_hashes(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each row's 64-bit hash of its input and target bytes (exact integer arithmetic)."""
    n = len(x)
    raw = np.concatenate([np.ascontiguousarray(a).view(np.uint8).reshape(n, a[:1].nbytes)
                          if n else np.zeros((0, 0), np.uint8) for a in (x, y)], axis=1)
    raw = np.pad(raw, ((0, 0), (0, -raw.shape[1] % 8))).view(np.uint64)
    mult = np.random.default_rng(0).integers(1, 2**63, raw.shape[1], dtype=np.uint64) | 1
    with np.errstate(over="ignore"):
        h = (raw * mult).sum(axis=1, dtype=np.uint64)
        return h ^ (h >> np.uint64(29)) * np.uint64(0xBF58476D1CE4E5B9)


def repeated_rows(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Which rows repeat an earlier one exactly (input and target): no news to the server."""
    return _occurrence(row_hashes(x, y)) > 0


def _occurrence(keys: np.ndarray) -> np.ndarray:
    """For each entry, how many equal ones come before it."""
    order = np.argsort(keys, kind="stable")
    ordered = keys[order]
    first = np.r_[True, ordered[1:] != ordered[:-1]] if keys.size else np.zeros(0, bool)
    start = np.maximum.accumulate(np.where(first, np.arange(keys.size), 0))
    out = np.empty(keys.size, dtype=np.int64)
    out[order] = np.arange(keys.size) - start
    return out


def row_names(context: Context, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, int]:
    """Each row's name, the id the server knows it by, and how many names were given.

    Rows are named by their content: a row's hash (:func:`row_hashes`; its k-th copy, the
    k-th name of that hash) keeps the name it got when first seen, kept in
    ``Context.state``; rows never seen get the next names. A node whose data grows, shrinks,
    replaces old rows by new ones or comes in another order each round is followed: the
    server's held set names rows, not positions. Static data's names are its positions;
    rows of another layout or type than before (the server asked for one input of several,
    or targets typed as the model reads them) are named afresh.
    """
    seen = context.state.array_records.get(NAMES_STATE)
    width = np.array([ord(x.dtype.char), ord(y.dtype.char), *x.shape[1:], *y.shape[1:]],
                     dtype=np.int64)
    if seen is not None and not np.array_equal(seen["width"].numpy(), width):
        seen = None  # rows of another layout (the server asked otherwise): named afresh
    known = seen["hashes"].numpy() if seen is not None else np.zeros(0, np.uint64)
    now = row_hashes(x, y)
    keys = np.concatenate([np.stack([known, _occurrence(known).astype(np.uint64)], axis=1),
                           np.stack([now, _occurrence(now).astype(np.uint64)], axis=1)])
    _, inverse = np.unique(keys, axis=0, return_inverse=True)
    inverse = inverse.reshape(-1)
    lookup = np.full(int(inverse.max(initial=-1)) + 1, -1, dtype=np.int64)
    lookup[inverse[:known.size]] = np.arange(known.size)
    names = lookup[inverse[known.size:]]
    new = names < 0
    names[new] = known.size + np.arange(int(new.sum()))
    if new.any() or seen is None:
        context.state[NAMES_STATE] = ArrayRecord({"hashes": Array(np.concatenate(
            [known, now[new]])), "width": Array(width)})
    return names, known.size + int(new.sum())


def keep_sent(context: Context, server_round: int, samples: Payload, ids: np.ndarray,
              weights: np.ndarray) -> None:
    """Keep the round's samples payload, row ids and weights for later refreshes."""
    context.state[f"{SENT_PREFIX}{server_round}"] = samples.to_record()
    context.state[f"{SENT_ROWS_PREFIX}{server_round}"] = ArrayRecord({
        "ids": Array(ids.astype(np.int64)), "weights": Array(weights.astype(np.float32))})


def sent_rounds(context: Context) -> list[int]:
    """The rounds whose uploads the node keeps."""
    return sorted(int(k[len(SENT_ROWS_PREFIX):]) for k in context.state.array_records
                  if k.startswith(SENT_ROWS_PREFIX))


def forget_from(context: Context, server_round: int) -> None:
    """Drop the uploads of ``server_round`` and later (rounds the server serves again)."""
    for rnd in sent_rounds(context):
        if rnd >= server_round:
            del context.state[f"{SENT_PREFIX}{rnd}"]
            del context.state[f"{SENT_ROWS_PREFIX}{rnd}"]


def sent_rows(context: Context, config: Mapping[str, Any], x_flat: np.ndarray, y: np.ndarray,
              mode: str, names: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Every earlier upload's ``x_i``, ``Q(x_i)``, ``y_i`` and normalised weights ``w_i``.

    ``Q(x_i)`` is decoded from the very payloads sent, so it is what the server stores;
    ``names``: the rows' ids (:func:`row_names`): a row the node no longer holds is left out.
    """
    order = np.argsort(names, kind="stable")
    parts = []
    for rnd in sent_rounds(context):
        payload = Payload.from_record(context.state.array_records[f"{SENT_PREFIX}{rnd}"])
        rows = context.state.array_records[f"{SENT_ROWS_PREFIX}{rnd}"]
        ids = rows["ids"].numpy().astype(np.int64)
        at = order[np.minimum(np.searchsorted(names, ids, sorter=order), max(names.size - 1, 0))]
        held = names[at] == ids if names.size else np.zeros(ids.size, bool)
        pos, weights = at[held], rows["weights"].numpy().astype(np.float64)[held]
        if payload.codec == TOKENS_CODEC:  # ids, sent exactly
            parts.append((x_flat[pos], x_flat[pos], y[pos], weights))
            continue
        bits = int(payload.meta["bits"])
        xq = payload_quantizer(payload, bits, int(payload.meta.get("per_channel", 0)),
                               bool(payload.meta.get("fixed_range", False)),
                               bool(payload.meta.get("channels_last", False))).decode(payload)
        if mode == "feature":
            xq = denormalise(xq, *coding_ranges(context, config, x_flat, bits, send=False))
        parts.append((x_flat[pos], xq[held], y[pos], weights))
    if not parts or not sum(len(p[0]) for p in parts):
        return None
    xs, xqs, ys, w = (np.concatenate(p) for p in zip(*parts, strict=True))
    return xs, xqs, ys, (w / w.sum()).astype(np.float32)


def num_classes_of(config: dict[str, Any], spec: DataSpec, y: np.ndarray, n: int) -> int:
    """The classes of the round: the server's, checked against this node's labels."""
    num_classes = int(config.get("num-classes", 0) or 0)
    if spec.target != "class":
        return num_classes
    local = int(y.max()) + 1 if n else 1
    if num_classes and local > num_classes:
        raise ValueError(f"local label {local - 1} is outside the server's "
                         f"{num_classes} classes")
    return num_classes or local


def spec_of(x: np.ndarray, y: np.ndarray, vocab: int = 0, bits: int = 2,
            mixed_units: bool | None = None, inputs: tuple[str, ...] = (),
            target_parts: tuple[str, ...] = ()) -> DataSpec:
    """The spec of ``(x, y)``: ids below ``vocab``; ``mixed_units`` pinned, or measured.

    ``inputs``: the layouts of several inputs a flat sample holds (``data_input.as_inputs``);
    ``target_parts``: those of a dict target's values (``data_input.target_parts``), floats.
    """
    shape = tuple(int(s) for s in x.shape[1:]) or (1,)
    mixed = len(shape) > 1 and not vocab and not sensor_window(shape) and (
        mixed_scales(x.reshape(len(x), -1), bits) if mixed_units is None else bool(mixed_units))
    if target_parts:  # {"label": 3, "ink": 0.2}: side by side, the user's loss reads them
        return DataSpec(shape, "float", int(y.reshape(len(y), -1).shape[1]), vocab, mixed,
                        inputs, target_parts=target_parts)
    if np.issubdtype(y.dtype, np.integer):  # a label a sample, or one of each element
        labels = tuple(int(s) for s in y.shape[1:])
        return DataSpec(shape, "class", int(np.prod(labels)), vocab, mixed, inputs,
                        target_shape=labels)
    if not vocab and y.shape == x.shape and np.array_equal(y, x):  # an autoencoder's (x, x)
        return DataSpec(shape, "inputs", int(np.prod(shape)), 0, mixed, inputs)
    return DataSpec(shape, "binary" if binary_targets(y) else "float",
                    int(y.shape[1]) if y.ndim == 2 else 1, vocab, mixed, inputs,
                    y.ndim == 2 and y.shape[1] == 1)


def holes_of(config: Mapping[str, Any], x_flat: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray | None]:
    """Flat rows as coded (:func:`.fill_holes`) and where they hold NaN (``None``: nowhere).

    Only where the round asks for NaN values (``nan-mask``): else no row holds one.
    """
    return fill_holes(x_flat) if nan_mode(config) == "keep" else (x_flat, None)


def with_nan(x: np.ndarray, holes: np.ndarray | None) -> np.ndarray:
    """Rows ``x`` with NaN where ``holes`` says, as the model reads them (``None``: as they are)."""
    return x if holes is None else np.where(holes, np.float32(np.nan), x)


def send_holes(content: RecordDict, holes: np.ndarray | None) -> int:
    """Where an upload's rows hold NaN (bool ``holes``) added to its sample-info; its bits.

    Nothing where no row holds one: such an upload is as it was without the ask.
    """
    if holes is None or not holes.any():
        return 0
    mask = nan_bytes(holes)
    content.array_records[INFO_KEY][NAN_KEY] = raw_array(mask)
    return 8 * int(mask.size)
