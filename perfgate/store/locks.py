"""The lock that serialises writes of one baseline file, and says who holds it.

One ``<area>.json.lock`` beside each baseline file, locked with ``flock``: the kernel frees it
when its holder exits, however it exits, so a stale lock cannot outlive a crash. The holder
writes its pid, command and start time into the file, and a writer that finds it taken says
so at once (then waits up to the timeout) instead of waiting in silence.

The file is opened inside the id folder's fd with O_NOFOLLOW and never truncated on open: a
symbolic link planted at its name is refused, and a file with a second name (a hard link to
something elsewhere) is refused before a byte of it is written.
"""
from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Callable, Iterator

from perfgate.store.safe_paths import PathError

LOCK_TIMEOUT_S = 120.0
_POLL_S = 0.1


class LockTimeout(ValueError):
    """Another process held the lock for the whole timeout; the message names it and the fix."""


def _stderr(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _holder(fd: int) -> tuple[str, int | None]:
    """Who holds the lock, as its file says: ``pid 123 (perfgate refresh r.json) since 01:02:03 UTC``."""
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        pid = int(info["pid"])
        return f"pid {pid} ({str(info.get('command', '?'))[:120]}) since {info.get('since', '?')}", pid
    except (OSError, ValueError, KeyError, TypeError):
        return "another process (it has not written its name yet)", None


def _open(dir_fd: int, name: str, shown: Path) -> int:
    try:
        fd = os.open(name, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise PathError(f"lock file: {shown} is a symbolic link; perfgate never writes through one: "
                            f"remove it (`rm {shown}`)") from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1:
        os.close(fd)
        raise PathError(f"lock file: {shown} is not perfgate's own lock file (a hard link with {st.st_nlink} names, "
                        f"or not a regular file); perfgate will not write into it: remove it (`rm {shown}`)")
    return fd


@contextlib.contextmanager
def exclusive(dir_fd: int, name: str, *, shown: Path, timeout_s: float = LOCK_TIMEOUT_S,
              say: Callable[[str], object] = _stderr) -> Iterator[None]:
    """Hold the lock ``name`` in the open folder ``dir_fd`` (``shown`` is its path, for messages)."""
    fd = _open(dir_fd, name, shown)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who, pid = _holder(fd)
            stop = f"stop it (`kill {pid}`)" if pid else "stop the other perfgate"
            say(f"perfgate: {shown} is locked by {who}: waiting up to {timeout_s:g} s for it to finish "
                f"(the lock is freed when that process exits; if it is stuck, {stop})")
            deadline = time.monotonic() + timeout_s
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= deadline:
                        raise LockTimeout(f"{shown}: still locked after {timeout_s:g} s by {_holder(fd)[0]}; "
                                          f"let it finish or {stop}, then re-run") from None
                    time.sleep(_POLL_S)
        since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
        os.ftruncate(fd, 0)  # our own single-named file (checked above), locked by us
        os.pwrite(fd, json.dumps({"pid": os.getpid(), "command": " ".join(sys.argv)[:300],
                                  "since": since}).encode(), 0)
        try:
            yield
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
    finally:
        os.close(fd)  # closing frees the flock
