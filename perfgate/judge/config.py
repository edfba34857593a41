"""perfgate's settings: tolerances, overrides, record-only patterns, the gate mode, and their checks.

What the judge is configured by, checked table by table (:func:`apply_table`); every bad value fails
with the file and key named, before anything is measured. The files they come from (``[tool.perfgate]``
in pyproject.toml, baselines/tolerances.toml, the machine's own) are read once per session by
perfgate.store.settings.load_settings.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.judge.guard import GuardConfigError, GuardSettings, apply as apply_guard
from perfgate.judge.patterns import PatternTable
from perfgate.judge.policy import GATE_MODES
from perfgate.judge.metrics import MAX_TOLERANCE

DEFAULT_TOLERANCES = {
    "bandwidth": 0.05, "throughput": 0.05, "latency": 0.10, "memory": 0.02,
    "ratio": 0.10, "fraction": 0.03, "count": 0.0,
    "energy": 0.05, "efficiency": 0.05,
}
# The absolute floor of a timing that declares none (perf.record ``floor=``): a change of its median
# smaller than this, in the metric's own unit, never fails, and the verdict says so. 2 us is the
# jitter of one timed event (a CUDA event pair, a scheduler tick): a 15 us NCCL latency moving 1 us
# between runs is 7 % and means nothing. A measurement that knows better declares its own: the
# pytest-benchmark bridge declares the timer's resolution over the iterations of a round (a
# per-iteration mean of a calibrated round resolves nanoseconds), docs/reading-the-report.md.
ABS_FLOORS = {"ns": 500.0, "us": 2.0, "ms": 0.002, "s": 2e-6}


def floor_of(unit: str, declared: float | None) -> tuple[float, str]:
    """(floor, the rule's name for a verdict) of a metric in ``unit`` that declared ``declared``."""
    if declared is not None:
        return declared, f"the {declared:.3g} {unit} floor its test declared (the timer's resolution)"
    floor = ABS_FLOORS.get(unit, 0.0)
    return floor, f"the default {floor:g} {unit} floor of {unit} metrics that declare none (perf.record floor=)"


class ConfigError(ValueError):
    """A perfgate setting is malformed; the message names the file and the key."""


@dataclass
class Settings:
    baselines: Path
    retries: int = 1
    gate: str = "auto"
    tolerances: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_TOLERANCES))
    # ``test_id_glob[@metric_glob]`` -> tolerance; the most specific pattern wins (perfgate.judge.patterns)
    overrides: PatternTable = field(default_factory=PatternTable)
    # ``test_id_glob[@metric_glob]`` -> why it is recorded but never fails on this machine
    record_only: PatternTable = field(default_factory=PatternTable)
    sources: list[str] = field(default_factory=list)
    gross_change: GuardSettings = field(default_factory=GuardSettings)  # perfgate.judge.guard
    tolerances_id: str | None = None  # whose <baselines>/<id>/tolerances.toml was read: this id's or its family's
    repository_url: str | None = None  # where a report links a run's commit (`<url>/commit/<sha>`)

    def __post_init__(self):  # Settings(overrides={...}) in tests and tools: the same table
        self.overrides, self.record_only = PatternTable(self.overrides), PatternTable(self.record_only)

    def override_for(self, test_id: str, metric: str) -> float | None:
        """The tolerance of the most specific ``[overrides]`` pattern that matches, or None."""
        return self.overrides.lookup(test_id, metric)

    def record_only_reason(self, test_id: str, metric: str) -> str | None:
        """Why ``metric`` of ``test_id`` is recorded but not gated here, or None if it is gated as usual."""
        return self.record_only.lookup(test_id, metric)


def _number(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: tolerance must be a number like 0.05, got {value!r}")
    if value < 0 or (isinstance(value, float) and not math.isfinite(value)):  # (an int has no NaN)
        raise ConfigError(f"{where}: tolerance must be a non-negative finite number, got {value!r}")
    if value > MAX_TOLERANCE:  # one that wide lets any change pass: record_only says so honestly
        raise ConfigError(f"{where}: tolerance must be at most {MAX_TOLERANCE:g} ({MAX_TOLERANCE:.0%}), got "
                          f"{value!r}; a metric that noisy belongs under [record_only] with the reason")
    return float(value)


def repository_url(value: object) -> str:
    """The web address of the code's repository, where a report links commits: an http(s) URL with a host
    and nothing a page could not hold as plain text (no spaces, quotes or control characters)."""
    text = value.strip() if isinstance(value, str) else ""
    if not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%!$&'()*+,;=:@/-]*)?", text) or \
            "'" in text or len(text) > 500:
        raise ValueError(f"{str(value)[:100]!r} is not a repository's web address: give it as "
                         f"https://host/owner/name (a commit is linked as <address>/commit/<sha>)")
    return text.rstrip("/")


def table_of(value, where: str) -> dict:
    """A TOML table or nothing; anything else (``tolerances = 5``) is a one-line error."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: must be a table (key = value lines under its own [header]), "
                          f"got {value!r}"[:300])
    return value


def apply_table(settings: Settings, table: dict, where: str) -> None:
    """Set what ``table`` (one file's perfgate table, read from ``where``) says on ``settings``, checked."""
    known = {"baselines", "retries", "gate", "tolerances", "overrides", "record_only", "gross_change",
             "repository_url"}
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; known: {sorted(known)}")
    if "repository_url" in table:
        try:
            settings.repository_url = repository_url(table["repository_url"])
        except ValueError as exc:
            raise ConfigError(f"{where}.repository_url: {exc}") from None
    if "retries" in table:
        r = table["retries"]
        if isinstance(r, bool) or not isinstance(r, int) or r < 0:
            raise ConfigError(f"{where}.retries: must be a non-negative integer, got {r!r}")
        settings.retries = r
    if "gate" in table:
        if not isinstance(table["gate"], str) or table["gate"] not in GATE_MODES:
            raise ConfigError(f"{where}.gate: must be one of {GATE_MODES}, got {table['gate']!r}")
        settings.gate = table["gate"]
    for family, value in table_of(table.get("tolerances"), f"{where}.tolerances").items():
        if family not in DEFAULT_TOLERANCES:
            raise ConfigError(f"{where}.tolerances.{family}: unknown unit family; "
                              f"known: {sorted(DEFAULT_TOLERANCES)}")
        settings.tolerances[family] = _number(value, f"{where}.tolerances.{family}")
        if family == "fraction" and value >= 1:
            raise ConfigError(f"{where}.tolerances.fraction: {value!r} is an absolute change >= 1, wider than any "
                              f"fraction's range [0, 1], so it could never fail; use e.g. 0.03")
    for pattern, value in table_of(table.get("overrides"), f"{where}.overrides").items():
        settings.overrides[pattern] = _number(value, f"{where}.overrides.{pattern!r}")
    for pattern, reason in table_of(table.get("record_only"), f"{where}.record_only").items():
        if not isinstance(reason, str) or not reason.strip():
            raise ConfigError(f"{where}.record_only.{pattern!r}: give the reason as a non-empty string "
                              f"(it is shown in the report), got {reason!r}")
        settings.record_only[pattern] = reason.strip()
    if "gross_change" in table:
        try:
            apply_guard(settings.gross_change, table["gross_change"], f"{where}.gross_change")
        except GuardConfigError as exc:
            raise ConfigError(str(exc)) from None
