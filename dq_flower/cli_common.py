"""What the ``dq-flower`` command's parts share: its name, exit statuses, errors, number flags."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable

__all__ = ["PROG", "EXIT_USAGE", "EXIT_FAILED_RUNS", "fail", "int_arg", "float_arg"]

PROG = "dq-flower"
#: A mistake the user can fix: unknown preset or method, a bad flag, missing data files.
EXIT_USAGE = 2
#: Every method of a comparison failed.
EXIT_FAILED_RUNS = 1


def fail(message: str, command: str = PROG) -> int:
    """Print ``<command>: error: <message>`` on stderr; return :data:`EXIT_USAGE`."""
    print(f"{command}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE


def int_arg(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type``: an integer in ``low..high``, else a one-line usage error."""
    span = f"in {low}..{high}" if high is not None else f">= {low}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"must be an integer {span}, got {text!r}")
        return value

    return parse


def float_arg(low: float, high: float | None = None) -> Callable[[str], float]:
    """An argparse ``type``: a finite number ``> low`` (and ``<= high``)."""
    span = f"in ({low:g}, {high:g}]" if high is not None else f"> {low:g}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > low and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"must be a number {span}, got {text!r}")
        return value

    return parse
