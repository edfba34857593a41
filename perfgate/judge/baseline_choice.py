"""Which baseline a metric is judged against, and how its machine differs from this one.

Absolute figures are judged only against the baseline of this exact hardware id. Ratios
measured inside one run depend far less on the machine, so where this id has none, they are
judged against the nearest id of the same family (same hardware model and size in another
setting: ``cpu-AMD-EPYC-avx512-2c`` falls back to ``cpu-AMD-EPYC-avx2-2c``, then to
``cpu-AMD-EPYC-isaunknown-2c``), and the result says which id was used. That keeps CI gating
ratios on whichever kind of CPU machine it lands on before that kind has baselines of its own.
The same family rule picks the per-machine tolerances.toml when this id has none: noise is a
property of the machine size and sharing, which the family shares.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from perfgate.machine import cpu_info
from perfgate.store.baselines import BaselineEntry, BaselineStore
from perfgate.judge.fingerprint_check import WORKLOAD_NOTE, FingerprintDiff, compare
from perfgate.machine.hardware import id_family
from perfgate.store.results import area_of

_ISA_ORDER = {name: i for i, name in enumerate(cpu_info.ISA_LEVELS + cpu_info.ARM_ISA_LEVELS)}


@dataclass(frozen=True)
class Choice:
    entry: BaselineEntry | None
    hardware_id: str | None     # the id whose baseline is used
    fallback: bool              # True: another id of the same family (ratios only)
    diff: FingerprintDiff | None


def family_candidates(hardware_id: str, available: list[str]) -> list[str]:
    """Other ids of ``hardware_id``'s family among ``available``, nearest first.

    CPU ids: the nearest ISA level first (avx512 -> amx or avx2 before sse4), ids of unknown
    ISA last. GPU ids: the card at its defaults first, then other settings by name."""
    family, variant = id_family(hardware_id)
    others = [h for h in available if h != hardware_id and id_family(h)[0] == family]

    def distance(other: str) -> tuple[float, str]:
        v = id_family(other)[1]
        if variant in _ISA_ORDER and v in _ISA_ORDER:
            return abs(_ISA_ORDER[variant] - _ISA_ORDER[v]), other
        if v is None:
            return 0.5, other
        return 1000.0, other
    return sorted(others, key=distance)


def tolerances_id(baselines_root: Path, hardware_id: str) -> str:
    """The id whose ``tolerances.toml`` applies: this id's if it has one, else the nearest of its family."""
    root = Path(baselines_root)
    if (root / hardware_id / "tolerances.toml").exists() or not root.is_dir():
        return hardware_id
    ids = sorted(p.name for p in root.iterdir() if (p / "tolerances.toml").exists())
    near = family_candidates(hardware_id, ids)
    return near[0] if near else hardware_id


class BaselineChooser:
    """Looks up baselines for one session: exact id first, the family for ratios, with the
    fingerprint comparison of each (id, area) baseline file done once."""

    def __init__(self, store: BaselineStore, hardware_id: str, fingerprint: Callable[[], dict]):
        self.store = store
        self.hardware_id = hardware_id
        self._fingerprint = fingerprint  # called only once a baseline is found: it may ask torch
        self._diffs: dict[tuple[str, str], FingerprintDiff] = {}
        self._family: list[str] | None = None

    def diff(self, hardware_id: str, area: str) -> FingerprintDiff:
        key = (hardware_id, area)
        if key not in self._diffs:
            stored = self.store.document(hardware_id, area).get("fingerprint")
            self._diffs[key] = compare(stored, self._fingerprint())
        return self._diffs[key]

    def family(self) -> list[str]:
        if self._family is None:
            self._family = family_candidates(self.hardware_id, self.store.hardware_ids())
        return self._family

    def choose(self, test_id: str, metric: str, *, ratio: bool) -> Choice:
        area = area_of(test_id)
        entry = self.store.lookup(self.hardware_id, area, test_id, metric)
        if entry is not None:
            return Choice(entry, self.hardware_id, False, self.diff(self.hardware_id, area))
        if ratio:
            for other in self.family():
                entry = self.store.lookup(other, area, test_id, metric)
                if entry is not None:
                    return Choice(entry, other, True, self.diff(other, area))
        return Choice(None, None, False, None)


def report_notes(results, hardware_id: str) -> list[str]:
    """One line per kind of identity event in a run, for the terminal summary and Markdown:
    which ratios were judged against another id, which absolute metrics were not comparable
    with their baseline's machine, and which metrics with their baseline's workload (and why)."""
    lines = []
    fallbacks: dict[str, int] = {}
    incomparable: dict[str, int] = {}
    for r in results:
        base = r.baseline or {}
        if base.get("fallback"):
            fallbacks[base.get("hardware_id")] = fallbacks.get(base.get("hardware_id"), 0) + 1
        if r.outcome == "not-comparable":
            why = r.verdict.get("explanation", "")
            incomparable[why] = incomparable.get(why, 0) + 1
    for other, n in sorted(fallbacks.items()):
        lines.append(f"{n} ratio metric(s) judged against the baseline of {other}: {hardware_id} has none "
                     f"of its own (same family; absolute figures never fall back)")
    for why, n in sorted(incomparable.items()):
        if why.startswith(WORKLOAD_NOTE):
            lines.append(f"{n} metric(s) {why}; they are not judged (refresh the baseline with this workload's "
                         f"results, or run the workload the baseline measured)")
        else:
            lines.append(f"{n} absolute metric(s) {why}; they are not judged (refresh the baseline on this "
                         f"machine, or run where the baseline was measured)")
    return lines
