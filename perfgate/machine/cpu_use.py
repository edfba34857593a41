"""CPU time on this machine, split into ours and others': the readings behind the taint checks.

"Ours" is one notion, used everywhere (``own_pids``): this pytest process and all its
descendants (the ranks, servers and commands perfgate starts); under xdist, the
controller's tree, so sibling workers are ours too; and the tree of a server the session
measures without having started it (``PERFGATE_SERVING_URL``: the process listening on that
loopback port, perfgate.workloads.serving.attached), whose CPU and GPU use is the measurement,
not a neighbour's. Everything else on the machine, other users' jobs included, is foreign.

Readings are cumulative counters (``read_cpu_counters``); two of them subtract into a
``CpuUse`` over the window between them, and a ``CpuUse`` becomes a ``CpuSample`` in cores.
The preflight reads two 0.3 s apart (``sample_cpu``); perfgate.machine.load_watch reads one
when a test starts measuring and one when it stops. Start/end counters are exact and cost
one pass over /proc per reading; no thread samples in between.
"""
from __future__ import annotations

import contextlib
import functools
import os
import time
import urllib.parse
from dataclasses import dataclass, field

import psutil

from perfgate.launch.core import tree_pids


@dataclass(frozen=True)
class CpuSample:
    """System-wide and own-process CPU use over a window, in cores."""

    cores: int
    busy_cores: float        # time spent running processes (user, nice, system; no kernel threads), system-wide
    own_cores: float         # this process tree's share of it
    steal_fraction: float    # steal / all CPU time in the window
    top_foreign: tuple[tuple[str, int, float], ...] = ()  # (name, pid, cores) of the busiest others

    @property
    def foreign_cores(self) -> float:
        return max(0.0, self.busy_cores - self.own_cores)


@dataclass(frozen=True)
class CpuUse:
    """CPU time spent in a window (``later - earlier`` of two CpuCounters), in seconds.

    Additive, so a window can subtract the windows nested in it. ``own_s`` counts our tree's
    processes alive at either end *and* those that ended inside the window (their time moves
    into their parent's reaped-children counters), so short-lived ranks are ours too."""

    elapsed_s: float = 0.0
    task_s: float = 0.0      # user + nice + system of the CPUs we may run on, less kernel threads
    steal_s: float = 0.0
    all_s: float = 0.0       # every state, idle included
    own_s: float = 0.0
    foreign_by_pid: dict[int, float] = field(default_factory=dict)  # processes alive at the end

    def _combine(self, other: "CpuUse", sign: int) -> "CpuUse":
        pids = self.foreign_by_pid.keys() | other.foreign_by_pid.keys()
        return CpuUse(*(getattr(self, f) + sign * getattr(other, f)
                        for f in ("elapsed_s", "task_s", "steal_s", "all_s", "own_s")),
                      foreign_by_pid={p: self.foreign_by_pid.get(p, 0.0) + sign * other.foreign_by_pid.get(p, 0.0)
                                      for p in pids})

    def __add__(self, other: "CpuUse") -> "CpuUse":
        return self._combine(other, 1)

    def __sub__(self, other: "CpuUse") -> "CpuUse":
        return self._combine(other, -1)

    def sample(self, cores: int, top: int = 3, min_cores: float = 0.05) -> CpuSample:
        """In cores, with the names of the ``top`` busiest foreign processes (above ``min_cores``)."""
        elapsed = max(self.elapsed_s, 1e-9)
        busiest = sorted(((s / elapsed, pid) for pid, s in self.foreign_by_pid.items() if s / elapsed >= min_cores),
                         reverse=True)[:top]
        return CpuSample(cores=cores, busy_cores=max(0.0, self.task_s) / elapsed,
                         own_cores=max(0.0, self.own_s) / elapsed,
                         steal_fraction=max(0.0, self.steal_s) / max(self.all_s, 1e-9),
                         top_foreign=tuple((proc_name(pid), pid, c) for c, pid in busiest))


@dataclass(frozen=True)
class CpuCounters:
    """Cumulative CPU-time counters at one moment (seconds); subtract two to get a CpuUse."""

    wall_s: float
    task_s: float
    steal_s: float
    all_s: float
    own_s: float
    per_pid_s: dict[int, float]   # user + system of every process not ours

    def __sub__(self, earlier: "CpuCounters") -> CpuUse:
        return CpuUse(elapsed_s=self.wall_s - earlier.wall_s, task_s=self.task_s - earlier.task_s,
                      steal_s=self.steal_s - earlier.steal_s, all_s=self.all_s - earlier.all_s,
                      own_s=self.own_s - earlier.own_s,
                      foreign_by_pid={pid: used for pid, s in self.per_pid_s.items()
                                      if (used := s - earlier.per_pid_s.get(pid, 0.0)) > 0})


KTHREADD = 2  # Linux: the parent of every kernel thread


def usable_cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def read_cpu_counters(ignore: set[int] | frozenset[int] = frozenset()) -> CpuCounters:
    """One reading of the CPU counters: /proc/stat of the CPUs we may run on, and every process.

    Busy time is user + nice + system, less kernel threads': interrupt time and kernel threads
    (writeback, IO completion, network) mostly serve whoever does IO, often our own ranks (their
    loopback traffic, the files a test writes), and belong to no process tree. Our own time is
    our tree's user + system plus its reaped children's (a rank that ended is still ours)."""
    mine = own_pids() | set(ignore)
    per_cpu = psutil.cpu_times(percpu=True)
    allowed = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(range(len(per_cpu)))
    cpus = [t for i, t in enumerate(per_cpu) if i in allowed] or per_cpu
    own = kernel = 0.0
    others: dict[int, float] = {}
    for proc in psutil.process_iter(["cpu_times", "ppid"]):
        t = proc.info["cpu_times"]
        if t is None:
            continue  # not ours to read (another user, a zombie): /proc/stat still counts it
        if proc.pid in mine:
            own += t.user + t.system + t.children_user + t.children_system
        elif proc.pid == KTHREADD or proc.info["ppid"] == KTHREADD:
            kernel += t.user + t.system
        else:
            others[proc.pid] = t.user + t.system
    return CpuCounters(wall_s=time.monotonic(), task_s=sum(t.user + t.nice + t.system for t in cpus) - kernel,
                       steal_s=sum(getattr(t, "steal", 0.0) for t in cpus),
                       all_s=sum(v for t in cpus for k, v in t._asdict().items() if k not in ("guest", "guest_nice")),
                       own_s=own, per_pid_s=others)


ATTACHED_SERVER_ENV = "PERFGATE_SERVING_URL"


def listening_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` of this machine, or None (none, or not ours to see)."""
    try:
        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                return conn.pid
    except (psutil.Error, OSError):
        return None
    return None


@functools.lru_cache(maxsize=8)
def _attached_root(url: str) -> int | None:
    try:
        port = urllib.parse.urlsplit(url.strip()).port
    except ValueError:
        return None  # the serving fixtures refuse it, saying why
    return listening_pid(port) if port else None


def own_pids() -> set[int]:
    """Our process tree: this process and its descendants; under xdist, the controller's tree; and
    an attached server's tree (the module docstring)."""
    mine = {os.getpid()}
    with contextlib.suppress(psutil.Error):
        root = psutil.Process()
        if os.environ.get("PYTEST_XDIST_WORKER") and root.parent() is not None:
            root = root.parent()  # sibling workers are ours too
        mine = tree_pids(root.pid)
    url = os.environ.get(ATTACHED_SERVER_ENV)
    attached = _attached_root(url) if url else None
    if attached is not None:
        with contextlib.suppress(psutil.Error):
            mine |= tree_pids(attached)
    return mine


def proc_name(pid: int) -> str:
    try:
        return psutil.Process(pid).name()
    except psutil.Error:
        return "?"  # another PID namespace (a container) or already gone


def sample_cpu(interval_s: float, ignore: set[int] | frozenset[int] = frozenset()) -> CpuSample:
    """Watch the CPUs for ``interval_s``: system-wide busy time minus what our own tree used.

    System-wide counters also catch short-lived processes that start and end inside the
    window, which sampling each process would miss."""
    before = read_cpu_counters(ignore)
    time.sleep(interval_s)
    return (read_cpu_counters(ignore) - before).sample(usable_cores())


