"""A failed client reply in one line: its cause, and the client's traceback once per run.

A ``ClientApp`` that raises comes back to the server as an error reply whose reason holds the
exception (in Flower's simulation engine its whole traceback, wrapped in Ray's, twice). The
server logs one line per failed reply, naming the node, its partition where the error names
one (:mod:`dq_flower.wire.partition`: the package's client functions add it) and the cause
(``ValueError: my data file is missing``), and the full reason only the first time that
cause appears. While a strategy of
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

from dq_flower.wire.partition import partition_of, without_partition

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
    """The client's own exception in one line (``"ValueError: my data file is missing"``).

    Partition tags are left out: :func:`failed_node` names the partition.
    """
    text = without_partition(str(reason))
    raised = last_exception(text)
    if raised is not None:
        return raised
    wrapped = _CLASS_REASON.match(text.strip())
    if wrapped:
        name, message = wrapped[1], _FLOWER_PREFIX.sub("", wrapped[2]).strip()
        first = next((line.strip() for line in message.splitlines() if line.strip()), "")
        if any(wrapper in name for wrapper in _WRAPPERS):
            return _one_line(first or name)
        return _one_line(f"{name}: {first}" if first else name)
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return _one_line(first or "no reason given")


def last_exception(text: str) -> str | None:
    """The last line of ``text`` naming an exception and its message, Flower's wrappers aside.

    In a traceback that is the exception raised last (chained ones come first).
    """
    raised = [found for line in str(text).splitlines()
              if (found := _EXCEPTION_LINE.match(line.strip()))
              and not any(wrapper in found[1] for wrapper in _WRAPPERS)]
    if not raised:
        return None
    found = raised[-1]
    return _one_line(f"{found[1]}: {found[2]}" if found[2] else found[1])


def _one_line(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_CAUSE else text[:MAX_CAUSE - 3] + "..."


def failed_node(node: int, reason: str) -> str:
    """``node 5 (partition 2)``, or the partition unknown where the error names none."""
    partition = partition_of(reason)
    if partition is None:
        return f"node {node} (partition unknown: the error names none)"
    return f"node {node} (partition {partition})"


class FailedReplies:
    """Logs failed replies: one line each, a cause's full reason the first time only."""

    def __init__(self) -> None:
        self.shown: set[str] = set()

    def log(self, node: int, reason: str) -> str:
        """Log node ``node``'s failed reply; returns its one-line cause."""
        cause = failure_cause(reason)
        log(WARNING, "reply from %s failed: %s", failed_node(node, reason), cause)
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
