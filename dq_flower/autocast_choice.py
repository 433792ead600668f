"""``server-autocast = "auto"``: bfloat16 where this CPU computes it natively and it pays.

On a CPU with AVX-512 BF16 (one thread, batches of 64; ``docs/measuring.md``), a store step
with the forward under bfloat16 autocast took 0.85-0.9x the time of float32 for models of
0.56 and 0.67 MFLOP a sample forward, 1.2x less at 1.8 and 5.7 MFLOP, 1.4-1.5x less at 10
and 23 MFLOP. ``auto`` takes bfloat16 from :data:`AUTO_MIN_FLOPS` a sample on such a CPU and
float32 everywhere else (a GPU included: not measured there). The choice depends on the
machine and the model only, never on the run's draws.
"""

from __future__ import annotations

import functools
import logging
import weakref
from pathlib import Path

import torch
from torch import nn

__all__ = ["AUTO_MIN_FLOPS", "native_bfloat16", "forward_flops", "resolve_autocast"]

#: Forward FLOPs a sample from which ``auto`` takes bfloat16 (measured crossover: 0.7-1.8 M).
AUTO_MIN_FLOPS = 1e6
#: CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

log = logging.getLogger("flwr")
#: ``auto``'s choice by model: counted and logged once a model
_CHOSEN: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()


@functools.cache
def native_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bfloat16 natively (read from Linux's ``cpuinfo`` flags)."""
    try:
        words = set(cpuinfo.read_text().split())
    except OSError:  # not Linux: not known, so not taken
        return False
    return any(flag in words for flag in BF16_FLAGS)


def forward_flops(model: nn.Module, x: torch.Tensor) -> float:
    """``model``'s forward FLOPs a sample on the batch ``x`` (eval mode, no gradients)."""
    from torch.utils.flop_counter import FlopCounterMode  # loaded where a model is counted

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
    finally:
        model.train(was_training)
    return counter.get_total_flops() / max(len(x), 1)


def resolve_autocast(value: str, model: nn.Module, x: torch.Tensor) -> str:
    """``value``, or for ``auto`` ``bfloat16`` or ``none`` for ``model`` on inputs like ``x``."""
    if value != "auto":
        return value
    if model in _CHOSEN:
        return _CHOSEN[model]
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    if device.type != "cpu" or not native_bfloat16():
        chosen = "none"
    else:
        flops = forward_flops(model, x[:2])
        chosen = "bfloat16" if flops >= AUTO_MIN_FLOPS else "none"
        log.info("server-autocast auto: %s (%.2f MFLOP a sample forward; bfloat16 from %.1f "
                 "on this CPU)", chosen, flops / 1e6, AUTO_MIN_FLOPS / 1e6)
    _CHOSEN[model] = chosen
    return chosen
