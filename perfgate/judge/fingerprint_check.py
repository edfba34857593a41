"""Compare this machine's fingerprint with the one stored beside a baseline.

The hardware id cannot hold everything that moves a number: a microcode or BIOS update,
another host CPU under the same GPUs, SMT switched off, less memory. So at comparison time
the performance-relevant fields of both fingerprints are compared, as host fields (``cpu.*``)
and device fields (the GPUs, each GPU's settings, the links). Which differences make a metric
*not comparable* (a distinct outcome, never pass or regression, with the fields named) depends
on what it depends on (Metric.dependency): a host-bound figure any, a device figure (GPU
memory, device time) only device fields, in-run ratios and exact counts none.

Fields a fingerprint lacks (one stored before perfgate recorded them) are *unverified*, not
different: old baselines stay usable, and the report can say what it could not check.
Which fields are compared and which are only stored: docs/hardware-ids.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from perfgate.judge.metrics import DEVICE_BOUND
from perfgate.judge.verdict import Outcome, Verdict

# (field, relative tolerance): numbers that wobble a little between boots of one machine.
CPU_FIELDS: dict[str, float] = {
    "vendor": 0, "family": 0, "model_number": 0, "stepping": 0, "model": 0, "arch": 0,
    "isa": 0, "isa_features": 0, "torch_capability": 0,
    "cores": 0, "threads_per_core": 0, "numa_nodes": 0,
    "memory_gib": 0.10, "base_mhz": 0.02, "max_mhz": 0.02,
}
GPU_FIELDS: dict[str, float] = {
    "name": 0, "memory_gib": 0.02, "power_limit_w": 0, "power_default_w": 0,
    "app_clock_sm_mhz": 0, "app_clock_mem_mhz": 0, "max_clock_sm_mhz": 0, "max_clock_mem_mhz": 0,
    "mig": 0, "ecc": 0, "pcie_max_gen": 0, "pcie_max_width": 0,
}
# Stored, shown as context (e.g. by the gross-change guard), never making numbers incomparable:
# they differ between hosts of one fleet without moving performance, or are software.
CONTEXT_CPU_FIELDS = ("microcode", "processors", "sockets")
SOFTWARE_KEYS = ("python", "torch", "vllm", "megatron_core", "nccl", "driver", "cuda_driver", "perfgate")


@dataclass
class FingerprintDiff:
    """What differs between the baseline's fingerprint and this machine's."""

    host: list[str] = field(default_factory=list)        # cpu.*: void host-bound figures
    device: list[str] = field(default_factory=list)      # gpus, gpuN.*, links: void device and host figures
    context: list[str] = field(default_factory=list)     # software and stored-only fields
    unverified: list[str] = field(default_factory=list)  # performance fields the baseline did not record

    @property
    def relevant(self) -> list[str]:
        return self.host + self.device

    @property
    def comparable(self) -> bool:
        return not self.relevant

    def voiding(self, dependency: str) -> list[str]:
        """The differences that make a metric depending on ``dependency`` not comparable."""
        return {"host": self.relevant, "device": self.device}.get(dependency, [])


def _show(value: Any) -> str:
    if isinstance(value, list):
        return "[" + " ".join(map(str, value)) + "]" if value else "[]"
    return str(value)


def _same(a: Any, b: Any, rel: float) -> bool:
    if rel and isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool):
        return abs(a - b) <= rel * max(abs(a), abs(b))
    return a == b


def _compare(name: str, base: Any, here: Any, rel: float, diff: list[str], unverified: list[str]) -> None:
    if base is None or here is None:
        if base is None and here is not None:
            unverified.append(name)
        return
    if not _same(base, here, rel):
        diff.append(f"{name}: {_show(base)} (baseline) -> {_show(here)} (here)")


def compare(baseline_fp: dict | None, current_fp: dict) -> FingerprintDiff:
    """Differences of ``current_fp`` from ``baseline_fp`` (pure; either may be an old fingerprint)."""
    out = FingerprintDiff()
    if not baseline_fp:
        out.unverified.append("fingerprint (the baseline file stores none)")
        return out
    bcpu, ccpu = baseline_fp.get("cpu") or {}, current_fp.get("cpu") or {}
    for name, rel in CPU_FIELDS.items():
        _compare(f"cpu.{name}", bcpu.get(name), ccpu.get(name), rel, out.host, out.unverified)
    for name in CONTEXT_CPU_FIELDS:
        _compare(f"cpu.{name}", bcpu.get(name), ccpu.get(name), 0, out.context, [])
    bgpus, cgpus = baseline_fp.get("gpus") or [], current_fp.get("gpus") or []
    if len(bgpus) != len(cgpus):
        out.device.append(f"gpus: {len(bgpus)} (baseline) -> {len(cgpus)} (here)")
    else:
        for i, (bg, cg) in enumerate(zip(bgpus, cgpus)):
            for name, rel in GPU_FIELDS.items():
                _compare(f"gpu{i}.{name}", bg.get(name), cg.get(name), rel, out.device, out.unverified)
        if baseline_fp.get("links") and current_fp.get("links") and baseline_fp["links"] != current_fp["links"]:
            out.device.append(f"links: {baseline_fp['links']} (baseline) -> {current_fp['links']} (here)")
    bsw, csw = baseline_fp.get("software") or {}, current_fp.get("software") or {}
    for key in SOFTWARE_KEYS:
        if bsw.get(key) != csw.get(key) and (bsw.get(key) or csw.get(key)):
            out.context.append(f"{key}: {bsw.get(key)} (baseline) -> {csw.get(key)} (here)")
    return out


WORKLOAD_NOTE = "not comparable: the baseline measured another workload"


def other_workload(base: dict | None, here: dict | None, tol: float) -> Verdict | None:
    """The verdict of any metric whose baseline identified another workload (PerfRecorder.identify),
    ratios included: a ratio of another model is another number. None when both say the same, or
    either says nothing (a baseline from before identities were recorded is judged as it was)."""
    changed = workload_changes(base, here)
    return Verdict(Outcome.NOT_COMPARABLE, None, tol, None, f"{WORKLOAD_NOTE}: {changed}") if changed else None


def workload_changes(base: dict | None, here: dict | None) -> str:
    """``model: A (baseline) -> B (here); ...``, or '' when both say the same or either says nothing."""
    if not base or not here or base == here:
        return ""
    return "; ".join(f"{k}: {base.get(k, '(none)')} (baseline) -> {here.get(k, '(none)')} (here)"
                     for k in sorted(set(base) | set(here)) if base.get(k) != here.get(k))


MACHINE_NOTE = "not comparable: the baseline's machine differs in"
HOST_BOUND_NOTE = "host-bound"


def judged_dependency(dependency: str, busy_here: float | None, busy_baseline: float | None) -> str:
    """A host timing whose device was busy >= DEVICE_BOUND of it, here and in the baseline, is judged
    as a device figure: the host CPU hardly sets it. Anything else is judged as it depends."""
    if (dependency == "host" and busy_here is not None and busy_baseline is not None
            and min(busy_here, busy_baseline) >= DEVICE_BOUND):
        return "device"
    return dependency


def host_paced_note(busy_here: float | None, busy_baseline: float | None) -> str | None:
    """Beside a timing that got worse: the device was busy >= DEVICE_BOUND of it in the baseline and
    less here, so this run's extra time is time the device waited. That points at the host side (a
    busier or slower host, more work in the serving or training loop) before the kernels; it does
    not clear the run (a software change that adds host work is a real regression)."""
    if busy_here is None or busy_baseline is None or not busy_here < DEVICE_BOUND <= busy_baseline:
        return None
    return (f"device busy {busy_here:.2f} here against {busy_baseline:.2f} in the baseline: the device waited "
            f"more in this run, so look at the host side first (its load, the loop that feeds the device)")


def _busy(value: float | None) -> str:
    return "not recorded" if value is None else f"{value:.2f}"


def not_comparable(diff: FingerprintDiff, dependency: str, tol: float, *, busy_here: float | None = None,
                   busy_baseline: float | None = None) -> Verdict | None:
    """The verdict of a metric whose baseline's machine differs in a field it depends on, or None.

    A host-bound figure says so, with the device busy shares: recorded >= DEVICE_BOUND on both
    sides, a GPU timing would have been judged across hosts."""
    fields = diff.voiding(dependency)
    if not fields:
        return None
    why = f"{MACHINE_NOTE} " + "; ".join(fields)
    if dependency == "host" and diff.host:
        why += (f"; {HOST_BOUND_NOTE}: it depends on the whole machine, host CPU included (device busy "
                f"{_busy(busy_here)} here, {_busy(busy_baseline)} in the baseline; a timing busy >= "
                f"{DEVICE_BOUND:g} on both sides is judged across hosts)")
    return Verdict(Outcome.NOT_COMPARABLE, None, tol, None, why)
