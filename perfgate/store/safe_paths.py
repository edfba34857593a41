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


def inside_root(root: Path, path: Path, *, what: str, root_is: str = "the baselines root") -> Path:
    """``path`` resolved, if it lies inside ``root`` (resolved); else PathError naming both (``root_is``: what
    the root is, as the message names it: the results store is not the baselines root)."""
    real_root = Path(root).resolve()
    real = Path(path).resolve()
    if real != real_root and real_root not in real.parents:
        raise PathError(f"{what}: {path} resolves to {real}, outside {root_is} {real_root}; "
                        f"perfgate reads and writes only inside it (remove the link or fix the name)")
    return Path(path)


def outside_root(root: Path, path: Path, *, option: str, example: str) -> Path:
    """``path`` if it lies outside the baselines root ``root`` (both resolved), else PathError naming the option
    and a place to use instead. A results file, a report or its plots in there would be taken for (or
    overwrite) a baseline, and a new folder there reads as a hardware id (`perfgate report --html
    baselines/<id>` wrote index.html and 8 PNGs into a committed id folder)."""
    real_root, real = Path(root).resolve(), Path(path).resolve()
    if real == real_root or real_root in real.parents:
        raise PathError(f"{option} {path}: inside the baselines folder {real_root}, where what perfgate writes would "
                        f"be taken for (or overwrite) a baseline, or a new folder for a hardware id; write it "
                        f"elsewhere (e.g. {option} {example})")
    return Path(path)


_FOLDER = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _link_target(name: str, dir_fd: int | None) -> str:
    try:
        return os.readlink(name, dir_fd=dir_fd)
    except OSError:
        return "?"


def _refuse_unless_real_folder(st: os.stat_result, name: str, shown: Path, *, dir_fd: int | None, what: str,
                               fix: str) -> None:
    if stat.S_ISLNK(st.st_mode):
        raise PathError(f"{what}: {shown} is a symbolic link (to {_link_target(name, dir_fd)}); perfgate writes "
                        f"baselines only into real folders, never through a link: {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise PathError(f"{what}: {shown} is not a folder; move it away and re-run")


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
    _refuse_unless_real_folder(st, name, shown, dir_fd=dir_fd, what=what, fix=fix)
    try:
        return os.open(name, _FOLDER, dir_fd=dir_fd)
    except OSError as exc:  # replaced by a link between the check and the open
        raise PathError(f"{what}: {shown} cannot be opened as a real folder ({exc.strerror}); re-run") from None


def _folders(root: Path, hardware_id: str) -> tuple[tuple[str, Path, str, str], ...]:
    """(name, shown, what, fix) of the root and of the id folder, as writable_folder opens them."""
    return ((str(root), root, "baselines root",
             f"pass the folder it points to (--baselines / --perf-baselines {_link_target(str(root), None)}) or "
             f"replace the link with a folder"),
            (hardware_id, root / hardware_id, "hardware id folder",
             f"an alias of another id's folder would make two machines share one baseline; remove the link "
             f"(`rm {root / hardware_id}`) or refresh under the id it points to"))


def check_writable_folder(root: Path, hardware_id: str) -> None:
    """What :func:`writable_folder` would refuse, said before any work and creating nothing: a session with
    --perf-refresh under an alias id (a link to another id's folder) once ran every test first."""
    root = Path(root)
    (root_name, _, root_what, root_fix), (id_name, id_shown, id_what, id_fix) = _folders(root, hardware_id)
    try:
        _refuse_unless_real_folder(os.stat(root_name, follow_symlinks=False), root_name, root, dir_fd=None,
                                   what=root_what, fix=root_fix)
        _refuse_unless_real_folder(os.stat(root / id_name, follow_symlinks=False), str(root / id_name), id_shown,
                                   dir_fd=None, what=id_what, fix=id_fix)
    except FileNotFoundError:
        return  # created when written


@contextlib.contextmanager
def writable_folder(root: Path, hardware_id: str) -> Iterator[int]:
    """The open fd of ``<root>/<hardware-id>``, reached without following any link.

    The root itself and the id folder must be real folders: a committed ``baselines -> /elsewhere``
    or an in-root alias ``baselines/cpu-A -> cpu-B`` (two ids sharing one baseline) is refused.
    Everything written then goes through this fd (perfgate.store.atomic.replace_in), so a link
    swapped in while the write runs is not followed either."""
    root = Path(root)
    (root_name, _, root_what, root_fix), (id_name, id_shown, id_what, id_fix) = _folders(root, hardware_id)
    root_fd = _open_real_folder(root_name, root, dir_fd=None, what=root_what, fix=root_fix)
    try:
        id_fd = _open_real_folder(id_name, id_shown, dir_fd=root_fd, what=id_what, fix=id_fix)
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
