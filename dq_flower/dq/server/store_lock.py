"""One run per ``store-dir``: a lock file there, held by the run's process.

``store-dir/store.lock`` is locked with ``flock`` (the kernel drops the lock when its
process ends, however it ends) and holds the owner's pid for the message of a second run,
which is refused (:class:`StoreDirLockedError`). A lock file whose process no longer holds it
(killed, crashed) is taken over with a log line naming that process. Within one process
the lock is shared: a strategy rebuilt after a crash in the same process resumes freely.
"""

from __future__ import annotations

import fcntl
import os
import threading
import weakref
from logging import WARNING
from pathlib import Path

from flwr.common.logger import log

__all__ = ["LOCK_FILE", "StoreDirLockedError", "StoreLock", "lock_store_dir"]

#: Name of the lock file in ``store-dir``.
LOCK_FILE = "store.lock"

_HELD: weakref.WeakValueDictionary[str, StoreLock] = weakref.WeakValueDictionary()
_GUARD = threading.Lock()


class StoreDirLockedError(RuntimeError):
    """Another process's run holds the ``store-dir``."""


def _read_pid(fd: int) -> int | None:
    text = os.pread(fd, 64, 0).decode("ascii", "replace").strip()
    return int(text) if text.isdigit() else None


class StoreLock:
    """The lock of one ``store-dir``, held until :meth:`release` (or the process ends)."""

    def __init__(self, directory: str | Path) -> None:
        self._fd: int | None = None
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.path = self.directory / LOCK_FILE
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            owner = _read_pid(fd)
            os.close(fd)
            raise StoreDirLockedError(
                f"store-dir {str(self.directory)!r} is in use by the run of process "
                f"{owner if owner is not None else '(unknown)'} (lock {self.path}): give "
                "each run its own store-dir, or stop that run first") from None
        old = _read_pid(fd)
        if old is not None and old != os.getpid():
            log(WARNING, "store-dir %s: taking over the lock of process %d, which no longer "
                "holds it (it ended without releasing it)", self.directory, old)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
        self._fd = fd

    @property
    def held(self) -> bool:
        """Whether this object still holds the lock."""
        return self._fd is not None

    def release(self, _truncate=os.ftruncate, _close=os.close) -> None:
        """Give the lock up (the file stays, empty)."""
        fd, self._fd = getattr(self, "_fd", None), None
        if fd is None:
            return
        try:
            _truncate(fd, 0)
        finally:
            _close(fd)  # closing drops the flock

    def __del__(self) -> None:
        self.release()


def lock_store_dir(directory: str | Path) -> StoreLock:
    """The lock of ``directory``: this process's if it holds it already, else a new one.

    Raises :class:`StoreDirLockedError` (naming the owner's pid) where another process holds it.
    """
    key = str(Path(directory).resolve())
    with _GUARD:
        held = _HELD.get(key)
        if held is not None and held.held:
            return held
        lock = StoreLock(directory)
        _HELD[key] = lock
        return lock
