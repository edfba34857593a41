"""The one way perfgate reads a file: bytes -> UTF-8 -> JSON or TOML -> checked shapes.

Baselines, results, tolerances.toml, the pyproject ``[tool.perfgate]`` table and history
folders are all hand-editable, copied between machines and sometimes truncated or
corrupted. Whatever is in them, reading them ends in a value of the expected shape or in
one ``ReadError`` line naming the file, the key and the fix: never a UnicodeDecodeError,
a KeyError or an ``'int' object has no attribute 'items'`` from deep inside a command.
The CLI turns these into exit code 2, the pytest plugin into a UsageError.

The shape checks for the two JSON formats (a baseline file, a results file) live here too,
so that every consumer downstream can index them without guarding.
"""
from __future__ import annotations

import gzip
import json
import math
import tomllib
import zlib
from pathlib import Path
from typing import Any, NoReturn

from perfgate.machine.hardware_id import check_hardware_id
from perfgate.judge.metrics import DIRECTIONS, UNIT_FAMILIES
from perfgate.store.safe_paths import check_area


class ReadError(ValueError):
    """A file perfgate reads is unreadable or of the wrong shape; one line: file, key, fix."""


def _read_text(path: Path, *, fix: str, error: type[ValueError]) -> str:
    """The file's text; a name ending in .gz is gunzipped first (stored results are large:
    a GPU serving run's raw request records are ~4 MB of JSON, 0.8 MB gzipped)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc}); {fix}") from None
    if Path(path).name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise error(f"{path}: not a complete gzip file ({exc}); {fix}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}), "
                    f"perhaps corrupted or binary; {fix}") from None


def read_json(path: Path, *, fix: str, error: type[ValueError] = ReadError) -> Any:
    """Parse ``path`` as UTF-8 JSON. FileNotFoundError passes through (callers say what to do)."""
    text = _read_text(path, fix=fix, error=error)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}), perhaps truncated; {fix}") from None
    except (RecursionError, ValueError) as exc:  # nesting too deep; numbers too long to convert
        raise error(f"{path}: not usable JSON ({type(exc).__name__}: {str(exc)[:80]}); {fix}") from None


def read_toml(path: Path, *, fix: str = "fix the syntax", error: type[ValueError] = ReadError) -> dict:
    """Parse ``path`` as UTF-8 TOML."""
    text = _read_text(path, fix=fix, error=error)
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc}); {fix}") from None
    except (RecursionError, ValueError) as exc:
        raise error(f"{path}: not usable TOML ({type(exc).__name__}: {str(exc)[:80]}); {fix}") from None


def _shown(value: Any) -> str:
    if value is None:
        return "nothing (the key is missing or null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


class Checker:
    """Typed access to values of one file: each failure is one line with the file, the key and the fix."""

    def __init__(self, path: Path, *, fix: str, error: type[ValueError] = ReadError):
        self.path, self.fix, self.error = path, fix, error

    def fail(self, key: str, problem: str) -> NoReturn:
        raise self.error(f"{self.path}: {key}: {problem}; {self.fix}")

    def table(self, value: Any, key: str, *, optional: bool = False) -> dict:
        if value is None and optional:
            return {}
        if not isinstance(value, dict):
            self.fail(key, f"must be a table/object, got {_shown(value)}")
        return value

    def list(self, value: Any, key: str, *, optional: bool = False) -> list:
        if value is None and optional:
            return []
        if not isinstance(value, list):
            self.fail(key, f"must be a list, got {_shown(value)}")
        return value

    def string(self, value: Any, key: str, *, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {_shown(value)}")
        return value

    def number(self, value: Any, key: str, *, optional: bool = False, minimum: float | None = None) -> float | None:
        if value is None and optional:
            return None
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                ok = math.isfinite(float(value))
            except OverflowError:
                ok = False
        if not ok:
            self.fail(key, f"must be a finite number, got {_shown(value)}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {_shown(value)}")
        return float(value)

    def integer(self, value: Any, key: str, *, minimum: int | None = None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
            self.fail(key, f"must be an integer{'' if minimum is None else f' >= {minimum}'}, got {_shown(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {_shown(value)}")
        return value

    def choice(self, value: Any, key: str, choices) -> str:
        if not isinstance(value, str) or value not in choices:
            self.fail(key, f"must be one of {', '.join(map(repr, choices))}, got {_shown(value)}")
        return value

    def numbers(self, value: Any, key: str) -> list[float]:
        return [self.number(v, f"{key}[{i}]") for i, v in enumerate(self.list(value, key))]

    def strings(self, value: Any, key: str, *, optional: bool = False) -> list[str]:
        return [self.string(v, f"{key}[{i}]") for i, v in enumerate(self.list(value, key, optional=optional))]


# ---------------------------------------------------------------- the two JSON formats


def check_summary(c: Checker, value: Any, key: str) -> None:
    s = c.table(value, key)
    c.number(s.get("median"), f"{key}.median")
    samples = c.numbers(s.get("samples"), f"{key}.samples")
    if not samples:
        c.fail(f"{key}.samples", "must hold at least one measurement, got []")
    for name in ("mad", "iqr", "min", "max", "mean"):  # optional, but not null: readers default only when absent
        if name in s:
            c.number(s[name], f"{key}.{name}")
    if "n" in s:
        c.integer(s["n"], f"{key}.n", minimum=0)


def check_baseline_entry(c: Checker, value: Any, key: str) -> None:
    e = c.table(value, key)
    c.string(e.get("unit"), f"{key}.unit")
    c.string(e.get("better"), f"{key}.better")
    check_summary(c, e.get("summary"), f"{key}.summary")
    c.number(e.get("tol"), f"{key}.tol", optional=True, minimum=0)
    if "provenance" in e:
        c.string(e["provenance"], f"{key}.provenance")
    for name in ("when", "commit", "source"):
        c.string(e.get(name), f"{key}.{name}", optional=True)
    for name in ("software", "spread"):
        c.table(e.get(name), f"{key}.{name}", optional=True)
    check_workload(c, e.get("workload"), f"{key}.workload")


def check_workload(c: Checker, value: Any, key: str) -> None:
    """PerfRecorder.identify's fields: names to non-empty strings (absent when a test says none)."""
    for name, v in c.table(value, key, optional=True).items():
        c.string(v, f"{key}.{name}")


def check_baseline_document(c: Checker, doc: dict) -> None:
    """``entries`` maps test id -> metric -> entry (``kind``/``schema_version`` are checked by the caller)."""
    c.table(doc.get("fingerprint"), "fingerprint", optional=True)
    c.table((doc.get("fingerprint") or {}).get("software"), "fingerprint.software", optional=True)
    for test, metrics in c.table(doc.get("entries"), "entries").items():
        for metric, entry in c.table(metrics, f"entries[{test!r}]").items():
            check_baseline_entry(c, entry, f"entries[{test!r}][{metric!r}]")


def check_result_entry(c: Checker, value: Any, key: str) -> None:
    from perfgate.judge.verdict import Outcome

    r = c.table(value, key)
    c.string(r.get("test_id"), f"{key}.test_id")
    area = c.string(r.get("area"), f"{key}.area")
    try:  # the area names a baseline file: one safe path component
        check_area(area, source=f"{c.path}: {key}.area")
    except ValueError as exc:
        raise c.error(f"{exc}; {c.fix}") from None
    c.string(r.get("metric"), f"{key}.metric")
    c.choice(r.get("unit"), f"{key}.unit", sorted(UNIT_FAMILIES))
    c.choice(r.get("better"), f"{key}.better", DIRECTIONS)
    c.number(r.get("tol"), f"{key}.tol", minimum=0)
    if "gated" in r:
        c.boolean(r["gated"], f"{key}.gated")
    check_summary(c, r.get("summary"), f"{key}.summary")
    verdict = c.table(r.get("verdict"), f"{key}.verdict", optional=True)
    if verdict.get("outcome") is not None:
        c.choice(verdict["outcome"], f"{key}.verdict.outcome", [o.value for o in Outcome])
    baseline = c.table(r.get("baseline"), f"{key}.baseline", optional=True)
    c.number(baseline.get("median"), f"{key}.baseline.median", optional=True)
    c.string(baseline.get("provenance"), f"{key}.baseline.provenance", optional=True)
    if "attempts" in r:
        c.integer(r["attempts"], f"{key}.attempts", minimum=1)
    if "rerun" in r:
        c.string(r["rerun"], f"{key}.rerun")
    c.strings(r.get("tainted"), f"{key}.tainted", optional=True)
    check_workload(c, r.get("workload"), f"{key}.workload")


def check_results_document(c: Checker, doc: dict) -> None:
    """Everything a command reads from a results file (``kind``/``schema_version`` checked by the caller)."""
    try:
        check_hardware_id(doc.get("hardware_id"), source=f"results file {c.path}: hardware_id")
    except ValueError as exc:
        raise c.error(f"{exc}; {c.fix}") from None
    for name in ("created", "commit"):
        c.string(doc.get(name), name, optional=True)
    fp = c.table(doc.get("fingerprint"), "fingerprint", optional=True)
    c.table(fp.get("software"), "fingerprint.software", optional=True)
    if "interrupted" in doc:
        c.boolean(doc["interrupted"], "interrupted")
    c.strings(doc.get("skipped_by_budget"), "skipped_by_budget", optional=True)
    c.table(doc.get("attachments"), "attachments", optional=True)
    for i, p in enumerate(c.list(doc.get("pooled_from"), "pooled_from", optional=True)):
        p = c.table(p, f"pooled_from[{i}]")
        for name in ("file", "created", "commit"):
            c.string(p.get(name), f"pooled_from[{i}].{name}", optional=True)
    for i, r in enumerate(c.list(doc.get("results"), "results", optional=True)):
        check_result_entry(c, r, f"results[{i}]")
