"""A test's id as perfgate keys it: the test file's path relative to its project's root, then pytest's
``::``-parts (``perf/collectives/test_collectives.py::test_all_reduce[gloo-2-4MiB]``).

pytest's node id is relative to its rootdir, and pytest derives the rootdir from every existing path
on the command line: ``--perf-baselines DIR`` given as a separate word moved it once DIR existed, so
a refresh recorded ``test_pb.py::test_spin`` (area ``misc``), the next run ``proj/test_pb.py::test_spin``
(area ``proj``), and a run 2x slower read ``new`` instead of ``regression`` (issue 49). The project's
root here is found from the test file itself, not from the arguments: the nearest folder above it
that holds a project configuration file (pyproject.toml, pytest.ini, .pytest.ini, tox.ini,
setup.cfg); with none, the folder pytest was started in, where the test lies under it; else pytest's
rootdir. The ids of a project with a configuration file are what they were whenever pytest was
started at its root.
"""
from __future__ import annotations

import functools
from pathlib import Path

import pytest

CONFIG_FILES = ("pyproject.toml", "pytest.ini", ".pytest.ini", "tox.ini", "setup.cfg")
_FALLBACK = pytest.StashKey[Path]()  # the folder pytest was started in (the controller's, under xdist)


def set_fallback(config: pytest.Config, folder: str | Path | None = None) -> None:
    """Where ids of a project with no configuration file start: ``folder`` (what the xdist controller
    hands its workers), else the folder this pytest was started in."""
    config.stash[_FALLBACK] = Path(folder) if folder else Path(config.invocation_params.dir)


def fallback(config: pytest.Config) -> Path:
    return config.stash.get(_FALLBACK, None) or Path(config.invocation_params.dir)


@functools.lru_cache(maxsize=4096)
def _configured_root(folder: Path) -> Path | None:
    for candidate in (folder, *folder.parents):
        if any((candidate / name).is_file() for name in CONFIG_FILES):
            return candidate
    return None


def project_root(path: Path, config: pytest.Config) -> Path:
    """The root a test file's id is relative to (see the module's docstring)."""
    path = Path(path).absolute()
    root = _configured_root(path.parent)
    if root is not None:
        return root
    start = fallback(config).absolute()
    return start if start in path.parents else Path(config.rootpath)


def perf_test_id(item: pytest.Item) -> str:
    """``item``'s id: its file relative to its project's root, then the node id's ``::``-parts."""
    path = getattr(item, "path", None)
    if path is None:
        return item.nodeid
    try:
        relative = Path(path).absolute().relative_to(project_root(path, item.config)).as_posix()
    except ValueError:
        return item.nodeid
    head, sep, rest = item.nodeid.partition("::")
    return f"{relative}{sep}{rest}" if sep else relative
