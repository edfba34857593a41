"""The one way perfgate reads a file: bytes -> UTF-8 -> JSON or TOML -> checked shapes.

Baselines, results, tolerances.toml, the pyproject ``[tool.perfgate]`` table and history
folders are all hand-editable, copied between machines and sometimes truncated or
corrupted. Whatever is in them, reading them ends in a value of the expected shape or in
one ``ReadError`` line naming the file, the key and the fix: never a UnicodeDecodeError,
a KeyError or an ``'int' object has no attribute 'items'`` from deep inside a command.
The CLI turns these into exit code 2, the pytest plugin into a UsageError.

The shape and number checks of the two JSON formats (a baseline file, a results file) are in
perfgate.store.shapes, on the Checker defined here, so that every consumer downstream can index
them without guarding. Every file is read with a size cap (MAX_FILE_BYTES), only if it is a
regular file (a FIFO would hang the command, /dev/zero fill the memory), and refused when it nests
deeper than any file perfgate writes.
"""
from __future__ import annotations

import gzip
import io
import json
import math
import os
import stat
import tomllib
import zlib
from pathlib import Path
from typing import Any, NoReturn

import numpy as np

from perfgate.judge import signs
from perfgate.judge.metrics import MAX_MAGNITUDE

# The largest real files are ~5 MB (a CPU CI run's results, gunzipped; a GPU serving run's raw
# request records are ~4 MB): 128 MiB is 25x that, and still far from what parsing can hold in
# memory (`perfgate refresh /dev/zero` read until the kernel killed it).
MAX_FILE_BYTES = 128 * 1024 * 1024
# The most numbers one of perfgate's own JSON files may hold: the largest real one (a GPU serving run's
# results with its raw request records) holds 173,028; 2 million is 11x that. Counted while parsing, so a
# crafted results file of 5 million samples stops at the 2 millionth number instead of being parsed,
# walked and checked whole (59 s and 473 MB before). Other tools' files (imports) are not counted.
MAX_NUMBERS = 2_000_000
# Real documents nest 10 levels deep; a nesting bomb within the size cap must not reach the
# recursion limit in whatever later copies or writes the document.
MAX_NESTING = 32


class ReadError(ValueError):
    """A file perfgate reads is unreadable or of the wrong shape; one line: file, key, fix."""


_NOT_REGULAR = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                (stat.S_ISSOCK, "a socket"))


def _too_large(path: Path, what: str, fix: str, error: type[ValueError]) -> NoReturn:
    raise error(f"{path}: {what} larger than {MAX_FILE_BYTES // 2**20} MiB, far beyond any file perfgate "
                f"writes, perhaps not the file meant; {fix}")


def _read_bytes(path: Path, *, fix: str, error: type[ValueError]) -> bytes:
    """At most MAX_FILE_BYTES of a regular file. A FIFO, a device or a directory is refused before
    anything is read (opening without blocking: a FIFO with no writer would hang the command)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read it ({exc.strerror or exc}); {fix}") from None
    mode = os.fstat(fd).st_mode
    kind = next((word for test, word in _NOT_REGULAR if test(mode)), None if stat.S_ISREG(mode) else "not a file")
    if kind is not None:
        os.close(fd)
        raise error(f"{path}: is {kind}, not a regular file; give the path of a file; {fix}")
    with os.fdopen(fd, "rb") as fh:
        try:
            data = fh.read(MAX_FILE_BYTES + 1)
        except OSError as exc:
            raise error(f"{path}: cannot read it ({exc.strerror or exc}); {fix}") from None
    if len(data) > MAX_FILE_BYTES:
        _too_large(path, "is", fix, error)
    return data


def read_text(path: Path, *, fix: str, error: type[ValueError] = ReadError) -> str:
    """The file's text (every file perfgate reads comes through here: regular files only, at most
    MAX_FILE_BYTES); a name ending in .gz is gunzipped first (stored results are large:
    a GPU serving run's raw request records are ~4 MB of JSON, 0.8 MB gzipped)."""
    data = _read_bytes(path, fix=fix, error=error)
    if Path(path).name.endswith(".gz"):
        try:
            with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacked:
                data = unpacked.read(MAX_FILE_BYTES + 1)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise error(f"{path}: not a complete gzip file ({exc}); {fix}") from None
        if len(data) > MAX_FILE_BYTES:
            _too_large(path, "unpacks to", fix, error)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise error(f"{path}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}), "
                    f"perhaps corrupted or binary; {fix}") from None


def nesting(value: Any) -> int:
    """How deep tables and lists nest (iteratively: the point is to refuse what recursion cannot take)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, depth = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, depth)
            stack.extend((x, depth + 1) for x in (v.values() if isinstance(v, dict) else v)
                         if isinstance(x, (dict, list)))
    return deepest


class _TooManyNumbers(Exception):
    pass


def _counting(numbers: int):
    """parse_float / parse_int for json.loads that stop the parse at the ``numbers``+1-th number."""
    count = 0

    def parser(convert):
        def parse(text: str):
            nonlocal count
            count += 1
            if count > numbers:
                raise _TooManyNumbers
            return convert(text)
        return parse
    return {"parse_float": parser(float), "parse_int": parser(int)}


def _parsed(path: Path, text: str, what: str, fix: str, error: type[ValueError], numbers: int | None = None) -> Any:
    try:
        value = (json.loads(text, **(_counting(numbers) if numbers else {})) if what == "JSON"
                 else tomllib.loads(text))
    except _TooManyNumbers:
        raise error(f"{path}: holds more than {numbers:,} numbers, far beyond any file perfgate writes (the largest "
                    f"real one, a GPU serving run's results, holds about 173,000), perhaps not the file meant; "
                    f"{fix}") from None
    except json.JSONDecodeError as exc:
        raise error(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}), perhaps truncated; {fix}") from None
    except tomllib.TOMLDecodeError as exc:
        raise error(f"{path}: not valid TOML ({exc}); {fix}") from None
    except (RecursionError, MemoryError, ValueError) as exc:  # nesting too deep; numbers too long to convert
        raise error(f"{path}: not usable {what} ({type(exc).__name__}: {str(exc)[:80]}); {fix}") from None
    if nesting(value) > MAX_NESTING:
        raise error(f"{path}: {what} nested deeper than {MAX_NESTING} levels (perfgate's files nest about 10), "
                    f"perhaps not the file meant; {fix}")
    return value


def read_json(path: Path, *, fix: str, error: type[ValueError] = ReadError, numbers: int | None = MAX_NUMBERS) -> Any:
    """Parse ``path`` as UTF-8 JSON, stopping at more than ``numbers`` numbers (None: another tool's file,
    with no count). FileNotFoundError passes through (callers say what to do)."""
    return _parsed(path, read_text(path, fix=fix, error=error), "JSON", fix, error, numbers)


def read_toml(path: Path, *, fix: str = "fix the syntax", error: type[ValueError] = ReadError) -> dict:
    """Parse ``path`` as UTF-8 TOML."""
    return _parsed(path, read_text(path, fix=fix, error=error), "TOML", fix, error)


def shown(value: Any) -> str:
    if value is None:
        return "nothing (the key is missing or null)"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_CHECKED_AT_ONCE = 1000


def _plain_and_sound(values: list, unit: Any) -> bool:
    """Whether every value is an int or float (never a boolean) that :meth:`Checker.number` and
    :meth:`Checker.sign` would take: checked at once; False sends the list through them one by one."""
    if not all(type(v) is float or type(v) is int for v in values):
        return False
    try:
        arr = np.asarray(values, dtype=float)
    except OverflowError:  # an int beyond any float
        return False
    return bool(np.isfinite(arr).all() and (np.abs(arr) <= MAX_MAGNITUDE).all()) and not signs.any_problem(unit, arr)


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
            self.fail(key, f"must be a table/object, got {shown(value)}")
        return value

    def list(self, value: Any, key: str, *, optional: bool = False) -> list:
        if value is None and optional:
            return []
        if not isinstance(value, list):
            self.fail(key, f"must be a list, got {shown(value)}")
        return value

    def string(self, value: Any, key: str, *, optional: bool = False) -> str | None:
        if value is None and optional:
            return None
        if not isinstance(value, str):
            self.fail(key, f"must be a string, got {shown(value)}")
        return value

    def number(self, value: Any, key: str, *, optional: bool = False, minimum: float | None = None,
               maximum: float = MAX_MAGNITUDE, infinite: bool = False) -> float | None:
        """A finite int or float (never a boolean) within +-MAX_MAGNITUDE (and ``minimum``/``maximum``);
        with ``infinite``, +-infinity too (never NaN)."""
        if value is None and optional:
            return None
        if infinite and isinstance(value, float) and math.isinf(value):
            return value
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        if ok:
            try:
                ok = math.isfinite(float(value))
            except OverflowError:
                ok = False
        if not ok:
            self.fail(key, f"must be a finite number, got {shown(value)}")
        if abs(value) > MAX_MAGNITUDE:
            self.fail(key, f"must be a number of sane magnitude (|x| <= {MAX_MAGNITUDE:g}), got {shown(value)}")
        if minimum is not None and value < minimum:
            self.fail(key, f"must be >= {minimum:g}, got {shown(value)}")
        if value > maximum:
            self.fail(key, f"must be <= {maximum:g}, got {shown(value)}")
        return float(value)

    def integer(self, value: Any, key: str, *, minimum: int | None = None) -> int:
        if (isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum)
                or abs(value) > MAX_MAGNITUDE):
            self.fail(key, f"must be an integer{'' if minimum is None else f' >= {minimum}'}"
                           f"{'' if minimum is None or minimum < 0 else f' and <= {MAX_MAGNITUDE:g}'}, "
                           f"got {shown(value)}")
        return value

    def boolean(self, value: Any, key: str) -> bool:
        if not isinstance(value, bool):
            self.fail(key, f"must be true or false, got {shown(value)}")
        return value

    def choice(self, value: Any, key: str, choices) -> str:
        if not isinstance(value, str) or value not in choices:
            self.fail(key, f"must be one of {', '.join(map(repr, choices))}, got {shown(value)}")
        return value

    def numbers(self, value: Any, key: str, *, unit: Any = None) -> list[float]:
        """A list of finite numbers; with ``unit``, each a measurement of that unit (:meth:`sign`). A long
        list of plain numbers is checked at once (numpy), and one by one only to name a bad one: 5 million
        samples took a refresh 59 s one by one."""
        values = self.list(value, key)
        if len(values) > _CHECKED_AT_ONCE and _plain_and_sound(values, unit):
            return [float(v) for v in values]
        out = [self.number(v, f"{key}[{i}]") for i, v in enumerate(values)]
        if unit is not None:
            for i, v in enumerate(out):
                self.sign(v, f"{key}[{i}]", unit)
        return out

    def sign(self, value: float | None, key: str, unit: Any) -> float | None:
        """A finite number (checked by :meth:`number`) that can be a measurement in ``unit``: never a negative
        duration, rate, bandwidth, size or count, nor a subnormal anything (perfgate.judge.signs, the rule)."""
        if value is not None:
            problem = signs.problem(unit, (value,))
            if problem:
                self.fail(key, problem)
        return value

    def strings(self, value: Any, key: str, *, optional: bool = False) -> list[str]:
        return [self.string(v, f"{key}[{i}]") for i, v in enumerate(self.list(value, key, optional=optional))]
