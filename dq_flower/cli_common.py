"""What the ``dq-flower`` command's parts share: its name, its exit statuses, its errors."""

from __future__ import annotations

import sys

__all__ = ["PROG", "EXIT_USAGE", "EXIT_FAILED_RUNS", "fail"]

PROG = "dq-flower"
#: A mistake the user can fix: unknown preset or method, a bad flag, missing data files.
EXIT_USAGE = 2
#: Every method of a comparison failed.
EXIT_FAILED_RUNS = 1


def fail(message: str, command: str = PROG) -> int:
    """Print ``<command>: error: <message>`` on stderr; return :data:`EXIT_USAGE`."""
    print(f"{command}: error: {message}", file=sys.stderr, flush=True)
    return EXIT_USAGE
