"""Python calls of one piece of work, traced with ``sys.setprofile``.

Every Python function entered is counted, the package's own by module; calls under a
function of ``skip`` (and that function itself) are left out.
"""

from __future__ import annotations

import sys
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import CodeType

import dq_flower

PACKAGE = str(Path(dq_flower.__file__).resolve().parent)


@dataclass
class Trace:
    """What :func:`trace` counted: all calls, the package's by module, the modules in order."""

    total: int = 0
    ours: Counter = field(default_factory=Counter)
    path: list[str] = field(default_factory=list)  # package modules as entered, no repeats

    def hops(self, a: str, b: str) -> int:
        """How often the work went from module ``a`` straight into ``b``."""
        return sum(1 for x, y in pairwise(self.path) if (x, y) == (a, b))


def trace(fn: Callable[[], object], skip: Iterable[CodeType] = ()) -> Trace:
    """``fn()``'s Python calls (see the module docstring)."""
    out, skipped, held = Trace(), set(skip), [None]

    def profile(frame, event, arg):
        if held[0] is not None:
            if event == "return" and frame is held[0]:
                held[0] = None
            return
        if event != "call":
            return
        if frame.f_code in skipped:
            held[0] = frame
            return
        out.total += 1
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE):
            module = path[len(PACKAGE) + 1:]
            out.ours[module] += 1
            if not out.path or out.path[-1] != module:
                out.path.append(module)

    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
    return out
