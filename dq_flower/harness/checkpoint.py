"""Atomic checkpoints of the server's state: one ``torch.save`` file, written then renamed.

``os.replace`` shows the new file all at once: a process killed while writing leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

__all__ = ["save_atomic", "load_latest", "CHECKPOINT_NAME"]

CHECKPOINT_NAME = "server-state.pt"


def save_atomic(directory: str | Path, state: dict[str, Any]) -> Path:
    """Write ``state`` to ``directory/server-state.pt`` atomically and durably."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".server-state-", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, directory / CHECKPOINT_NAME)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return directory / CHECKPOINT_NAME


def load_latest(directory: str | Path) -> dict[str, Any] | None:
    """The last complete checkpoint in ``directory``, or ``None`` if there is none."""
    path = Path(directory) / CHECKPOINT_NAME
    return torch.load(path, map_location="cpu", weights_only=False) if path.exists() else None
