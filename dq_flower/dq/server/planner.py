"""DQ's ``upload-mode``: per round, upload quantized samples or a compressed gradient.

``auto`` picks the mode whose uplink bits over the rest of the run are projected lower;
with the sampled clients ``K`` and ``R`` rounds left (this one included):

- data: ``sum_k left_k * bits_per_sample + ceil(left_k / budget) * bits_per_reply``,
  ``left_k = min(samples client k has not uploaded, R * budget)`` (``bits_per_reply``: the
  envelope, framing, metrics and compensation);
- gradient: ``R * |K| * bits_per_gradient_reply``.

Each figure starts as the exact size of a synthetic reply coded as the clients code theirs
(random rows) and becomes the one measured in the last round of its kind (per sample and
per gradient reply: the mean; per data reply besides its samples: the replies' median, so
one padded reply does not move it). The choice is about uplink bytes only, not about which
mode trains better.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import MetricRecord, RecordDict

from dq_flower.accounting import content_bytes
from dq_flower.dq.server.federation import FederationData
from dq_flower.wire.dq_batch import GRADIENT_KEY
from dq_flower.wire.dq_upload import encode_batch

__all__ = ["UploadPlanner", "RoundPlan", "first_estimates", "gradient_estimate", "reply_bits",
           "ESTIMATES"]

#: The planner's estimates, in bits: per sample, per data reply besides its samples, and per
#: gradient reply.
ESTIMATES = ("sample_bits", "reply_bits", "gradient_bits")


@dataclass(frozen=True)
class RoundPlan:
    """The chosen mode of one round and the two estimates it was chosen from."""

    mode: str
    data_bits: float
    gradient_bits: float


@dataclass
class UploadPlanner:
    """Chooses each round's upload mode from estimated uplink bits.

    Parameters
    ----------
    mode : str
        ``data``, ``gradient`` or ``auto``.
    budget : int
        Samples a client uploads per data round (at most).
    resend : bool
        Whether uploaded samples may be chosen again (then they never run out).
    sample_bits : float
        Bits of one uploaded sample (codes, range, label, id).
    reply_bits : float
        Bits of a data reply besides its samples (envelope, metrics, compensation).
    gradient_bits : float
        Bits of one client's whole gradient reply.
    data : FederationData
        What each client holds and sent (:attr:`FederationData.sent`), read here.
    """

    mode: str
    budget: int
    resend: bool
    sample_bits: float
    reply_bits: float
    gradient_bits: float
    data: FederationData = field(default_factory=FederationData)

    def samples_left(self, node: int, rounds: int) -> int:
        """Samples the node would upload in ``rounds`` data rounds (budget-bound if unknown)."""
        cap = int(rounds) * self.budget
        known = self.data.sent.get(int(node))
        if known is None:
            return cap
        examples, uploaded = known
        left = examples * int(rounds) if self.resend else max(examples - uploaded, 0)
        return min(cap, left)

    def plan(self, nodes: list[int], rounds_left: int) -> RoundPlan:
        """Project both modes' uplink over ``rounds_left`` rounds with ``nodes``; choose."""
        rounds_left = max(int(rounds_left), 1)
        left = [self.samples_left(node, rounds_left) for node in nodes]
        data = sum((k * self.sample_bits + -(-k // self.budget) * self.reply_bits for k in left),
                   0.0)
        grad = rounds_left * len(nodes) * self.gradient_bits
        choice = "gradient" if grad < data else "data"
        return RoundPlan(choice if self.mode == "auto" else self.mode, data, grad)

    def measured(self, **bits: float) -> None:
        """Replace estimates (:data:`ESTIMATES`) by measured means; non-finite ones are ignored."""
        for name, value in bits.items():
            if name not in ESTIMATES:
                raise ValueError(f"unknown estimate {name!r}")
            if value is not None and np.isfinite(value):
                setattr(self, name, float(value))

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: the measured estimates (the counts are the federation's)."""
        return {name: getattr(self, name) for name in ESTIMATES}

    def load_state(self, state: dict[str, Any]) -> None:
        """Inverse of :meth:`state`."""
        for name in ESTIMATES:
            setattr(self, name, float(state[name]))


def reply_bits(content: RecordDict) -> int:
    """Bits of a reply's content as Flower serializes it (what the ledger counts)."""
    return 8 * content_bytes(content)


def first_estimates(cfg: Any, mode: str, dim: int, channels: int, num_classes: int,
                    comp_codec: Any, num_params: int, seed: int) -> dict[str, float]:
    """Exact sizes of a full-budget data reply of random rows coded as the clients code theirs."""
    rng = np.random.default_rng(seed)
    n = int(cfg.budget)
    samples = cfg.sample_quantizer(mode, channels).encode(
        rng.random((n, int(dim)), dtype=np.float32), rng)
    comp = None if comp_codec is None else comp_codec.encode(
        rng.standard_normal(num_params).astype(np.float32), rng)
    content, payload = encode_batch(samples, np.zeros(n, np.int64), np.arange(n), np.ones(n),
                                    int(num_classes), 1 << 16, comp)
    content["metrics"] = _metrics("num-examples", "partition-id", "candidates", "selected",
                                  "up-payload-bits", "client-time-s")
    sample_payload = payload - (comp.nbits if comp is not None else 0)
    return {"sample_bits": sample_payload / n,
            "reply_bits": float(reply_bits(content) - sample_payload)}


def gradient_estimate(grad_codec: Any, num_params: int, seed: int) -> float:
    """Exact size in bits of a gradient reply: a standard normal D-vector coded as clients do."""
    rng = np.random.default_rng(seed)
    grad = grad_codec.encode(rng.standard_normal(num_params).astype(np.float32), rng)
    content = RecordDict({GRADIENT_KEY: grad.to_record()})
    content["metrics"] = _metrics("num-examples", "partition-id", "train-loss",
                                  "up-payload-bits", "client-time-s")
    return float(reply_bits(content))


def _metrics(*keys: str) -> MetricRecord:
    """A metrics record with typical values (int counts, float times and losses)."""
    return MetricRecord({k: (0.5 if k.endswith(("-s", "-loss")) else 1 << 12) for k in keys})
