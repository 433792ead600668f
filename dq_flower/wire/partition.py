"""The partition a failing client names in its error, read back by the server.

An error reply carries the exception's type and message only (a SuperNode sends
``<class 'ValueError'>:<'message'>``; Flower's simulation engine sends the traceback too), and
the server knows a node by Flower's node id alone. The package's client functions
(:func:`~dq_flower.client.dq_train`, :func:`~dq_flower.client.gradient_train`,
:func:`~dq_flower.client.evaluate`, :func:`~dq_flower.compression_mod`, which wraps the
app's own ``train()``, and the package's own ClientApp) end the message of an exception
raised inside them with ``[partition-id K]``, ``K`` from the node's ``node_config``;
:func:`partition_of` finds it in the reply's reason. An exception whose type formats its
message itself (``KeyError``, an ``OSError`` with an errno) gets the tag as a note instead,
which a traceback shows but a SuperNode's reason does not. An error raised before the
package's code runs (in the app's own ``train()`` outside the mod) names no partition.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from typing import Concatenate, ParamSpec, TypeVar

from flwr.app import Context

__all__ = ["names_partition", "name_partition", "partition_of", "without_partition",
           "partition_tag"]

#: The tag in a message: `` [partition-id 3]``.
_TAG = re.compile(r" ?\[partition-id (-?\d+)\]")

P = ParamSpec("P")
R = TypeVar("R")
M = TypeVar("M")


def partition_tag(context: Context) -> str:
    """`` [partition-id K]`` for the node's integer ``partition-id``; ``""`` where it has none."""
    pid = context.node_config.get("partition-id")
    if isinstance(pid, bool) or not isinstance(pid, (int, float, str)):
        return ""
    text = str(pid)
    return f" [partition-id {int(text)}]" if text.lstrip("-").isdigit() else ""


def name_partition(exc: BaseException, context: Context) -> None:
    """End ``exc``'s message with the node's partition tag (once; a note where it cannot)."""
    tag = partition_tag(context)
    if not tag or _TAG.search(str(exc)) or _TAG.search("".join(getattr(exc, "__notes__", []))):
        return
    before = exc.args
    if len(before) == 1 and isinstance(before[0], str):
        exc.args = (before[0] + tag,)
        if isinstance(exc, ImportError) and exc.msg == before[0]:
            exc.msg = exc.args[0]  # ImportError prints its msg
        if str(exc).endswith(tag):
            return
        exc.args = before  # the type formats its own message (KeyError quotes it)
    # a note (add_note on Python 3.11+; the attribute itself, shown by tracebacks, on 3.10)
    exc.__notes__ = [*getattr(exc, "__notes__", []), tag.strip()]  # type: ignore[attr-defined]


def names_partition(func: Callable[Concatenate[M, Context, P], R]
                    ) -> Callable[Concatenate[M, Context, P], R]:
    """Decorate a client function ``f(msg, context, ...)``: its errors name the partition."""

    @functools.wraps(func)
    def wrapper(msg: M, context: Context, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return func(msg, context, *args, **kwargs)
        except Exception as exc:
            name_partition(exc, context)
            raise

    return wrapper


def partition_of(reason: str) -> int | None:
    """The partition an error reply's ``reason`` names, or ``None``."""
    found = _TAG.search(str(reason))
    return int(found[1]) if found else None


def without_partition(text: str) -> str:
    """``text`` with its partition tags removed."""
    return _TAG.sub("", text)
