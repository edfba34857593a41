"""The versions of the packages a test suite's measured code imports: what its user bisects on.

perfgate's own stack (Python, torch, vLLM, NCCL: perfgate.machine.hardware.software_versions) says
nothing about a third-party suite: a pytest-benchmark suite of ``construct`` gets slower with a new
construct or a new release of one of its dependencies. The suite's test modules say what they
measure: every installed distribution that a name in a test module comes from (``import construct``,
``from fastjsonschema import compile``), and the distributions those require directly (their
Requires-Dist for this interpreter, extras left out). pytest and its plugins are the harness, not
the measured code, and are left out; so is perfgate.

The result goes beside perfgate's stack as ``software["packages"]`` in the results file, hence in each
baseline entry's provenance, and in every regression line.
"""
from __future__ import annotations

import importlib.metadata
import sys
import types
from typing import Iterable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

HARNESS = frozenset({"pytest", "pluggy", "perfgate", "iniconfig", "execnet"})


def _harness(dist: str) -> bool:
    name = canonicalize_name(dist)
    return name in HARNESS or name.startswith("pytest-")


def top_level_names(modules: Iterable[types.ModuleType]) -> set[str]:
    """The top-level module names that the public names of ``modules`` come from (their imports)."""
    out: set[str] = set()
    for module in modules:
        for key, value in list(vars(module).items()):
            if key.startswith("__"):
                continue
            try:
                name = value.__name__ if isinstance(value, types.ModuleType) else getattr(value, "__module__", None)
            except Exception:  # an object whose attribute lookup raises: it names no module
                continue
            if isinstance(name, str) and name:
                out.add(name.split(".", 1)[0])
    return out - set(sys.stdlib_module_names) - {"builtins"}


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def direct_requirements(dist: str) -> list[str]:
    """The distributions ``dist`` requires on this interpreter (no extras)."""
    try:
        lines = importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []
    out = []
    for line in lines:
        try:
            req = Requirement(line)
        except InvalidRequirement:
            continue
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def packages_of(modules: Iterable[types.ModuleType]) -> dict[str, str]:
    """{distribution: version} of what ``modules`` (a suite's test modules) import, and of what those
    require directly; sorted by name, the harness left out."""
    by_top = importlib.metadata.packages_distributions()
    # (pytest's assertion rewriting puts _pytest names in every test module: the harness goes first)
    suite = {dist for top in top_level_names(modules) for dist in by_top.get(top, ()) if not _harness(dist)}
    wanted = set(suite) | {req for dist in suite for req in direct_requirements(dist)}
    versions = {canonicalize_name(d): _version(d) for d in wanted if not _harness(d)}
    return {name: v for name, v in sorted(versions.items()) if v}
