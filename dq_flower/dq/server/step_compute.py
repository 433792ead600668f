"""How the server's training steps compute: threads and the forward's precision.

``server-threads`` and ``server-autocast``: their automatic values are chosen from the
model's forward FLOPs a sample, counted once.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from dq_flower.model_ops import float_dtype, inference, model_input

__all__ = ["SMALL_STEP_FLOPS", "AUTO_BF16_FLOPS", "StepCompute", "step_compute",
           "forward_flops", "native_bfloat16", "torch_threads"]

#: A server step (forward and backward of one minibatch) below this many FLOPs runs on one
#: thread under ``server-threads = 0``: threads gain such a step little on an idle machine
#: and cost it many times over where another process takes a core (docs/measuring.md).
SMALL_STEP_FLOPS = 100e6
#: Forward FLOPs a sample from which ``server-autocast = "auto"`` takes bfloat16 on a CPU
#: with native bfloat16: a store step took 0.85-0.9x the time of float32 for models of 0.56
#: and 0.67 MFLOP, 1.2x less at 1.8 and 5.7, 1.4-1.5x less at 10 and 23 (one thread,
#: batches of 64; docs/experiments/fmnist-wide-cnn.md). A GPU is not measured: float32.
AUTO_BF16_FLOPS = 1e6
#: CPU flags (``/proc/cpuinfo``) of native bfloat16 arithmetic.
BF16_FLAGS = ("avx512_bf16", "amx_bf16")

log = logging.getLogger("flwr")


@dataclass(frozen=True)
class StepCompute:
    """What the steps run with.

    ``threads`` for :func:`torch_threads` (0: PyTorch's own); ``autocast``: ``none`` or
    ``bfloat16``.
    """

    threads: int
    autocast: str

    @classmethod
    def uncounted(cls, threads: int, autocast: str) -> StepCompute:
        """The knobs before the model can be counted: 0 threads is 1, ``auto`` float32."""
        return cls(threads or 1, "none" if autocast == "auto" else autocast)


@functools.cache
def native_bfloat16(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether this CPU computes bfloat16 natively (read from Linux's ``cpuinfo`` flags)."""
    try:
        words = set(cpuinfo.read_text().split())
    except OSError:  # not Linux: not known, so not taken
        return False
    return any(flag in words for flag in BF16_FLAGS)


def forward_flops(model: nn.Module, rows: np.ndarray, tokens: bool = False) -> float | None:
    """``model``'s forward FLOPs a sample on ``rows``; ``None`` where it cannot be counted.

    ``rows``: a few placeholder rows shaped as samples; PyTorch's ``FlopCounterMode``, in eval
    mode without gradients.
    """
    # the FLOP counter: loaded only where a server first counts a step
    from torch.utils.flop_counter import FlopCounterMode

    xt = model_input(rows, next(model.parameters(), torch.empty(0)).device, tokens,
                     float_dtype(model))
    try:
        with inference(model), FlopCounterMode(display=False) as counter:
            model(xt)
    except Exception:  # noqa: BLE001 - any model: counting is a speed hint only
        return None
    return counter.get_total_flops() / max(len(xt), 1)


def step_compute(model: nn.Module, rows: np.ndarray, batch: int, threads: int,
                 autocast: str, tokens: bool = False) -> StepCompute:
    """``server-threads`` and ``server-autocast`` for ``model``, their automatic values resolved.

    ``threads = 0``: 1 for a step (forward and backward, three times the forward, over
    ``batch`` rows) below :data:`SMALL_STEP_FLOPS`, else 0 (PyTorch's own); ``auto``:
    ``bfloat16`` from :data:`AUTO_BF16_FLOPS` a sample forward where the model is on a CPU
    that computes bfloat16 natively, else ``none``. A model that cannot be counted trains on
    one thread in float32. The FLOPs are counted once (:func:`forward_flops`), only where a
    choice needs them.
    """
    flops = forward_flops(model, rows, tokens) if not threads or autocast == "auto" else 0.0
    if not threads:
        threads = 1 if flops is None or 3 * flops * batch < SMALL_STEP_FLOPS else 0
    if autocast == "auto":
        cpu = next(model.parameters(), torch.empty(0)).device.type == "cpu"
        large = flops is not None and flops >= AUTO_BF16_FLOPS
        autocast = "bfloat16" if cpu and large and native_bfloat16() else "none"
        if cpu and native_bfloat16():
            log.info("server-autocast auto: %s (%.2f MFLOP a sample forward; bfloat16 from "
                     "%.1f on this CPU)", autocast, (flops or 0.0) / 1e6, AUTO_BF16_FLOPS / 1e6)
    return StepCompute(threads, autocast)


@contextmanager
def torch_threads(threads: int) -> Iterator[None]:
    """PyTorch's intra-op threads set to ``threads`` (0: left as they are), then restored."""
    before = torch.get_num_threads()
    if threads > 0 and threads != before:
        torch.set_num_threads(threads)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
