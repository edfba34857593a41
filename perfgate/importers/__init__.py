"""Other tools' result files as perfgate numbers: one module per format, one shape out.

Each format module has ``TOOL`` (its name in provenance), ``DEFAULT_PATHS`` (files read when
none are given; empty: the user must name them) and ``read(paths, hardware_id) -> Imported``.
``perfgate import FORMAT PATH...`` (perfgate.commands.import_baselines) turns an ``Imported``
into baseline entries with provenance ``imported: <tool> <file>``. A reader checks every
number it takes is finite (and :class:`ImportedNumber` that it is above zero: a tool's failed run
reports 0 or a negative time) and says which rows it left out and why (a size no test has, a
row with wrong elements), so nothing is dropped silently.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfgate.judge import signs
from perfgate.store import readers


class ImportFormatError(ValueError):
    """A file is not what its format says; the message names the file, the place and the fix."""


@dataclass(frozen=True)
class ImportedNumber:
    """One metric of one test, as the other tool measured it."""

    test_id: str
    metric: str
    unit: str
    better: str
    samples: tuple[float, ...]       # the tool's raw values where it keeps them, else its one summary value
    file: str                        # the file's name, for provenance
    n: int | None = None             # what the samples stand for when the tool kept fewer (rounds, runs averaged)
    provenance: str | None = None    # default: "imported: <tool> <file>"
    source: str | None = None        # where in the file (a table row, a JSON key), for a reviewer
    software: dict[str, Any] | None = None

    def __post_init__(self):
        """Every imported value is one the tool reports for a run that worked: never at or below zero, never
        subnormal (perfgate.judge.signs, the rule every reader applies); nothing is written otherwise."""
        problem = signs.problem(self.unit, self.samples, reported=True)
        if problem:
            where = self.source or self.test_id
            where = where if where.startswith(self.file) else f"{self.file}: {where}"
            raise ImportFormatError(f"{where}: {self.metric} {problem}; nothing written")


@dataclass
class Imported:
    """What one ``read`` found: numbers, rows left out (what, why) and what the files say of the machine."""

    tool: str
    numbers: list[ImportedNumber] = field(default_factory=list)
    left_out: list[tuple[str, str]] = field(default_factory=list)
    hardware_id: str | None = None   # where the files name it (the seed report does)
    fingerprint: dict[str, Any] | None = None
    when: str | None = None
    commit: str | None = None


def finite(value: Any, where: str) -> float:
    """``value`` as a float, or an error naming where it was read: a NaN must never become a baseline."""
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise ImportFormatError(f"{where}: {value!r} is not a number") from None
    if not math.isfinite(x):
        raise ImportFormatError(f"{where}: {value!r} is not a finite number; the tool's run failed there, "
                                f"re-run it or leave that file out")
    return x


def read_text(path: Path, tool: str) -> str:
    """The file's text through perfgate's one reader (a size cap, regular files only)."""
    try:
        return readers.read_text(Path(path), fix=f"give a {tool} file", error=ImportFormatError)
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None


def read_json(path: Path, tool: str) -> Any:
    """A JSON file through perfgate's one reader (size cap, regular files, no nesting bomb)."""
    try:
        return readers.read_json(Path(path), fix=f"give a {tool} file", error=ImportFormatError, numbers=None)
    except FileNotFoundError:
        raise ImportFormatError(f"{path}: no such file") from None


FORMATS = {"pytest-benchmark": "pytest_benchmark", "nccl-tests": "nccl_tests", "vllm-bench": "vllm_bench",
           "seed": "seed"}
