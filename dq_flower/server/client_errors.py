"""A failed client reply in one line: its cause, and the client's traceback once per run.

A ``ClientApp`` that raises comes back to the server as an error reply whose reason holds the
whole traceback (in Flower's simulation engine wrapped in Ray's, twice). The server logs one
line per failed reply, naming the node and the cause (``ValueError: my data file is
missing``), and the full reason only the first time that cause appears. While a strategy of
this package runs, :func:`one_traceback_per_cause` also keeps Flower's simulation engine from
logging the same client traceback again for every failure: its reply carries it already.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator
from logging import WARNING

from flwr.common.logger import log

#: A line naming an exception and its message, as a traceback's last line does.
_EXCEPTION_LINE = re.compile(
    r"^(?:[A-Za-z_][\w]*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Warning)|"
    r"KeyboardInterrupt|StopIteration): ?(.*)$")
#: Flower's own wrappers around a client's exception, never the cause itself.
_WRAPPERS = ("ClientAppException", "RayTaskError", "RayActorError")
#: Flower's reason for an exception outside a traceback: ``<class 'T'>:<'message'>``.
_CLASS_REASON = re.compile(r"^<class '(?:[\w.]*\.)?(\w+)(?:\(\w+\))?'>:<'(.*)'>$", re.DOTALL)
#: Flower's prefix of a ClientAppException's message.
_FLOWER_PREFIX = re.compile(r"^\s*Exception ClientAppException occurred\. Message: ?")
#: The longest cause printed on one line.
MAX_CAUSE = 600
#: Distinct causes whose full reason is remembered as shown (a bound on memory).
MAX_CAUSES_SHOWN = 1000


def failure_cause(reason: str) -> str:
    """The client's own exception in one line (``"ValueError: my data file is missing"``)."""
    text = str(reason)
    raised = [found for line in text.splitlines()
              if (found := _EXCEPTION_LINE.match(line.strip()))
              and not any(wrapper in found[1] for wrapper in _WRAPPERS)]
    if raised:  # the last exception the client's own code raised (chained ones come first)
        found = raised[-1]
        return _one_line(f"{found[1]}: {found[2]}" if found[2] else found[1])
    wrapped = _CLASS_REASON.match(text.strip())
    if wrapped:
        name, message = wrapped[1], _FLOWER_PREFIX.sub("", wrapped[2]).strip()
        first = next((line.strip() for line in message.splitlines() if line.strip()), "")
        if any(wrapper in name for wrapper in _WRAPPERS):
            return _one_line(first or name)
        return _one_line(f"{name}: {first}" if first else name)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return _one_line(first or "no reason given")


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE - 3] + "..."


class FailedReplies:
    """Logs failed replies: one line each, a cause's full reason the first time only."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def log(self, node: int, reason: str) -> str:
        """Log node ``node``'s failed reply; returns its one-line cause."""
        cause = failure_cause(reason)
        log(WARNING, "reply from node %d failed: %s", node, cause)
        if cause not in self.shown and len(self.shown) < MAX_CAUSES_SHOWN:
            self.shown.add(cause)
            log(WARNING, "the client's whole error (shown once for this cause):\n%s",
                str(reason).strip())
        return cause


#: The process's log of failed replies (the strategies of one run share it).
FAILED_REPLIES = FailedReplies()

#: Where Flower's simulation engine logs a client's exception beside its error reply.
_ENGINE_SITES = {("vce_api.py", "worker"), ("raybackend.py", "process_message")}


class _EngineTracebacks(logging.Filter):
    """Drops the simulation engine's error records about one client's exception."""

    def filter(self, record: logging.LogRecord) -> bool:
        site = (record.pathname.replace("\\", "/").rsplit("/", 1)[-1], record.funcName)
        return not (record.levelno == logging.ERROR and site in _ENGINE_SITES)


@contextlib.contextmanager
def one_traceback_per_cause() -> Iterator[None]:
    """While inside, the failed replies alone report a client's exception (see above)."""
    flower = logging.getLogger("flwr")
    quiet = _EngineTracebacks()
    flower.addFilter(quiet)
    try:
        yield
    finally:
        flower.removeFilter(quiet)
