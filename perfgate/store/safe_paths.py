"""Paths under the baselines root: area names that are one safe path component, and the
check that a resolved path still lies inside the root.

An area (``collectives``, ``training``) becomes ``<root>/<hardware-id>/<area>.json``; it
comes from a test's folder or from a results file, so it is checked like a hardware id
(same characters, no separators, no ``..``). Even a checked name can leave the tree
through a symbolic link, so every path the BaselineStore and load_settings touch is
resolved and must lie inside the (resolved) root.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable

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
