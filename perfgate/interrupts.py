"""What a Ctrl-C (or SIGTERM) did to a `perfgate` command: nothing written, or all of it.

Commands put their writes inside :func:`writing`. While a held block runs, SIGINT and
SIGTERM wait until its files are complete (a refresh of four areas never stops after
two), and the block is remembered as completed. `perfgate.cli` asks :func:`outcome` what
to say when a signal ends a command: exit 130 and "nothing was written" when no write had
begun, exit 0 when every write had completed, and which output is incomplete when an
unheld write (report plots) was cut short.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator

_started: list[str] = []
_completed: list[str] = []
_deferred: list[int] = []


def reset() -> None:
    """Forget earlier commands (``perfgate.cli.main`` runs one command per call)."""
    _started.clear()
    _completed.clear()
    _deferred.clear()


def set_handlers(handlers: dict) -> dict:
    """Set SIGINT/SIGTERM handlers with both blocked while they change; return the ones replaced.

    The one way perfgate switches its handlers. A signal that arrives between CPython's check for
    pending signals and a switch to SIG_IGN is reported on stderr as a traceback, "OSError: Signal 2
    ignored due to race condition", from the next check (seen once in CI after a complete refresh; 32
    times in 634,674 switches under a stream of SIGINTs, 0 with the block). A blocked signal waits; one
    whose handler became SIG_IGN is discarded. A handler of ``None`` (installed outside Python) cannot
    be set from here and is left as it is."""
    blocking = hasattr(signal, "pthread_sigmask")  # not on Windows
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, handlers) if blocking else None
    old = {}
    try:
        for sig, handler in handlers.items():
            if handler is not None:
                old[sig] = signal.signal(sig, handler)
    finally:
        if blocking:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
    return old


class Hold:
    """SIGINT and SIGTERM collected, not acted on, from :meth:`start` until :meth:`release` returns them.

    For a hold that spans hooks: a pytest session holds them from the start of its own
    ``pytest_sessionfinish`` (before any file is written) until its report, naming what was
    written, is printed; a KeyboardInterrupt in between used to land in another plugin's terminal
    summary, so a refreshed committed baseline went unreported (issue 49). Off the main thread
    (where handlers cannot be set) it holds nothing."""

    def __init__(self):
        self.got: list[int] = []
        self._old: dict | None = None

    def start(self) -> "Hold":
        if self._old is None and threading.current_thread() is threading.main_thread():
            self._old = set_handlers({sig: lambda signum, frame: self.got.append(signum)
                                      for sig in (signal.SIGINT, signal.SIGTERM)})
        return self

    @property
    def holding(self) -> bool:
        return self._old is not None

    def release(self) -> list[int]:
        """The handlers as they were before :meth:`start`; the signals that arrived meanwhile."""
        if self._old is not None:
            set_handlers(self._old)
            self._old = None
        return list(self.got)


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM that arrive inside the block are collected, not acted on, until it ends."""
    hold = Hold().start()
    try:
        yield hold.got
    finally:
        hold.release()


@contextlib.contextmanager
def writing(what: str, *, hold: bool = True) -> Iterator[None]:
    """Mark the block as writing ``what`` (e.g. "baselines in baselines/cpu-X"); ``hold`` defers signals."""
    _started.append(what)
    if hold:
        with held_signals() as got:
            yield
            # Completed before the handlers come back: a signal that arrived during the block is
            # run by whichever handler is current when Python gets to it, which may be the
            # command's own, just after the restore; it must find the write completed.
            _completed.append(what)
        _deferred.extend(got)
    else:
        yield
        _completed.append(what)


def deferred_note() -> str | None:
    """After a command returned: the signals that waited for its writes, if any."""
    if not _deferred:
        return None
    names = ", ".join(sorted({signal.Signals(s).name for s in _deferred}))
    return f"perfgate: {names} arrived while {'; '.join(_completed)} were written; the writes were completed first"


def outcome(signum: int) -> tuple[int, str]:
    """Exit code and the one line to print when ``signum`` ended a command."""
    unfinished = [w for w in _started if w not in _completed]
    if unfinished:
        return 128 + signum, f"perfgate: interrupted while writing {unfinished[0]}; it is incomplete"
    if _completed:
        return 0, f"perfgate: interrupted after the writes completed ({'; '.join(_completed)})"
    return 128 + signum, "perfgate: interrupted; nothing was written"


def say_while_writing(text: str, emit: Callable[[str], object] = print) -> None:
    """A progress line printed between the writes of one command (``wrote PATH``).

    A reader that leaves (``perfgate refresh --yes R | head``) must not stop the writes half way:
    on a closed pipe, stdout goes to /dev/null and the writes go on; the exit code then tells
    that they completed."""
    try:
        emit(text)
        sys.stdout.flush()
    except BrokenPipeError:
        stdout_to_devnull()


def stdout_to_devnull() -> None:
    """After a closed pipe: later writes and the interpreter's last flush go nowhere, quietly
    (Python's docs, "Note on SIGPIPE")."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
