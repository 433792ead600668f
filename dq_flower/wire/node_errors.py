"""A node's configuration error, found by the server in an error reply to stop the run."""

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
    """The text after :data:`MARKER` in ``reason`` to its line's end (no ``'>``), or ``None``."""
    start = reason.find(MARKER)
    if start < 0:
        return None
    text = (reason[start + len(MARKER):].splitlines() or [""])[0]
    text = text[:-2] if text.endswith("'>") else text.removesuffix("'")
    return text.strip() or None
