"""A node's own configuration error, told to the server so that the run stops at once.

A client function that cannot answer the run as configured (a knob needs the model it was
not given, a label outside the server's classes) raises :class:`NodeConfigError`. Flower
turns it into an error reply whose reason quotes the message; the server finds the
:data:`MARKER` in it and stops the run with one line (:func:`node_config_problem`) instead
of counting the node as failed round after round. Both ends import this module: it needs
neither PyTorch nor Flower.
"""

from __future__ import annotations

__all__ = ["MARKER", "NodeConfigError", "node_config_problem"]

#: Starts every :class:`NodeConfigError` message; the server looks for it in error replies.
MARKER = "dq-flower node configuration: "


class NodeConfigError(ValueError):
    """The node cannot answer the run as configured; the message names the knob and the fix."""

    def __init__(self, problem: str) -> None:
        super().__init__(MARKER + problem)
        self.problem = problem


def node_config_problem(reason: str) -> str | None:
    """The problem a node reported in an error reply's ``reason``, or ``None``.

    Flower wraps the message (``<class '...'>:<'...'>``, a traceback in simulation); the
    problem is the text after :data:`MARKER` up to the end of its line, without Flower's
    closing ``'>``.
    """
    start = reason.find(MARKER)
    if start < 0:
        return None
    text = reason[start + len(MARKER):].splitlines()[0] if reason[start + len(MARKER):] else ""
    for tail in ("'>", "'"):
        if text.endswith(tail):
            text = text[: -len(tail)]
            break
    return text.strip() or None
