"""The model as it travels to clients: one raw float32 vector (no ``np.save`` headers)."""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord

from dq_flower.codecs import Payload, make
from dq_flower.model_ops import get_flat, set_flat

__all__ = ["MODEL_KEY", "model_record", "load_model_record"]

#: Record name of the model in a train message.
MODEL_KEY = "model"


def model_record(model: torch.nn.Module) -> ArrayRecord:
    """The model's parameters as one raw float32 vector (codec ``identity``)."""
    return make("identity").encode(get_flat(model)).to_record()


def load_model_record(model: torch.nn.Module, record: ArrayRecord) -> None:
    """Load parameters sent by :func:`model_record`; raises ``ValueError`` if inconsistent."""
    vec = make("identity").decode(Payload.from_record(record))
    set_flat(model, vec)
