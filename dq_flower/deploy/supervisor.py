"""Process supervision: start processes with their logs, wait for them, stop them by pid.

A process is stopped by pid (SIGTERM, then SIGKILL), and so are its descendants
(Flower's helpers, some in a new session): :meth:`ManagedProcess.stop` snapshots them from
``/proc`` first and checks each one's start time, so a recycled pid is never hit.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Any

__all__ = ["DeploymentError", "ManagedProcess", "ProcessGroup", "free_port", "managed_process",
           "start_process", "wait_for_port"]


class DeploymentError(RuntimeError):
    """A Flower process or CLI call failed; the message carries the tail of its log."""


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it by binding port 0)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def wait_for_port(host: str, port: int, timeout: float,
                  process: ManagedProcess | None = None) -> None:
    """Wait until ``host:port`` accepts TCP connections (and ``process``, if given, lives)."""
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise DeploymentError(
                f"{process.name} exited with {process.poll()} before listening on "
                f"{host}:{port}\n{process.log_tail()}")
        try:
            with socket.create_connection((host, port), timeout=1.0):
                return
        except OSError:
            if time.monotonic() > deadline:
                tail = process.log_tail() if process is not None else ""
                raise DeploymentError(f"nothing listens on {host}:{port} after {timeout:g} s\n"
                                      f"{tail}") from None
            time.sleep(0.2)


def _stat(pid: int | str) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name, or ``None``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` (clock ticks since boot) or ``None`` if gone or a zombie."""
    fields = _stat(pid)
    return None if fields is None or fields[0] in ("Z", "X") else int(fields[19])


def _descendants(pid: int) -> list[tuple[int, int]]:
    """``(pid, start time)`` of every live descendant of ``pid`` (Linux ``/proc``; else [])."""
    children: dict[int, list[int]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for entry in entries:
        fields = _stat(entry) if entry.isdigit() else None
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[tuple[int, int]] = []
    stack = list(children.get(pid, []))
    while stack:
        child = stack.pop()
        start = _start_time(child)
        if start is not None:
            found.append((child, start))
        stack.extend(children.get(child, []))
    return found


def _signal_if_same(pid: int, start: int, sig: int) -> bool:
    """Send ``sig`` to ``pid`` only if it is still the process that started at ``start``."""
    if _start_time(pid) != start:
        return False
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


@dataclass
class ManagedProcess:
    """A subprocess with its log file; stopped by pid (SIGTERM, then SIGKILL)."""

    name: str
    args: list[str]
    log_path: Path | None
    popen: subprocess.Popen[bytes]
    _known: dict[int, int] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        """Process id."""
        return int(self.popen.pid)

    @property
    def command(self) -> str:
        """The command line, shell-quoted."""
        return shlex.join(self.args)

    def poll(self) -> int | None:
        """Exit status, or ``None`` while running."""
        return self.popen.poll()

    def log_text(self) -> str:
        """The whole log so far ("" when output goes to the terminal)."""
        try:
            return self.log_path.read_text(errors="replace") if self.log_path else ""
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        """The last ``lines`` lines of the log, labelled."""
        tail = "\n".join(self.log_text().splitlines()[-lines:])
        return f"--- last lines of {self.log_path} ---\n{tail}"

    def remember_descendants(self) -> None:
        """Record the live descendants now (stopped later even if re-parented meanwhile)."""
        if self.poll() is None:
            self._known.update(dict(_descendants(self.pid)))

    def wait_for_log(self, pattern: str | re.Pattern[str], timeout: float, *,
                     allow_exit: bool = False) -> re.Match[str]:
        """Wait until the log matches ``pattern``; return the match.

        :class:`DeploymentError` on timeout or when the process exits first (with
        ``allow_exit``, after its final log is searched).
        """
        regex = re.compile(pattern) if isinstance(pattern, str) else pattern
        deadline = time.monotonic() + timeout
        while True:
            exited = self.poll() is not None
            match = regex.search(self.log_text())
            if match:
                self.remember_descendants()
                return match
            if exited and not allow_exit:
                raise DeploymentError(f"{self.name} exited with {self.poll()} before logging "
                                      f"{regex.pattern!r}\n{self.log_tail()}")
            if exited or time.monotonic() > deadline:
                raise DeploymentError(f"{self.name}: no {regex.pattern!r} in its log after "
                                      f"{timeout:g} s\n{self.log_tail()}")
            time.sleep(0.2)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the process to exit; return its status."""
        return int(self.popen.wait(timeout=timeout))

    def stop(self, timeout: float = 10.0, grace: float = 3.0) -> int | None:
        """Stop the process and its descendants by pid; return the exit status.

        SIGTERM, then SIGKILL after ``timeout`` s; descendants get ``grace`` s to exit with
        their parent first.
        """
        self.remember_descendants()
        if self.poll() is None:
            with suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.kill(self.pid, signal.SIGKILL)
                self.popen.wait(timeout=timeout)
        _stop_pids(self._known, grace=grace, timeout=timeout)
        self._known.clear()
        return self.poll()


def _stop_pids(pids: Mapping[int, int], *, grace: float, timeout: float) -> None:
    """Stop the processes ``{pid: start time}`` still alive: wait, SIGTERM, SIGKILL."""

    def alive() -> list[tuple[int, int]]:
        return [(p, s) for p, s in pids.items() if _start_time(p) == s]

    deadline = time.monotonic() + grace
    while alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    for sig, wait_s in ((signal.SIGTERM, timeout), (signal.SIGKILL, timeout)):
        left = alive()
        if not left:
            return
        for pid, start in left:
            _signal_if_same(pid, start, sig)
        deadline = time.monotonic() + wait_s
        while alive() and time.monotonic() < deadline:
            time.sleep(0.1)


def start_process(args: Sequence[str], *, log_path: str | Path | None,
                  env: Mapping[str, str] | None = None, cwd: str | Path | None = None,
                  name: str | None = None) -> ManagedProcess:
    """Start ``args`` in a session of its own, output appended to ``log_path`` (or inherited)."""
    log = Path(log_path) if log_path is not None else None
    with ExitStack() as stack:
        out: IO[bytes] | None = None
        if log is not None:
            log.parent.mkdir(parents=True, exist_ok=True)
            out = stack.enter_context(log.open("ab"))
        popen = subprocess.Popen(  # noqa: S603  (fixed argument list, no shell)
            list(args), stdout=out, stderr=subprocess.STDOUT if out is not None else None,
            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None, cwd=cwd,
            start_new_session=True)
    return ManagedProcess(name or Path(args[0]).name, list(args), log, popen)


@contextmanager
def managed_process(args: Sequence[str], *,
                    ready: Callable[[ManagedProcess], object] | None = None,
                    stop_timeout: float = 10.0, **start: Any) -> Iterator[ManagedProcess]:
    """Start a process, wait for ``ready(proc)``, yield it, always stop it (``stop_timeout``)."""
    proc = start_process(args, **start)
    try:
        if ready is not None:
            ready(proc)
        yield proc
    finally:
        proc.stop(timeout=stop_timeout, grace=min(3.0, stop_timeout))


class ProcessGroup:
    """Processes started together and stopped together, in reverse order, on exit."""

    def __init__(self) -> None:
        self.processes: list[ManagedProcess] = []

    def start(self, args: Sequence[str], **start: Any) -> ManagedProcess:
        """Start a process that this group will stop (:func:`start_process`'s keywords)."""
        proc = start_process(args, **start)
        self.processes.append(proc)
        return proc

    def stop_all(self) -> None:
        """Stop every process, newest first; errors in one never skip the others."""
        errors: list[BaseException] = []
        while self.processes:
            proc = self.processes.pop()
            try:
                proc.stop()
            except BaseException as exc:  # noqa: BLE001  (keep stopping the others)
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> ProcessGroup:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop_all()
