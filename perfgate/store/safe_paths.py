"""Paths under the baselines root: area names that are one safe path component, and the
check that a resolved path still lies inside the root.

An area (``collectives``, ``training``) becomes ``<root>/<hardware-id>/<area>.json``; it
comes from a test's folder or from a results file, so it is checked like a hardware id
(same characters, no separators, no ``..``). Even a checked name can leave the tree
through a symbolic link, so every path the BaselineStore and load_settings touch is
resolved and must lie inside the (resolved) root; writes also go through folders opened
without following links (:func:`writable_folder`), so an in-root alias is refused too.
"""
from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import Iterable, Iterator

from perfgate.machine.hardware_id import HARDWARE_ID_PATTERN


class PathError(ValueError):
    """A name or path that would leave the baselines root; the message names it and its source."""


def check_area(value: object, *, source: str, known: Iterable[str] | None = None) -> str:
    """Return ``value`` if it is a safe area name (and one of ``known``, if given)."""
    if not isinstance(value, str) or not HARDWARE_ID_PATTERN.fullmatch(value) or ".." in value:
        shown = repr(value) if len(repr(value)) <= 100 else repr(value)[:97] + "..."
        raise PathError(f"{source}: {shown} is not a valid area name: an area is one folder name of "
                        f"1-80 letters, digits, '.', '_', '+' or '-', with no '/' and no '..' (e.g. collectives)")
    if known is not None:
        known = sorted(set(known))
        if value not in known:
            raise PathError(f"{source}: unknown area {value!r}; known here: {', '.join(known) or 'none'}")
    return value


def inside_root(root: Path, path: Path, *, what: str) -> Path:
    """``path`` resolved, if it lies inside ``root`` (resolved); else PathError naming both."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise PathError(f"{what}: {path} resolves to {real}, outside the baselines root {real_root}; "
                        f"perfgate reads and writes only inside it (remove the link or fix the name)")
    return Path(path)


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_target(name: str, dir_fd: int | None) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _open_real_folder(name: str, shown: Path, *, dir_fd: int | None, what: str, fix: str) -> int:
    """An fd of folder ``name`` (relative to ``dir_fd``), created if missing; a link is refused."""
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        if dir_fd is None:
            os.makedirs(name, exist_ok=True)
        else:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, 0o755, dir_fd=dir_fd)
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(st.st_mode):
        raise PathError(f"{what}: {shown} is a symbolic link (to {_link_target(name, dir_fd)}); perfgate writes "
                        f"baselines only into real folders, never through a link: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise PathError(f"{what}: {shown} is not a folder; move it away and re-run")
    try:
        return os.open(name, _FOLDER, dir_fd=dir_fd)
    except OSError as exc:  # replaced by a link between the check and the open
        raise PathError(f"{what}: {shown} cannot be opened as a real folder ({exc.strerror}); re-run") from None


@contextlib.contextmanager
def writable_folder(root: Path, hardware_id: str) -> Iterator[int]:
    """The open fd of ``<root>/<hardware-id>``, reached without following any link.

    The root itself and the id folder must be real folders: a committed ``baselines -> /elsewhere``
    or an in-root alias ``baselines/cpu-A -> cpu-B`` (two ids sharing one baseline) is refused.
    Everything written then goes through this fd (perfgate.store.atomic.replace_in), so a link
    swapped in while the write runs is not followed either."""
    root = Path(root)
    root_fd = _open_real_folder(str(root), root, dir_fd=None, what="baselines root",
                                fix=f"pass the folder it points to (--baselines / --perf-baselines "
                                    f"{_link_target(str(root), None)}) or replace the link with a folder")
    try:
        id_fd = _open_real_folder(hardware_id, root / hardware_id, dir_fd=root_fd, what="hardware id folder",
                                  fix=f"an alias of another id's folder would make two machines share one "
                                      f"baseline; remove the link (`rm {root / hardware_id}`) or refresh "
                                      f"under the id it points to")
    finally:
        os.close(root_fd)
    try:
        yield id_fd
    finally:
        os.close(id_fd)


def absolute_keeping_last_link(path: Path) -> Path:
    """``path`` made absolute with its folders resolved but its last component kept as named, so a
    baselines root that is itself a symbolic link can still be seen (and refused) when writing."""
    absolute = Path(os.path.abspath(path))
    return absolute.parent.resolve() / absolute.name if absolute.name else absolute
