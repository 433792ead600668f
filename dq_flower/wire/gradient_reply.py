"""The decoder of a compressed-gradient reply (``GradientStrategy``'s and DQ's)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Message

from dq_flower.codecs import PayloadError
from dq_flower.wire.gradient import METRICS_KEY, decode_update, epoch_steps
from dq_flower.wire.model_buffers import BUFFERS_KEY, read_buffers

__all__ = ["GradientUpdate", "GradientDecoder"]


@dataclass(frozen=True)
class GradientUpdate:
    """One decoded gradient reply."""

    node: int
    vector: np.ndarray  # float32, the model's size
    weight: float  # its num-examples
    loss: float  # the client's training loss (nan where the protocol has none)
    payload_bits: int  # as sent, after lossless coding
    raw_bits: int  # before lossless coding
    steps: int  # local steps the update was averaged over
    partition: int  # the client's partition id (ordering), or the node id
    buffers: dict[str, np.ndarray] | None = None  # the model's floating-point buffers


@dataclass
class GradientDecoder:
    """Check one reply's records and metrics, then decode its update.

    ``max_examples`` bounds ``num-examples``; with ``epochs`` > 0 it must be whole epochs
    and sets the local steps, else ``local_steps``. ``exact_records`` rejects other array
    records; with ``buffer_shapes`` a reply must carry the model's buffers.
    """

    keys: Sequence[str]
    sizes: Sequence[int]
    codec: object
    max_examples: int
    epochs: int = 0
    batch_size: int = 1
    local_steps: int = 1
    require_loss: bool = True
    exact_records: bool = True
    buffer_shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __call__(self, msg: Message) -> GradientUpdate:  # noqa: D102
        content = msg.content
        node = int(msg.metadata.src_node_id)
        metrics = content.metric_records.get(METRICS_KEY)
        if metrics is None:
            raise PayloadError(f"reply misses its {METRICS_KEY!r} record")
        examples = metrics.get("num-examples")
        if isinstance(examples, bool) or not isinstance(examples, int) \
                or not 1 <= examples <= self.max_examples:
            raise PayloadError(f"num-examples={examples!r} is not an int in "
                               f"[1, {self.max_examples}]")
        if self.epochs and examples % self.epochs:
            raise PayloadError(f"num-examples={examples} is not {self.epochs} epochs of "
                               "whole rows")
        loss = metrics.get("train-loss", None if self.require_loss else float("nan"))
        if isinstance(loss, bool) or not isinstance(loss, (int, float)) or (
                self.require_loss and not np.isfinite(loss)):
            raise PayloadError(f"train-loss={loss!r} is not a finite number")
        partition = metrics.get("partition-id", node)
        if isinstance(partition, bool) or not isinstance(partition, int):
            raise PayloadError(f"'partition-id'={partition!r} is not an int")
        expected = [*self.keys, *([BUFFERS_KEY] if self.buffer_shapes else [])]
        if self.exact_records and set(content.array_records) != set(expected):
            raise PayloadError(f"reply carries records {sorted(content.array_records)}, "
                               f"expected {expected}")
        buffers = None
        if self.buffer_shapes:
            if BUFFERS_KEY not in content.array_records:
                raise PayloadError(f"reply misses the model's buffers ({BUFFERS_KEY!r})")
            buffers = read_buffers(content.array_records[BUFFERS_KEY], self.buffer_shapes)
        vec, nbits, raw = decode_update(content.array_records, self.keys, self.sizes,
                                        self.codec)
        steps = (epoch_steps(examples, self.batch_size, self.epochs) if self.epochs
                 else self.local_steps)
        return GradientUpdate(node, vec, float(examples), float(loss), nbits, raw, steps,
                              int(partition), buffers)
