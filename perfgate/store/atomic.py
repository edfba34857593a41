"""Crash-safe file writes: a reader sees the old file or the complete new one, never half.

Two forms. :func:`write_json_atomic` (and :func:`write_bytes_atomic`) write a results file at a path the
user named; the temporary file names its writer's pid, and the next write of the path removes those of
writers that no longer run (a SIGKILL skips every cleanup).
:func:`replace_in` writes a baseline file (or its ``.prev``) inside a folder already opened
without following links (perfgate.store.safe_paths.writable_folder): the new file is created
with O_EXCL|O_NOFOLLOW, so nothing planted at a temporary name is written through, and it
replaces the old name by rename, so a hard link or a symbolic link at the target name is
replaced, never written into.
"""
from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import tempfile
from pathlib import Path
from typing import Any

_NEW_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def json_bytes(data: Any, *, finite: bool = True) -> bytes:
    """The committed form of a JSON document. ``finite``: NaN and infinities are refused (ValueError),
    never written as the non-JSON ``NaN``/``Infinity`` that other readers choke on."""
    return (json.dumps(data, indent=1, sort_keys=False, allow_nan=not finite) + "\n").encode()


def _write_all(fd: int, data: bytes) -> None:
    os.fchmod(fd, 0o644)  # mkstemp creates 0600; baselines and results are shared, committed files
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
    os.fsync(fd)


def write_json_atomic(path: Path, data: Any) -> None:
    """Write JSON to a temp file in the same folder, fsync it, then rename over ``path``."""
    write_bytes_atomic(path, json_bytes(data, finite=False))  # results: their readers check every number


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: alive
        return True
    return True


def remove_stale_temp_files(path: Path) -> None:
    """Remove the temporary files (``.<name>.<pid>.<random>.tmp``) that earlier writes of ``path`` left
    when their process was killed (SIGKILL skips every cleanup): a process that no longer runs is not
    writing them. A temp file of a live process (a concurrent write) is left alone."""
    stale = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.[^/]+\.tmp")
    with contextlib.suppress(OSError):
        for entry in os.listdir(path.parent):
            m = stale.fullmatch(entry)
            if m and int(m.group(1)) != os.getpid() and not _alive(int(m.group(1))):
                with contextlib.suppress(OSError):
                    os.unlink(path.parent / entry)


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to a temp file in the same folder, fsync it, then rename over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temp_files(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp", dir=path.parent)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def replace_in(dir_fd: int, name: str, data: bytes) -> None:
    """Make ``name`` in the open folder ``dir_fd`` hold ``data``: a new file, fsynced, renamed over
    the old name, then the folder fsynced. A failure (disk full) leaves the old file as it was."""
    tmp = f".{name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, _NEW_FILE, 0o644, dir_fd=dir_fd)
    try:
        try:
            _write_all(fd, data)
        finally:
            os.close(fd)
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def read_in(dir_fd: int, name: str) -> bytes | None:
    """The bytes of ``name`` in the open folder, not following a link (None if it does not exist)."""
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()
