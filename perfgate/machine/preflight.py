"""Preflight taint check: is this machine quiet enough for its numbers to be compared?

A measurement taken while another job holds the GPU, while a GPU throttles, or while
the host is swapping or oversubscribed is not a regression signal, it is noise with a
cause. ``taint_reasons()`` names such causes before measuring (an empty list means
clean); the plugin labels the run's results ``tainted`` and does not gate them unless
``--perf-allow-tainted``.

Every threshold is a field of :class:`Limits` and can be passed as a keyword. The
defaults are chosen so that a small, quiet machine is clean: a 2-core CI box is not
tainted for having 2 cores, only for being busy with work that is not ours.

Readings are split from judgements: ``read_*`` functions touch NVML, /proc and /sys;
``*_reasons`` functions are pure and take those readings, so the judgement logic is
tested with exact numbers.

The same CPU readings (``read_cpu_counters``: cumulative counters, subtracted into a
``CpuUse``) also watch the machine *while* tests measure: perfgate.machine.load_watch.
"""
from __future__ import annotations

import contextlib
import glob
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import psutil

from perfgate.machine.cpu_use import CpuSample, own_pids, proc_name, sample_cpu, usable_cores

GiB = 1 << 30

# NVML clock-event ("throttle") reason bits, as in nvml.h. Stable across driver versions.
CLOCK_REASONS = {
    0x1: "GPU idle",
    0x2: "applications clocks setting",
    0x4: "software power cap",
    0x8: "hardware slowdown",
    0x10: "sync boost",
    0x20: "software thermal slowdown",
    0x40: "hardware thermal slowdown",
    0x80: "hardware power brake slowdown",
    0x100: "display clock setting",
}
# Reasons that mean the GPU runs slower than it should *right now*. Idle, app-clock and
# display settings are states, not slowdowns; sync boost is normal on multi-GPU boards.
SLOWDOWN_BITS = 0x4 | 0x8 | 0x20 | 0x40 | 0x80


@dataclass(frozen=True)
class Limits:
    """Thresholds of the taint check. Pass any of them as keywords to ``taint_reasons``."""

    # GPUs
    max_foreign_gpu_processes: int = 0       # processes not ours holding a context on a GPU
    max_gpu_mem_used_gib: float = 2.0        # memory in use on a GPU by others before we start
    slowdown_bits: int = SLOWDOWN_BITS       # NVML clock-event reasons that taint
    max_gpu_temp_c: float = 87.0             # hotter than this before measuring: about to throttle
    min_app_clock_fraction: float = 0.7      # applications SM clock below this share of max: capped
    gpus: tuple[int, ...] | None = None      # NVML indexes to check; None: all
    # CPU and host
    governor_check: str = "gpu"              # "always", "gpu" (only where GPUs are visible), "never"
    ok_governors: tuple[str, ...] = ("performance",)
    min_free_mem_gib: float = 1.0            # MemAvailable below this taints
    min_free_mem_fraction: float = 0.05      # ... or below this share of RAM
    max_load_per_core: float = 3.0           # 1-min load average / cores; counts our own recent work too
    max_foreign_cpu_fraction: float | None = 0.5  # cores busy with processes not ours / cores; None: skip
    # ... while a test measures (perfgate.machine.load_watch). Lower than before the session:
    # then our cores are idle and a foreign job takes a free one; while our ranks fill the
    # cores, the scheduler gives a foreign job only its fair share (one hog beside two busy
    # ranks on 2 cores gets ~0.7 of a core), and every bit of that share was taken from us.
    max_foreign_cpu_fraction_while_measuring: float | None = 0.25
    min_watched_s: float = 0.5               # judge a window that lasted this long, with this much CPU of ours
    max_steal_fraction: float = 0.10         # hypervisor steal / elapsed CPU time (noisy neighbour)
    cpu_sample_s: float = 0.3                # how long the CPU sample watches
    ignore_pids: frozenset[int] = field(default_factory=frozenset)

    def __post_init__(self):
        if self.governor_check not in ("always", "gpu", "never"):
            raise ValueError(f"governor_check must be 'always', 'gpu' or 'never', got {self.governor_check!r}")
        if self.cpu_sample_s <= 0:
            raise ValueError(f"cpu_sample_s must be > 0, got {self.cpu_sample_s}")
        if self.min_watched_s < 0:
            raise ValueError(f"min_watched_s must be >= 0, got {self.min_watched_s}")


# ---------------------------------------------------------------- readings


@dataclass(frozen=True)
class GpuProcess:
    pid: int
    used_mem_bytes: int | None
    name: str = "?"


@dataclass(frozen=True)
class GpuState:
    """What NVML says about one GPU before we measure."""

    index: int
    name: str
    processes: tuple[GpuProcess, ...] = ()
    mem_used_bytes: int = 0
    clock_event_bits: int = 0
    temp_c: float | None = None
    app_sm_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None


def read_gpus() -> list[GpuState]:
    """NVML readings for every GPU; empty on a machine without NVML or GPUs."""
    try:
        import pynvml
        pynvml.nvmlInit()
    except Exception:  # no library, no driver: a CPU machine
        return []
    out = []
    try:
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            procs: dict[int, GpuProcess] = {}
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                with contextlib.suppress(Exception):
                    for p in getattr(pynvml, getter)(h):
                        used = getattr(p, "usedGpuMemory", None)
                        procs[p.pid] = GpuProcess(p.pid, used if isinstance(used, int) else None, proc_name(p.pid))
            bits = 0
            for getter in ("nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons"):
                try:
                    bits = int(getattr(pynvml, getter)(h))
                    break
                except Exception:
                    continue
            temp = app = mx = None
            with contextlib.suppress(Exception):
                temp = float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU))
            with contextlib.suppress(Exception):
                app = int(pynvml.nvmlDeviceGetApplicationsClock(h, pynvml.NVML_CLOCK_SM))
            with contextlib.suppress(Exception):
                mx = int(pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_SM))
            name = pynvml.nvmlDeviceGetName(h)
            out.append(GpuState(index=i, name=name.decode() if isinstance(name, bytes) else str(name),
                                processes=tuple(procs.values()),
                                mem_used_bytes=int(pynvml.nvmlDeviceGetMemoryInfo(h).used),
                                clock_event_bits=bits, temp_c=temp, app_sm_clock_mhz=app, max_sm_clock_mhz=mx))
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return out


def read_governors(sysfs: str | os.PathLike = "/sys") -> dict[int, str]:
    """cpufreq scaling governor per CPU; empty where cpufreq is not exposed (most VMs, containers)."""
    out = {}
    for path in glob.glob(os.path.join(str(sysfs), "devices/system/cpu/cpu[0-9]*/cpufreq/scaling_governor")):
        cpu = int(Path(path).parent.parent.name[3:])
        with contextlib.suppress(OSError):
            out[cpu] = Path(path).read_text().strip()
    return dict(sorted(out.items()))


# ---------------------------------------------------------------- judgements (pure)


def gpu_reasons(gpus: list[GpuState], limits: Limits, mine: set[int]) -> list[str]:
    reasons = []
    for g in gpus:
        if limits.gpus is not None and g.index not in limits.gpus:
            continue
        foreign = [p for p in g.processes if p.pid not in mine and p.pid not in limits.ignore_pids]
        if len(foreign) > limits.max_foreign_gpu_processes:
            shown = ", ".join(f"pid {p.pid} {p.name}" + (f" {p.used_mem_bytes / GiB:.1f} GiB" if p.used_mem_bytes
                                                          else "") for p in foreign[:4])
            reasons.append(f"GPU {g.index}: {len(foreign)} other process(es) running ({shown})")
        own_mem = sum(p.used_mem_bytes or 0 for p in g.processes if p.pid in mine or p.pid in limits.ignore_pids)
        others_mem = max(0, g.mem_used_bytes - own_mem) / GiB
        if others_mem > limits.max_gpu_mem_used_gib:
            reasons.append(f"GPU {g.index}: {others_mem:.1f} GiB of memory already in use by others "
                           f"(limit {limits.max_gpu_mem_used_gib:g} GiB)")
        slow = g.clock_event_bits & limits.slowdown_bits
        if slow:
            names = [text for bit, text in CLOCK_REASONS.items() if slow & bit]
            reasons.append(f"GPU {g.index}: clocks reduced now: {', '.join(names)} (NVML clock event reasons)")
        if g.temp_c is not None and g.temp_c > limits.max_gpu_temp_c:
            reasons.append(f"GPU {g.index}: {g.temp_c:.0f} C before measuring (limit {limits.max_gpu_temp_c:g} C)")
        if g.app_sm_clock_mhz and g.max_sm_clock_mhz and \
                g.app_sm_clock_mhz < limits.min_app_clock_fraction * g.max_sm_clock_mhz:
            reasons.append(f"GPU {g.index}: applications SM clock {g.app_sm_clock_mhz} MHz is below "
                           f"{limits.min_app_clock_fraction:.0%} of max {g.max_sm_clock_mhz} MHz (clocks capped; "
                           f"`nvidia-smi -rac` resets)")
    return reasons


def governor_reasons(governors: dict[int, str], limits: Limits, have_gpus: bool) -> list[str]:
    if limits.governor_check == "never" or (limits.governor_check == "gpu" and not have_gpus):
        return []
    bad = {cpu: g for cpu, g in governors.items() if g not in limits.ok_governors}
    if not bad:
        return []
    kinds = sorted(set(bad.values()))
    return [f"CPU frequency governor is {'/'.join(kinds)} on {len(bad)} of {len(governors)} CPUs "
            f"(want {'/'.join(limits.ok_governors)}: `cpupower frequency-set -g performance`)"]


def memory_reasons(available_bytes: int, total_bytes: int, limits: Limits) -> list[str]:
    avail_gib = available_bytes / GiB
    if avail_gib < limits.min_free_mem_gib or available_bytes < limits.min_free_mem_fraction * total_bytes:
        return [f"only {avail_gib:.1f} GiB of {total_bytes / GiB:.1f} GiB memory available "
                f"(limits: {limits.min_free_mem_gib:g} GiB and {limits.min_free_mem_fraction:.0%})"]
    return []


def load_reasons(load1: float, cores: int, limits: Limits) -> list[str]:
    if load1 > limits.max_load_per_core * cores:
        return [f"1-minute load average {load1:.1f} on {cores} cores exceeds {limits.max_load_per_core:g} per core"]
    return []


def cpu_reasons(sample: CpuSample, limits: Limits, *, during: str = "") -> list[str]:
    """Foreign CPU use and steal. ``during`` (" while this test measured") says it was watched
    while measuring: the tighter foreign limit applies (Limits.max_foreign_cpu_fraction_while_measuring)."""
    reasons = []
    limit = limits.max_foreign_cpu_fraction_while_measuring if during else limits.max_foreign_cpu_fraction
    if limit is not None and sample.foreign_cores > limit * sample.cores:
        named = [f"{name} (pid {pid}) {cores:.1f}" for name, pid, cores in sample.top_foreign]
        gone = sample.foreign_cores - sum(cores for _, _, cores in sample.top_foreign)
        if gone >= 0.1:  # system-wide counters see them; no process is left to name
            named.append(f"{gone:.1f} in short-lived or smaller processes")
        reasons.append(f"foreign processes used {sample.foreign_cores:.1f} of {sample.cores} cores{during} "
                       f"(limit {limit:.0%} of cores): " + ", ".join(named))
    if sample.steal_fraction > limits.max_steal_fraction:
        reasons.append(f"hypervisor steal {sample.steal_fraction:.0%} of CPU time{during} (noisy neighbour; "
                       f"limit {limits.max_steal_fraction:.0%})")
    return reasons


# ---------------------------------------------------------------- the check


def taint_reasons(limits: Limits | None = None, **overrides) -> list[str]:
    """Why this machine is not fit to measure right now; empty when it is clean.

    ``taint_reasons(max_load_per_core=1.0, max_foreign_cpu_fraction=None)`` overrides
    single limits; see :class:`Limits` for all of them. Costs about ``cpu_sample_s``.
    """
    limits = replace(limits or Limits(), **overrides)
    mine = own_pids() | set(limits.ignore_pids)
    gpus = read_gpus()
    reasons = gpu_reasons(gpus, limits, mine)
    reasons += governor_reasons(read_governors(), limits, have_gpus=bool(gpus))
    vm = psutil.virtual_memory()
    reasons += memory_reasons(vm.available, vm.total, limits)
    with contextlib.suppress(OSError, AttributeError):
        reasons += load_reasons(psutil.getloadavg()[0], usable_cores(), limits)
    reasons += cpu_reasons(sample_cpu(limits.cpu_sample_s, limits.ignore_pids), limits)
    return reasons


if __name__ == "__main__":  # `python -m perfgate.machine.preflight`: what would taint a run here now
    found = taint_reasons()
    print("\n".join(found) if found else "clean: nothing would taint a measurement now")
