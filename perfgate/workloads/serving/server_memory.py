"""The memory a vLLM server takes while a test measures: peak RSS of its whole process tree.

Why: memory, not speed, decided the design in 002 §0 (peak RSS 7.4 GB on an 8 GB machine, zero
swap): a change that adds a gigabyte to the server breaks a deployment before it slows a
request. A vLLM server is several processes (API server, engine core, workers), so the figure is
the RSS summed over the server's process and every descendant, sampled by a light thread
(every 0.2 s) while the test's phases run, with the phase of the peak kept for the message.

On a GPU the server's device memory is read too, per process from NVML (nvidia-ml-py), summed
over the same process tree; where NVML is absent or lists none of the tree's processes (another
PID namespace) there is no figure and a reason, never an error.

The phase a sample belongs to is what the load generator is doing (``memory_phase``, set by
``loadgen.run_loads_concurrently`` and by the server pool while a server starts); anything else
is ``between loads``. A budget (``--perf-rss-budget``, or the profile's ``server_rss_budget_mib``)
whose excess fails the test is :func:`check_budget`.
"""
from __future__ import annotations

import contextlib
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from perfgate.judge.metrics import DEPENDS_DEVICE
from perfgate.workloads.area import Attached, Measured, Record, check

SAMPLE_EVERY_S = 0.2
MIB = 1 << 20
IDLE_PHASE = "between loads"

_phase_lock = threading.Lock()
_phase: list[str] = []  # a stack: nested phases name the innermost


@contextlib.contextmanager
def memory_phase(label: str) -> Iterator[None]:
    """Samples taken inside the block belong to phase ``label`` (thread-safe; nests)."""
    with _phase_lock:
        _phase.append(label)
    try:
        yield
    finally:
        with _phase_lock:
            _phase.remove(label)


def current_phase() -> str:
    with _phase_lock:
        return _phase[-1] if _phase else IDLE_PHASE


@dataclass
class Peak:
    """The largest value one server reached, where, and how many processes it was spread over."""

    mib: float = 0.0
    phase: str = ""
    processes: int = 0

    def offer(self, mib: float, phase: str, processes: int) -> None:
        if mib > self.mib:
            self.mib, self.phase, self.processes = mib, phase, processes


@dataclass
class ServerPeaks:
    rss: Peak = field(default_factory=Peak)
    gpu: Peak | None = None          # None: no device figure (gpu_reason says why)
    gpu_reason: str | None = None
    samples: int = 0

    def to_dict(self) -> dict:
        out = {"peak_rss_mib": round(self.rss.mib, 1), "rss_phase": self.rss.phase,
               "processes": self.rss.processes, "samples": self.samples}
        if self.gpu is not None:
            out.update(peak_gpu_mib=round(self.gpu.mib, 1), gpu_phase=self.gpu.phase)
        else:
            out["gpu"] = self.gpu_reason
        return out


def tree_rss_bytes(pid: int) -> tuple[int, set[int]]:
    """RSS summed over ``pid`` and its descendants, and their PIDs (processes that exit while being
    read are left out; a server that is gone reads 0)."""
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return 0, set()
    total, pids = 0, set()
    for p in procs:
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
            pids.add(p.pid)
    return total, pids


class _GpuUsage:
    """Device memory per process from NVML; ``reason`` set (and no figures) where it cannot say."""

    def __init__(self) -> None:
        self.reason: str | None = None
        self._nvml = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self._nvml = pynvml
        except Exception as exc:  # noqa: BLE001 - no NVML, no driver, no GPU: no figure, never an error
            self.reason = f"no NVML here ({type(exc).__name__}: {exc})"[:200]
            return
        if not self._handles:
            self.reason = "NVML sees no GPU"

    def used_bytes(self, pids: set[int]) -> int | None:
        """Device memory NVML lists for ``pids``, on every GPU; None when it lists none of them."""
        if self._nvml is None or not self._handles:
            return None
        total, seen = 0, False
        for h in self._handles:
            try:
                procs = self._nvml.nvmlDeviceGetComputeRunningProcesses(h)
            except Exception as exc:  # noqa: BLE001
                self.reason = f"NVML process list unreadable ({type(exc).__name__}: {exc})"[:200]
                return None
            for p in procs:
                if p.pid in pids and p.usedGpuMemory is not None:
                    total, seen = total + int(p.usedGpuMemory), True
        return total if seen else None

    def close(self) -> None:
        if self._nvml is not None:
            with contextlib.suppress(Exception):
                self._nvml.nvmlShutdown()


class MemoryWatch:
    """A daemon thread sampling every server ``servers()`` names (label -> PID of its leader) until
    :meth:`stop`, which returns each server's peaks. Servers may appear while it runs (a second
    server started by the test) and are picked up at the next sample."""

    def __init__(self, servers: Callable[[], Mapping[str, int]], every_s: float = SAMPLE_EVERY_S,
                 gpu: bool = True):
        self._servers = servers
        self._every_s = every_s
        self._stop = threading.Event()
        self._gpu = _GpuUsage() if gpu else None
        self.peaks: dict[str, ServerPeaks] = {}
        self._thread = threading.Thread(target=self._run, name="perfgate-server-memory", daemon=True)

    def start(self) -> "MemoryWatch":
        self.sample()  # at once: a test shorter than one period still gets a figure
        self._thread.start()
        return self

    def sample(self) -> None:
        phase = current_phase()
        for label, pid in dict(self._servers()).items():
            rss, pids = tree_rss_bytes(pid)
            if not pids:
                continue
            peaks = self.peaks.setdefault(label, ServerPeaks())
            peaks.samples += 1
            peaks.rss.offer(rss / MIB, phase, len(pids))
            if self._gpu is None:
                continue
            used = self._gpu.used_bytes(pids)
            if used is None:
                peaks.gpu_reason = self._gpu.reason or "NVML lists none of the server's processes (another PID namespace?)"
            else:
                peaks.gpu = peaks.gpu or Peak()
                peaks.gpu.offer(used / MIB, phase, len(pids))

    def _run(self) -> None:
        while not self._stop.wait(self._every_s):
            self.sample()

    def stop(self) -> dict[str, ServerPeaks]:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=10.0)
        # last, once more: a server that came up after the previous sample, for a load shorter than one
        # period, still gets a figure (the RSS test's 8 requests on a warm server once left none: KeyError)
        self.sample()
        if self._gpu is not None:
            self._gpu.close()
        return self.peaks


def memory_records(peaks: Mapping[str, ServerPeaks]) -> list[Record]:
    """``server_peak_rss_mib``: the largest server's peak RSS (one sample: the peak of the test);
    on a GPU ``server_peak_gpu_mib`` (device memory, judged across hosts: ``depends="device"``);
    every server's peaks and phases attached."""
    if not peaks:
        return []
    out: list[Record] = [Measured("server_peak_rss_mib", [max(p.rss.mib for p in peaks.values())], "MiB", "lower")]
    gpu = [p.gpu.mib for p in peaks.values() if p.gpu is not None]
    if gpu:
        out.append(Measured("server_peak_gpu_mib", [max(gpu)], "MiB", "lower", depends=DEPENDS_DEVICE))
    return out + [Attached("server_memory", {label: p.to_dict() for label, p in peaks.items()})]


def check_budget(peaks: Mapping[str, ServerPeaks], budget_mib: float | None, source: str) -> None:
    """Fail (CheckFailed) when a server's peak RSS exceeded ``budget_mib``, naming the peak, the
    phase it was reached in and where the budget came from; nothing when there is no budget."""
    if budget_mib is None:
        return
    for label, p in peaks.items():
        check(p.rss.mib <= budget_mib,
              f"vllm server {label!r}: peak RSS {p.rss.mib:.0f} MiB (process tree of {p.rss.processes} "
              f"processes) during {p.rss.phase!r} exceeds the budget of {budget_mib:.0f} MiB ({source}); "
              f"find what grew (engine args, KV cache space, model) or raise the budget")
