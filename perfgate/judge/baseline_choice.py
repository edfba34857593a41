"""Which baseline a metric is judged against, and how its machine differs from this one.

Absolute figures are judged only against the baseline of this exact hardware id. Ratios
measured inside one run depend far less on the machine, so where this id has none, they are
judged against the nearest id of the same family (same hardware model and size in another
setting: ``cpu-AMD-EPYC-avx512-2c`` falls back to ``cpu-AMD-EPYC-avx2-2c``, then to
``cpu-AMD-EPYC-isaunknown-2c``), and the result says which id was used. That keeps CI gating
ratios on whichever kind of CPU machine it lands on before that kind has baselines of its own.
Exact counts depend on no machine at all: after this id and its family, any id's baseline of
the same test and metric serves (a CI machine of a new kind still catches a DDP change from 7
all-reduces per step to 1). The same family rule picks the per-machine tolerances.toml when
this id has none: noise is a property of the machine size and sharing, which the family shares;
an id with no family file takes one of another model of the same size (as many CPU cores; as many
GPUs on the same interconnect).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from perfgate.machine import cpu_info
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.fingerprint_check import HOST_BOUND_NOTE, WORKLOAD_NOTE, FingerprintDiff, compare
from perfgate.judge.metrics import FALLS_BACK
from perfgate.judge.metric_result import area_of
from perfgate.machine.hardware_id import parse_hardware_id

_ISA_ORDER = {name: i for i, name in enumerate(cpu_info.ISA_LEVELS + cpu_info.ARM_ISA_LEVELS)}


REACH_FAMILY, REACH_ANY = "family", "any id"


@dataclass(frozen=True)
class Choice:
    """The baseline entry a metric is judged against, the id it came from, and how far it reached."""

    entry: BaselineEntry | None
    hardware_id: str | None     # the id whose baseline is used
    fallback: bool              # True: another id (of the family, or any id for exact counts)
    diff: FingerprintDiff | None
    reach: str | None = None    # REACH_FAMILY or REACH_ANY where fallback

    @classmethod
    def none(cls) -> "Choice":
        return cls(None, None, False, None)


def family_candidates(hardware_id: str, available: list[str]) -> list[str]:
    """Other ids of ``hardware_id``'s family among ``available``, nearest first.

    CPU ids: the nearest ISA level first (avx512 -> amx or avx2 before sse4), ids of unknown
    ISA last. GPU ids: the card at its defaults first, then other settings by name."""
    me = parse_hardware_id(hardware_id)
    family, variant = me.family, me.variant
    others = [h for h in available if h != hardware_id and parse_hardware_id(h).family == family]

    def distance(other: str) -> tuple[float, str]:
        v = parse_hardware_id(other).variant
        if variant in _ISA_ORDER and v in _ISA_ORDER:
            return abs(_ISA_ORDER[variant] - _ISA_ORDER[v]), other
        if v is None:
            return 0.5, other
        return 1000.0, other
    return sorted(others, key=distance)


def _size(hardware_id: str) -> tuple | None:
    """How big a machine an id names, by its parts: (cores,) of a CPU, (GPU count, interconnect) of GPUs
    (``2xH200-NV18`` -> (2, "NV18"), ``1xH100-80GB-HBM3`` -> (1, "")); None where the id does not say."""
    p = parse_hardware_id(hardware_id)
    if p.is_cpu:
        return None if p.cpu_cores is None else ("cpu", p.cpu_cores)
    return None if p.gpu_count is None else ("gpu", p.gpu_count, p.interconnect)


def same_size_ids(hardware_id: str, available: list[str]) -> list[str]:
    """Ids of other hardware models of the same machine size: for a CPU id, CPUs of other makes with as
    many cores (a shared N-core VM); for a GPU id, other cards with as many GPUs and the same interconnect
    (a 1-GPU machine's 16 host cores set the host figures, H100 or H200)."""
    family, size = parse_hardware_id(hardware_id).family, _size(hardware_id)
    if size is None:
        return []
    return sorted(h for h in available if h != hardware_id and parse_hardware_id(h).family != family
                  and _size(h) == size)


def tolerances_id(hardware_id: str, with_tolerances: list[str]) -> str:
    """The id whose ``tolerances.toml`` applies, of ``with_tolerances`` (the ids whose folder has one,
    perfgate.store.settings lists them): this id's if it has one, else the nearest of its family,
    else one of another model of the same machine size: a shared 2-core VM is noisy the same way whoever
    made its CPU (an Intel AMX CI machine read the AMD 2-core VMs' spreads, 2026-12-02), and a 1-GPU
    machine's host figures (TTFT, client-paced throughput, launch-bound kernels) are its host's whichever
    card it holds (the first H100 sitting, 2026-12-05, would have gated them at the bare defaults)."""
    if hardware_id in with_tolerances:
        return hardware_id
    ids = sorted(with_tolerances)
    near = family_candidates(hardware_id, ids) or same_size_ids(hardware_id, ids)
    return near[0] if near else hardware_id


class BaselineSource(Protocol):
    """What the chooser reads baselines through (perfgate.store.baselines.BaselineStore is one)."""

    def lookup(self, hardware_id: str, area: str, test_id: str, metric: str) -> BaselineEntry | None: ...

    def document(self, hardware_id: str, area: str) -> dict: ...

    def hardware_ids(self) -> list[str]: ...


class BaselineChooser:
    """Looks up baselines for one session: exact id first, the family for ratios, with the
    fingerprint comparison of each (id, area) baseline file done once."""

    def __init__(self, store: BaselineSource, hardware_id: str, fingerprint: Callable[[], dict]):
        self.store = store
        self.hardware_id = hardware_id
        self._fingerprint = fingerprint  # called only once a baseline is found: it may ask torch
        self._diffs: dict[tuple[str, str, str | None], FingerprintDiff] = {}
        self._family: list[str] | None = None
        self._any: list[str] | None = None

    def diff(self, hardware_id: str, area: str, machine: str | None = None) -> FingerprintDiff:
        """This machine against the one a baseline entry was measured on: the file's ``fingerprint``,
        or ``machine``, the entry's key in the file's ``fingerprints`` table (BaselineStore.write)."""
        key = (hardware_id, area, machine)
        if key not in self._diffs:
            doc = self.store.document(hardware_id, area)
            stored = (doc.get("fingerprints") or {}).get(machine) if machine else doc.get("fingerprint")
            self._diffs[key] = compare(stored, self._fingerprint())
        return self._diffs[key]

    def family(self) -> list[str]:
        if self._family is None:
            self._family = family_candidates(self.hardware_id, self.store.hardware_ids())
        return self._family

    def any_other(self) -> list[str]:
        """Every other id with baselines, outside the family, by name (for exact counts)."""
        if self._any is None:
            tried = {self.hardware_id, *self.family()}
            self._any = [h for h in self.store.hardware_ids() if h not in tried]
        return self._any

    def choose(self, test_id: str, metric: str, *, dependency: str) -> Choice:
        """This id's entry; else, for a metric depending on the family or nothing, the nearest
        family id's; else, for one depending on nothing (an exact count), any id's."""
        area = area_of(test_id)
        entry = self.store.lookup(self.hardware_id, area, test_id, metric)
        if entry is not None:
            return Choice(entry, self.hardware_id, False, self.diff(self.hardware_id, area, entry.fingerprint_key))
        reaches = [(REACH_FAMILY, self.family())] if dependency in FALLS_BACK else []
        if dependency == "nothing":
            reaches.append((REACH_ANY, self.any_other()))
        for reach, ids in reaches:
            for other in ids:
                entry = self.store.lookup(other, area, test_id, metric)
                if entry is not None:
                    return Choice(entry, other, True, self.diff(other, area, entry.fingerprint_key), reach)
        return Choice.none()


def report_notes(results, hardware_id: str) -> list[str]:
    """One line per kind of identity event in a run, for the terminal summary and Markdown:
    which ratios and counts were judged against another id, which absolute metrics were not
    comparable with their baseline's machine, and which metrics with their baseline's workload (and why)."""
    lines = []
    fallbacks: dict[tuple[str, str], int] = {}
    incomparable: dict[str, int] = {}
    for r in results:
        base = r.baseline or {}
        if base.get("fallback"):
            key = (base.get("reach") or REACH_FAMILY, base.get("hardware_id"))
            fallbacks[key] = fallbacks.get(key, 0) + 1
        if r.outcome == "not-comparable":
            why = r.verdict.get("explanation", "").split(f"; {HOST_BOUND_NOTE}:")[0]  # one line per set of fields
            incomparable[why] = incomparable.get(why, 0) + 1
    for (reach, other), n in sorted(fallbacks.items()):
        if reach == REACH_ANY:
            lines.append(f"{n} exact count(s) judged against the baseline of {other}: neither {hardware_id} nor "
                         f"its family has one (a count depends on no machine)")
        else:
            lines.append(f"{n} ratio or count metric(s) judged against the baseline of {other}: {hardware_id} has "
                         f"none of its own (same family; absolute figures never fall back)")
    for why, n in sorted(incomparable.items()):
        if why.startswith(WORKLOAD_NOTE):
            lines.append(f"{n} metric(s) {why}; they are not judged (refresh the baseline with this workload's "
                         f"results, or run the workload the baseline measured)")
        else:
            lines.append(f"{n} absolute metric(s) {why}; they are not judged (refresh the baseline on this "
                         f"machine, or run where the baseline was measured)")
    return lines
