"""LoRA adapters with ``peft``: wrap a base model, move the adapters in and out of records.

Only the adapter tensors travel: :func:`adapter_record` is the ``ArrayRecord`` a device
uploads (``peft``'s ``get_peft_model_state_dict``: the ``lora_A``/``lora_B`` weights, float32),
:func:`load_adapters` puts a received one into a wrapped model. The base model's weights
never leave; every party builds the same base beforehand.

Which modules of ``torch.nn.TransformerEncoderLayer`` can be adapted: ``linear1`` and
``linear2`` (``nn.Linear``) and ``self_attn`` (``peft``'s LoRA for ``nn.MultiheadAttention``
adapts its packed input projection and its ``out_proj``). ``out_proj`` alone is an
``nn.Linear`` that ``peft`` accepts but that never runs as a module (the attention reads its
weight directly), so an adapter there would change nothing. And in eval mode the layer's
fused fast path reads the base weights directly, so a wrapped model evaluated as it is
ignores its adapters: evaluate :func:`merged` instead, a copy with the adapters merged in.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from torch import nn

from dq_flower.extras import explain_missing

__all__ = ["LoraSettings", "with_adapters", "adapter_record", "load_adapters", "merged",
           "cosine_lr", "adapter_bytes", "DEFAULT_TARGETS"]

#: The modules of the package's ``CharTransformer`` (``nn.TransformerEncoderLayer`` blocks)
#: that LoRA adapts: the attention (input and output projections) and both feed-forward layers.
DEFAULT_TARGETS: tuple[str, ...] = ("self_attn", "linear1", "linear2")


@dataclass(frozen=True)
class LoraSettings:
    """LoRA's rank, scale (``alpha / rank``), the adapted modules and the seed of ``lora_A``.

    Rank 8 and alpha 16 are FlowerTune's baselines' settings.
    """

    rank: int = 8
    alpha: int = 16
    targets: tuple[str, ...] = DEFAULT_TARGETS
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank < 1 or not self.alpha > 0 or not self.targets:
            raise ValueError(f"LoRA needs rank >= 1, alpha > 0 and target modules; got "
                             f"rank={self.rank}, alpha={self.alpha}, targets={self.targets}")


@explain_missing("LoRA adapters")
def with_adapters(base: nn.Module, settings: LoraSettings) -> nn.Module:
    """A copy of ``base`` with LoRA adapters (``peft``), only the adapters trainable.

    ``lora_A`` starts from ``settings.seed`` (``lora_B`` at zero, so the wrapped model equals
    ``base`` until trained); the global RNG is left as it was.
    """
    from peft import LoraConfig, get_peft_model  # the text extra, loaded where LoRA is used

    config = LoraConfig(r=settings.rank, lora_alpha=settings.alpha,
                        target_modules=list(settings.targets), lora_dropout=0.0, bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        return get_peft_model(copy.deepcopy(base), config)


def adapter_record(model: nn.Module) -> ArrayRecord:
    """The adapters of a wrapped model, float32, keyed as ``peft`` names them."""
    from peft import get_peft_model_state_dict  # the text extra (as above)

    state = get_peft_model_state_dict(model)
    return ArrayRecord({name: Array(np.ascontiguousarray(t.detach().cpu().float().numpy()))
                        for name, t in state.items()})


def load_adapters(model: nn.Module, record: ArrayRecord) -> None:
    """Put the adapters of ``record`` into ``model``: the same names and shapes, or ValueError."""
    # the text extra (as above)
    from peft import get_peft_model_state_dict, set_peft_model_state_dict

    own = get_peft_model_state_dict(model)
    got = {name: torch.from_numpy(np.array(array.numpy(), dtype=np.float32))
           for name, array in record.items()}
    if set(got) != set(own):
        raise ValueError(f"adapters {sorted(set(got) ^ set(own))[:4]} are not this model's "
                         f"({len(got)} received, {len(own)} expected)")
    bad = [n for n, t in got.items() if tuple(t.shape) != tuple(own[n].shape)]
    if bad:
        raise ValueError(f"adapter {bad[0]!r}: shape {tuple(got[bad[0]].shape)}, expected "
                         f"{tuple(own[bad[0]].shape)}")
    set_peft_model_state_dict(model, got)


def merged(model: nn.Module) -> nn.Module:
    """A copy of a wrapped model with its adapters merged in: the base model's own class."""
    return copy.deepcopy(model).merge_and_unload()  # type: ignore[operator]


def cosine_lr(server_round: int, num_rounds: int, lr_max: float, lr_min: float) -> float:
    """FlowerTune's learning rate schedule: cosine from ``lr_max`` at round 0 to ``lr_min``."""
    fraction = min(max(server_round, 0), num_rounds) / max(num_rounds, 1)
    return lr_min + 0.5 * (lr_max - lr_min) * (1 + math.cos(math.pi * fraction))


def adapter_bytes(record: ArrayRecord, names: Sequence[str] | None = None) -> int:
    """Bytes of the adapter tensors themselves (no framing)."""
    return int(sum(a.numpy().nbytes for n, a in record.items() if names is None or n in names))
