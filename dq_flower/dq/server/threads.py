"""The server's PyTorch threads: how many a training step gets (``server-threads``)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
from torch import nn

from dq_flower.model_ops import float_dtype, inference, model_input

__all__ = ["SMALL_STEP_FLOPS", "step_threads", "torch_threads"]

#: A server step (forward and backward of one minibatch) below this many FLOPs runs on one
#: thread under ``server-threads = 0``: threads gain such a step little on an idle machine
#: and cost it many times over where another process takes a core (docs/measuring.md).
SMALL_STEP_FLOPS = 100e6


def step_threads(model: nn.Module, rows: np.ndarray, batch: int, tokens: bool = False) -> int:
    """``server-threads = 0``'s choice for ``model``: 1 for a small step, else 0 (PyTorch's).

    The step's FLOPs are counted once (PyTorch's ``FlopCounterMode``) on ``rows`` (a few
    placeholder rows shaped as samples), forward in eval mode without gradients, taken
    three times for forward and backward and scaled to ``batch`` rows. A model that cannot
    be counted so trains on one thread.
    """
    # the FLOP counter: loaded only where a server first counts a step
    from torch.utils.flop_counter import FlopCounterMode

    xt = model_input(rows, next(model.parameters(), torch.empty(0)).device, tokens,
                     float_dtype(model))
    try:
        with inference(model), FlopCounterMode(display=False) as counter:
            model(xt)
    except Exception:  # noqa: BLE001 - any model: counting is a speed hint only
        return 1
    step = 3 * counter.get_total_flops() * batch / max(len(xt), 1)
    return 1 if step < SMALL_STEP_FLOPS else 0


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

