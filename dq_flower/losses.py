"""Per-sample losses of the model path: ``loss_fn(outputs, targets)`` returns shape ``(n,)``.

The default follows the targets: cross-entropy for class labels, the next-token loss for
token windows, binary cross-entropy on logits for 0/1 targets (a data spec's ``binary``
targets: :class:`TargetLoss`), else the mean squared error.
"""

from __future__ import annotations

import contextlib
import copy
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any, cast

import torch
import torch.nn.functional as F  # noqa: N812

from dq_flower.wire.input_parts import part_layout
from dq_flower.wire.targets import IGNORE_INDEX

__all__ = ["LossFn", "model_output", "element_logits", "next_token_loss", "binary_loss",
           "default_loss", "element_loss", "resolve_loss", "per_sample", "per_row", "TargetLoss",
           "follow_targets", "OUTPUT_KEYS", "HEADS_ATTR"]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
"""``loss_fn(outputs, targets) -> per-sample losses``, shape ``(n,)``."""

#: Keys of a dict output that hold what a loss reads, in order of preference (a user's
#: ``{"logits": ..., "embedding": ...}``; torchvision's segmentation models return ``out``).
OUTPUT_KEYS = ("logits", "out", "output")
#: Attribute of the tensor :func:`model_output` picks from a dict of several: the dict, that
#: tensor's place ``None`` (no cycle), for a loss of dict targets (:class:`TargetLoss`).
HEADS_ATTR = "dq_heads"


def model_output(out: object) -> torch.Tensor:
    """A model's output as a tensor: itself, a tuple's first, an output object's ``logits``.

    ``transformers`` models return such objects (``CausalLMOutputWithPast``,
    ``ImageClassifierOutput``): their ``logits`` are what a loss reads; a model returning
    ``(logits, features)`` is read by its first, one returning a dict by its first key of
    :data:`OUTPUT_KEYS` (or its only tensor). ``TypeError`` names anything else.
    """
    if isinstance(out, (tuple, list)) and out:
        out = out[0]
    if isinstance(out, torch.Tensor):
        return out
    logits = getattr(out, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    if isinstance(out, Mapping):
        named = [out[k] for k in OUTPUT_KEYS if isinstance(out.get(k), torch.Tensor)]
        tensors = [v for v in out.values() if isinstance(v, torch.Tensor)]
        if named or len(tensors) == 1:
            first = (named or tensors)[0]
            if len(tensors) > 1:  # the other heads, for a loss reading dict targets
                setattr(first, HEADS_ATTR, {k: None if v is first else v
                                            for k, v in out.items()})
            return first
        raise TypeError(f"the model returned a dict with keys {sorted(map(str, out))}: one of "
                        f"{list(OUTPUT_KEYS)} (or a single tensor) is what a loss reads")
    raise TypeError(f"the model returned {type(out).__name__}: a tensor, a tuple led by one, a"
                    " dict with 'logits' or an object with a .logits tensor (as transformers "
                    "models return) is needed")


def element_logits(outputs: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor | None:
    """Outputs scoring the classes of each element of a ``shape`` label: ``(n, elements, C)``.

    The classes on the axis after the rows (``(n, C, H, W)``, as ``F.cross_entropy`` reads a
    mask's) or on the last (``(n, L, C)``, a tagger's); ``None`` where neither fits ``shape``.
    """
    n, rest = outputs.shape[0], tuple(outputs.shape[1:])
    if len(rest) != len(shape) + 1:
        return None
    if rest[1:] == tuple(shape):
        return outputs.reshape(n, rest[0], -1).transpose(1, 2)
    return outputs.reshape(n, -1, rest[-1]) if rest[:-1] == tuple(shape) else None


def next_token_loss(logits: torch.Tensor, windows: torch.Tensor) -> torch.Tensor:
    """Per-window mean cross-entropy (nats) of tokens ``1..`` given those before them.

    ``logits`` ``(n, length, vocab)``: position ``t`` scores token ``t + 1``.
    """
    ids = windows.reshape(windows.shape[0], -1)
    ids = ids.round().long() if ids.is_floating_point() else ids.long()
    per_token = F.cross_entropy(logits[:, :-1].transpose(1, 2), ids[:, 1:], reduction="none")
    return per_token.mean(dim=1)


def default_loss(outputs: torch.Tensor, targets: torch.Tensor, windows: bool = True
                 ) -> torch.Tensor:
    """Per-sample loss: cross-entropy for integer targets, else mean squared error.

    Integer windows ``(n, length)`` scored by logits ``(n, length, vocab)``: the
    next-token loss (:func:`next_token_loss`); with ``windows=False`` such targets are the
    class labels of each element, given apart from the samples (a tagger's, or a language
    model's ``(x, y)`` pairs, ``y`` the next ids): the elements' mean cross-entropy.
    """
    if not torch.is_floating_point(targets) and outputs.ndim == 3 and targets.ndim == 2:
        logits = None if windows else element_logits(outputs, tuple(targets.shape[1:]))
        if logits is None:
            return next_token_loss(outputs, targets)
        return row_means(F.cross_entropy(logits.transpose(1, 2), targets.long(),
                                         reduction="none"), targets)
    if not torch.is_floating_point(targets):
        return F.cross_entropy(outputs, targets.long(), reduction="none")
    out = outputs.reshape(outputs.shape[0], -1)
    return ((out - targets.reshape(out.shape).to(out.dtype)) ** 2).mean(dim=1)


def element_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`default_loss` of samples labelled apart from themselves (``windows=False``)."""
    return default_loss(outputs, targets, windows=False)


def per_sample(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` giving one loss per sample: a PyTorch loss module that reduces is copied.

    A user passes the loss they train with, ``nn.BCEWithLogitsLoss(pos_weight=...)`` or
    ``nn.CrossEntropyLoss(weight=...)``, reducing to one number; the copy has
    ``reduction="none"`` (its weights shared). Other callables are returned as they are.
    """
    if isinstance(loss_fn, torch.nn.modules.loss._Loss) and loss_fn.reduction != "none":
        loss_fn = copy.copy(loss_fn)
        loss_fn.reduction = "none"
    return loss_fn


#: Loss functions found to reduce a batch to one number: mapped over rows at once.
_BATCH_REDUCING: weakref.WeakSet = weakref.WeakSet()


def _maps_rows(loss_fn: LossFn) -> bool:
    try:
        return loss_fn in _BATCH_REDUCING
    except TypeError:  # not weakly referenceable: found out at each call
        return False


def per_row(loss_fn: LossFn, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``loss_fn``'s losses, one a row, from the loss a user trains with as it is written.

    A loss of one value per output is averaged over the row's outputs; a function that
    reduces the batch to one number is applied row by row (``torch.func.vmap``), each row a
    batch of one, so a loss written over ``dim=1`` reads it as it reads a batch. Where
    elements are ignored (:func:`kept_elements`), rows weigh by the elements they hold, as
    the mean over the batch's elements weighs them (:func:`row_means`).
    """
    n = outputs.shape[0]
    mapped = n > 1 and _maps_rows(loss_fn)
    counts = kept_elements(targets) if mapped else None  # ignored ones: checked each batch
    whole = loss_fn(outputs, targets) if not mapped or counts is not None else None
    losses = None if mapped else whole
    if mapped or (losses is not None and losses.ndim == 0 and n > 1):
        try:
            losses = torch.func.vmap(_as_batch_of_one(loss_fn))(outputs, targets)
        except Exception as exc:  # noqa: BLE001  (whatever the user's function raises)
            raise ValueError(f"loss_fn returns one number for a batch of {n} and cannot be "
                             f"applied row by row ({type(exc).__name__}: {exc}); return one "
                             "loss a sample (reduction='none')") from None
        if whole is not None:
            losses = _rows_of(float(whole.detach()), losses, targets)
        if not mapped:  # from now on mapped at once, not called twice a batch
            with contextlib.suppress(TypeError):  # not weakly referenceable: each call
                _BATCH_REDUCING.add(loss_fn)
    assert losses is not None
    if losses.ndim > 1 and losses.shape[0] == n:
        losses = row_means(losses, targets)
    return losses.reshape(1) if losses.ndim == 0 and n == 1 else losses


def kept_elements(targets: torch.Tensor) -> torch.Tensor | None:
    """Each row's count of the elements a loss reads, where some of ``targets`` are ignored.

    ``None`` unless ``targets`` are class labels of several elements a row, some of them
    :data:`IGNORE_INDEX` (a tagger's padding).
    """
    if torch.is_floating_point(targets) or targets.ndim < 2:
        return None
    kept = (targets != IGNORE_INDEX).reshape(targets.shape[0], -1)
    return None if bool(kept.all()) else kept.sum(dim=1)


def row_means(losses: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Each row's loss from its elements' ``losses``: their mean, as a loss of ``mean`` reads.

    Where some elements are ignored (:func:`kept_elements`; a loss gives them 0), as
    PyTorch's mean over the batch's elements read: a row's sum over the mean count of
    elements read a row, so that the rows' mean is that loss (a padded tagger's
    ``CrossEntropyLoss(ignore_index=-100)``: a long sentence weighs by its words).
    """
    flat = losses.reshape(losses.shape[0], -1)
    kept = kept_elements(targets) if losses.shape == targets.shape else None
    if kept is None:
        return flat.mean(dim=1)
    return flat.sum(dim=1) / kept.double().mean().clamp(min=1).to(flat.dtype)


def _rows_of(whole: float, rows: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Row losses whose mean or sum is the batch's loss ``whole``, from each row's ``rows``.

    ``rows`` themselves, or where elements are ignored (:func:`kept_elements`), each row's
    sum over the elements it holds (a sum over the batch's elements), or that over the
    mean count a row (a mean over them, :func:`row_means`). Else ``ValueError``: a weighted
    mean, whose weights cancel row by row.
    """
    candidates = [rows]
    if (counts := kept_elements(targets)) is not None:
        sums = torch.where(counts > 0, rows * counts.to(rows.dtype), torch.zeros_like(rows))
        candidates += [sums / counts.double().mean().clamp(min=1).to(rows.dtype), sums]
    for losses in candidates:
        if _a_mean_or_sum(whole, losses.detach()):
            return losses
    raise ValueError(
        f"loss_fn returns {whole:.6g} for a batch, neither the mean nor the sum "
        "of its rows' losses (a weighted mean, cross_entropy(..., weight=w)?): row by "
        "row its weights would cancel; pass the loss module (nn.CrossEntropyLoss("
        "weight=w)) or a function that returns one loss a sample")


def _as_batch_of_one(loss_fn: LossFn) -> LossFn:
    """``loss_fn`` on one row given as a batch of one (the row's loss, a scalar)."""
    return lambda out, target: loss_fn(out.unsqueeze(0), target.unsqueeze(0)).reshape(())


def _a_mean_or_sum(whole: float, rows: torch.Tensor) -> bool:
    """Whether a batch's loss ``whole`` is the mean or the sum of its ``rows``' losses."""
    rows = rows.reshape(rows.shape[0], -1).mean(dim=1).double()
    scale = max(abs(whole), 1e-12)
    return any(abs(whole - float(v)) <= 1e-4 * scale for v in (rows.mean(), rows.sum()))


def resolve_loss(loss_fn: LossFn | None) -> LossFn:
    """``loss_fn`` as :func:`per_sample` makes it, or :func:`default_loss` when ``None``."""
    return default_loss if loss_fn is None else per_sample(loss_fn)


def binary_loss(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-sample binary cross-entropy of logits against 0/1 targets, mean over outputs."""
    out = outputs.reshape(outputs.shape[0], -1)
    return F.binary_cross_entropy_with_logits(
        out, targets.reshape(out.shape).to(out.dtype), reduction="none").mean(dim=1)


class TargetLoss:
    """The server's loss: the user's (``user``), else the default that follows the targets.

    The default is :func:`binary_loss` once the spec's targets are ``binary``, else
    :func:`default_loss`. Float targets of one value a row travel as ``(n,)``; where the
    nodes hold them as a ``(n, 1)`` column (the spec's ``column``) the user's loss reads
    them so, as it does on the nodes (an ``nn.HuberLoss`` would broadcast ``(n, 1)``
    outputs against ``(n,)`` targets to ``(n, n)``). :meth:`follow` takes the data spec.
    """

    def __init__(self, user: LossFn | None = None) -> None:
        self.user, self.binary, self.column, self.windows = user, False, False, True
        self.parts: tuple[str, ...] = ()

    def follow(self, spec: object) -> None:
        """Read ``spec``'s targets: whether ``binary``, whether held as a column, a dict's."""
        self.binary = getattr(spec, "target", "") == "binary"
        self.column = bool(getattr(spec, "column", False))
        self.windows = getattr(spec, "target", "") == "tokens"  # else (x, y): labels apart
        self.parts = tuple(getattr(spec, "target_parts", ()))

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Per-sample losses of ``outputs`` against ``targets``."""
        if self.user is None:
            if self.binary:
                return binary_loss(outputs, targets)
            return default_loss(outputs, targets, self.windows)
        if self.parts:
            return self._dict_loss(outputs, targets)
        if self.column and targets.ndim == 1 and torch.is_floating_point(targets):
            targets = targets.unsqueeze(1)
        return self.user(outputs, targets)

    def _dict_loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The user's loss of dict targets (:attr:`parts`), one a row, their model's dict.

        The targets travel side by side; each part is cut back to its shape, integers as
        int64 (``{"label": (n,), "ink": (n,)}``), and the model's whole dict output (its
        other heads beside the one :func:`model_output` picked) is what the loss reads. A
        loss reducing the batch to one number is mapped over rows (``torch.func.vmap``).
        """
        n, user = outputs.shape[0], cast(Callable[..., torch.Tensor], self.user)
        heads = getattr(outputs, HEADS_ATTR, None)
        out = outputs if heads is None else {
            k: outputs if v is None else v for k, v in heads.items()}
        flat, target, at = targets.reshape(n, -1), {}, 0
        for part in self.parts:
            name, _, layout = part.partition("=")
            shape, integer = part_layout(layout)
            width = math.prod(shape)
            value = flat[:, at:at + width].reshape(n, *shape)
            target[name], at = value.round().long() if integer else value, at + width
        whole = user(out, target)
        if whole.ndim == 0 and n > 1:
            rows = torch.func.vmap(lambda o, t: user(
                _one_row(o), _one_row(t)).reshape(()))(out, target)
            return _rows_of(float(whole.detach()), rows, flat)
        return whole.reshape(n, -1).mean(dim=1) if whole.ndim > 1 else whole.reshape(-1)


def _one_row(value: Any) -> Any:
    """A row of a tensor or of a dict of them as a batch of one."""
    if isinstance(value, Mapping):
        return {k: v.unsqueeze(0) for k, v in value.items()}
    return value.unsqueeze(0)


def weighs_classes(loss_fn: object) -> bool:
    """Whether ``loss_fn`` (or the user's loss inside it) weighs classes unequally.

    A cross-entropy or NLL loss given class weights says what a right row of each class is
    worth to the user: the held-out rows are then judged by that loss, not by accuracy (on
    5% fraud, accuracy keeps the model that calls every row honest).
    """
    weight = getattr(getattr(loss_fn, "user", loss_fn), "weight", None)
    return (isinstance(getattr(loss_fn, "user", loss_fn), torch.nn.modules.loss._WeightedLoss)
            and isinstance(weight, torch.Tensor) and weight.numel() > 1
            and bool((weight != weight.reshape(-1)[0]).any()))


def follow_targets(loss_fn: LossFn | None, spec: object) -> None:
    """Have ``loss_fn`` read ``spec``'s targets where it is a :class:`TargetLoss`."""
    if isinstance(loss_fn, TargetLoss):
        loss_fn.follow(spec)
