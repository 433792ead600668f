"""Atomic checkpoints of the server's state: one ``torch.save`` file, written then renamed.

``os.replace`` shows the new file all at once: a process killed while writing leaves the
previous checkpoint intact. The one it replaces is kept beside it (:data:`PREVIOUS_NAME`),
read when the newest cannot be.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterable
from logging import WARNING
from pathlib import Path
from typing import Any

import torch
from flwr.common.logger import log

__all__ = ["save_atomic", "load_latest", "read_checkpoint", "CHECKPOINT_NAME", "PREVIOUS_NAME",
           "UNREADABLE_NAME"]

CHECKPOINT_NAME = "server-state.pt"
#: The checkpoint before the newest one.
PREVIOUS_NAME = "server-state.prev.pt"
#: Where an unreadable newest checkpoint goes when a run resumed from the previous one saves.
UNREADABLE_NAME = "server-state.unreadable.pt"


def save_atomic(directory: str | Path, state: dict[str, Any],
                keep_as: str = PREVIOUS_NAME) -> Path:
    """Write ``state`` to ``directory/server-state.pt`` atomically and durably.

    The checkpoint it replaces is renamed ``keep_as`` first (replacing that file).
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".server-state-", suffix=".tmp", dir=directory)
    latest = directory / CHECKPOINT_NAME
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        if latest.exists():  # a crash before the next rename leaves it readable there
            os.replace(latest, directory / keep_as)
        os.replace(tmp, latest)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return latest


def _read(path: Path, required: Iterable[str]) -> tuple[dict[str, Any] | None, str]:
    """The checkpoint in ``path``, or ``None`` and why it cannot be read."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001  (any error: not a whole checkpoint)
        return None, f"{type(exc).__name__}: {str(exc).split('. ')[0][:160]}"
    if not isinstance(state, dict):
        return None, f"it holds a {type(state).__name__}, not a checkpoint"
    missing = [key for key in required if key not in state]
    return (None, f"it lacks {missing}: not a checkpoint of this package") if missing \
        else (state, "")


def read_checkpoint(directory: str | Path, required: Iterable[str] = ()
                    ) -> tuple[dict[str, Any], Path] | None:
    """The newest readable checkpoint in ``directory`` and its file; ``None`` if none is there.

    A checkpoint is readable if ``torch.load`` reads a dict with the ``required`` keys. An
    unreadable newest one is passed over for the previous one (logged, with its round);
    ``ValueError`` naming the files when none can be read. No file is changed.
    """
    directory, required = Path(directory), tuple(required)
    paths = [p for p in (directory / CHECKPOINT_NAME, directory / PREVIOUS_NAME) if p.exists()]
    failed: list[str] = []
    for path in paths:
        state, why = _read(path, required)
        if state is None:
            failed.append(f"{path} cannot be read ({why})")
            continue
        if failed:
            log(WARNING, "%s; resuming from %s, of round %s", failed[0], path.name,
                state.get("round", "?"))
        return state, path
    if not failed:
        return None
    also = ("" if len(failed) > 1 else
            f", and there is no previous checkpoint ({PREVIOUS_NAME}) beside it")
    raise ValueError(f"checkpoint-dir: {'; '.join(failed)}{also}. Restore a good copy of the "
                     "file, or start afresh with another checkpoint-dir (or move these "
                     "files away)")


def load_latest(directory: str | Path) -> dict[str, Any] | None:
    """The newest readable checkpoint in ``directory`` (see :func:`read_checkpoint`)."""
    found = read_checkpoint(directory)
    return None if found is None else found[0]
