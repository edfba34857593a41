"""Run a distributed worker function in fresh subprocesses, one per rank.

Why subprocesses and not the pytest process: a failed gloo/NCCL collective can leave
a process group out of sync, CUDA state cannot be reset in-process, and a hung rank
must be killable. Every launch therefore gets new processes, a rendezvous store owned
by the parent (a TCPStore on port 0, so concurrent launches under xdist never clash),
a hard timeout, and a guaranteed kill of every process it started.

Usage::

    results = launch("perfgate.workloads.collectives:run", spec, world_size=2)

runs ``run(spec, ctx)`` on every rank with the default process group initialised and
returns the per-rank return values. A failing rank raises :class:`WorkerFailure`
carrying its traceback and the other ranks' last lines; a hang raises
:class:`WorkerTimeout` with each rank's in-flight phase and Python stack, found by the
rank's silence (a stopped or frozen rank) or by a work budget proportional to the job's
expected duration (perfgate.launch.liveness), else by ``timeout_s``. A
process-group timeout inside a collective (gloo/NCCL give up before the parent does)
is reported as the hang it is, not as a failure of the rank that noticed it first.

The pieces live beside this module in perfgate/launch/: process plumbing (core), hang
detection (liveness), the collective a rank is blocked in (stacks), the test-only fault knob
(faults). This module is the launch itself: start the ranks, watch them, and turn what
happened into one result or one clear error.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from perfgate.launch.faults import FAULT_ENV, Fault
from perfgate.machine.gpu_locks import gpu_locks
from perfgate.launch.core import ProcessJob, signal_name, start_in_own_session, tail
from perfgate.launch.liveness import (BUDGET_MULTIPLE, MIN_BUDGET_S, SILENT_AFTER_S, HeartbeatWatch, Silence,
                               expected_duration, hang_budget_s)
from perfgate.launch.stacks import stack_collective, traceback_collective

DEFAULT_TIMEOUT_S = 300.0
_FAILURE_GRACE_S = 2.0


class LaunchError(RuntimeError):
    """Base class: the distributed job did not produce results."""


class WorkerFailure(LaunchError):
    """A rank raised, exited non-zero or was killed by a signal.

    ``rank`` is the rank whose failure explains the others (a rank that died or raised,
    not one that merely lost its peer); ``pids`` are the ranks' process ids (each the
    leader of its own process group), all gone by the time this is raised."""

    def __init__(self, message: str, *, rank: int, returncode: int | None,
                 pids: list[int] | None = None, phases: dict[int, str] | None = None):
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode
        self.pids = pids or []
        self.phases = phases or {}


class WorkerTimeout(LaunchError):
    """The job outlived its timeout, or a collective hit the process-group timeout (a hang)."""

    def __init__(self, message: str, *, phases: dict[int, str], pids: list[int] | None = None,
                 collectives: dict[int, str] | None = None):
        super().__init__(message)
        self.phases = phases
        self.pids = pids or []
        self.collectives = collectives or {}  # rank -> torch.distributed call on its stack


@dataclass
class WorkerContext:
    """What a worker function learns about its place in the job."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: Any  # torch.device; typed loosely so this module imports without torch
    jobdir: str
    node_rank: int = 0
    phase_path: str = field(default="", repr=False)
    fault: Fault | None = field(default=None, repr=False)  # test-only (perfgate.launch.faults)

    def phase(self, text: str) -> None:
        """Record what is in flight, so that a hang report can name it."""
        if self.phase_path:
            tmp = self.phase_path + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, self.phase_path)
        if self.fault is not None and self.fault.due(self.rank, text):
            fault, self.fault = self.fault, None  # fire once
            fault.fire(text)


def _visible_gpu_count() -> int:
    from perfgate.machine.hardware import gpu_count

    return gpu_count()


def launch(
    target: str,
    spec: Any,
    *,
    world_size: int,
    backend: str = "gloo",
    timeout_s: float = DEFAULT_TIMEOUT_S,
    env: dict[str, str] | None = None,
    pg_timeout_s: float | None = None,
    startup_timeout_s: float | None = None,
    expected_s: float | None = None,
    silent_after_s: float = SILENT_AFTER_S,
) -> list[Any]:
    """Run ``target(spec, ctx)`` on ``world_size`` fresh ranks and return their results.

    ``target`` is ``"package.module:function"``; ``spec`` must pickle. ``backend`` is
    ``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank).

    Two clocks bound a job: ``startup_timeout_s`` (default ``max(120, timeout_s)``) until
    every rank has imported torch and joined the process group, then ``timeout_s`` for the
    work itself. Split so that a slow start on a loaded machine (importing torch can take
    seconds per rank) is never reported as a hang, and a short ``timeout_s`` can bound the
    work tightly. The process group's own timeout (``pg_timeout_s``) defaults to just under
    ``timeout_s`` so that a hang inside a collective is reported by the library too, but
    the parent's kill is what guarantees the bound.

    Hangs are found sooner than ``timeout_s`` when possible (perfgate.launch.liveness): when the
    work's expected duration is known (``expected_s``, else the spec's ``expected_s()``),
    the work may take ``max(30 s, 3 x expected)`` (never more than ``timeout_s``); and a
    rank that sends no heartbeat for ``silent_after_s`` while using no CPU (stopped,
    frozen) ends the job at once. A slow rank whose heartbeats arrive is never cut short
    by the latter.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    startup_timeout_s = max(120.0, timeout_s) if startup_timeout_s is None else startup_timeout_s
    if not startup_timeout_s > 0:
        raise ValueError(f"startup_timeout_s must be > 0, got {startup_timeout_s}")
    if expected_s is None:
        expected_s = expected_duration(spec)
    if expected_s is not None and not expected_s > 0:
        raise ValueError(f"expected_s must be > 0 seconds, got {expected_s}")
    if not silent_after_s > 0:
        raise ValueError(f"silent_after_s must be > 0, got {silent_after_s}")
    fault = (env or {}).get(FAULT_ENV, os.environ.get(FAULT_ENV))
    if fault:
        Fault.parse(fault)  # a typo in the knob fails here, not as a confusing rank failure
    devices: list[int] = []
    if backend == "nccl":
        have = _visible_gpu_count()
        if have < world_size:
            raise LaunchError(f"nccl job needs {world_size} GPUs, this machine has {have}")
        visible = (env or {}).get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [int(v) for v in visible.split(",") if v.strip()] if visible else list(range(have))
        devices = ids[:world_size]
    with gpu_locks(devices):
        return _launch_locked(target, spec, world_size, backend, WorkLimit.of(timeout_s, expected_s),
                              env or {}, pg_timeout_s, startup_timeout_s, silent_after_s)


@dataclass(frozen=True)
class WorkLimit:
    """How long the work of one job may take, and why (for the hang message)."""

    seconds: float
    why: str = ""  # empty: the caller's timeout_s

    @classmethod
    def of(cls, timeout_s: float, expected_s: float | None) -> "WorkLimit":
        if expected_s is None or hang_budget_s(expected_s) >= timeout_s:
            return cls(timeout_s)
        return cls(hang_budget_s(expected_s),
                   f"max({MIN_BUDGET_S:g} s, {BUDGET_MULTIPLE:g} x the expected {expected_s:.3g} s)")


def _launch_locked(target, spec, world_size, backend, limit: WorkLimit, env, pg_timeout_s,
                   startup_timeout_s, silent_after_s) -> list[Any]:
    from torch.distributed import TCPStore  # parent owns the rendezvous: port 0, no clashes
    from datetime import timedelta

    jobdir = Path(tempfile.mkdtemp(prefix="perfgate-job-"))
    procs: list[subprocess.Popen] = []
    job = ProcessJob(procs)
    store = None
    try:
        store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=max(startup_timeout_s, limit.seconds, 30)))
        pg_timeout = pg_timeout_s if pg_timeout_s is not None else max(10.0, limit.seconds - 5.0)
        with open(jobdir / "job.pkl", "wb") as fh:
            pickle.dump({"target": target, "spec": spec, "backend": backend,
                         "pg_timeout_s": pg_timeout, "startup_timeout_s": startup_timeout_s}, fh)
        base_env = dict(os.environ)
        base_env.setdefault("OMP_NUM_THREADS", "1")
        base_env.update(env)
        base_env.update({
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONUNBUFFERED": "1",
            "PERFGATE_LAUNCH_PARENT": str(os.getpid()),  # ranks die with their launcher (launch_worker)
        })
        for rank in range(world_size):
            rank_env = job.env(dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank)))
            procs.append(start_in_own_session([sys.executable, "-m", "perfgate.launch.worker", str(jobdir)],
                                              rank_env, jobdir / f"rank{rank}.log"))
        watch = HeartbeatWatch([jobdir / f"rank{r}.phase" for r in range(world_size)], job.pids, silent_after_s)
        _wait(job, jobdir, limit, pg_timeout, startup_timeout_s, watch)
        results = []
        for rank in range(world_size):
            with open(jobdir / f"rank{rank}.result.pkl", "rb") as fh:
                results.append(pickle.load(fh))
        return results
    finally:
        interrupted: BaseException | None = None
        while procs:
            try:
                job.kill_all()
                break
            except KeyboardInterrupt as exc:  # a second Ctrl-C must not leave ranks behind
                interrupted = exc
        del store
        shutil.rmtree(jobdir, ignore_errors=True)
        if interrupted is not None:
            raise interrupted


# A rank that only lost its peer (the peer died or raised) is not the cause of a failure.
_PEER_LOST = re.compile(
    r"Connection closed by peer|Connection reset by peer|Broken pipe|ECONNRESET|EPIPE|"
    r"remote process exited|NCCL communicator was aborted|process group .*aborted|"
    r"Connection refused|failed to recv, got 0 bytes|Socket Timeout", re.I)
# A collective that gave up waiting: the job hangs somewhere (often on another rank).
_PG_TIMEOUT = re.compile(
    r"Timed out waiting \d+ ?ms|Watchdog caught collective operation timeout|"
    r"collective operation timeout|wait timeout after \d+", re.I)


def _error_text(jobdir: Path, rank: int) -> str:
    err = jobdir / f"rank{rank}.err"
    if err.exists():
        return err.read_text(errors="replace").rstrip()
    return tail(jobdir / f"rank{rank}.log")


def _classify(code: int | None, text: str) -> str:
    """'signal', 'error', 'timeout' (collective timed out) or 'peer' (lost a peer): cause first."""
    if _PG_TIMEOUT.search(text):  # NCCL's watchdog ends a timed-out rank with SIGABRT: still a hang
        return "timeout"
    if code is not None and code < 0:
        return "signal"
    if _PEER_LOST.search(text):
        return "peer"
    return "error"


_CAUSE_ORDER = {"signal": 0, "error": 0, "timeout": 1, "peer": 2}


def _wait(job: ProcessJob, jobdir: Path, limit: WorkLimit, pg_timeout_s: float | None = None,
          startup_timeout_s: float | None = None, watch: HeartbeatWatch | None = None) -> None:
    procs = job.procs
    timeout_s = limit.seconds
    started = startup_timeout_s is None  # without a startup clock, timeout_s counts from spawn
    deadline = time.monotonic() + (timeout_s if started else startup_timeout_s)
    if started and watch is not None:
        watch.restart()
    failed_at: dict[int, float] = {}
    while True:
        codes = [p.poll() for p in procs]
        now = time.monotonic()
        if not started and all((jobdir / f"rank{r}.ready").exists() or codes[r] is not None
                               for r in range(len(procs))):
            started, deadline = True, now + timeout_s
            if watch is not None:
                watch.restart()  # silence counts from here: importing torch may starve the heartbeat
        for r, c in enumerate(codes):
            if c not in (None, 0):
                failed_at.setdefault(r, now)
        if failed_at:
            # Give the others a moment: their own errors often explain the first one.
            grace_end = time.monotonic() + _FAILURE_GRACE_S
            while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            for r, p in enumerate(procs):
                if p.poll() not in (None, 0):
                    failed_at.setdefault(r, time.monotonic())
            texts = {r: _error_text(jobdir, r) for r in failed_at}
            kinds = {r: _classify(procs[r].returncode, texts[r]) for r in failed_at}
            root = min(failed_at, key=lambda r: (_CAUSE_ORDER[kinds[r]], failed_at[r], r))
            if kinds[root] == "timeout":
                raise _timeout(job, jobdir, limit, pg_timed_out=(root, pg_timeout_s))
            raise _failure(job, jobdir, root, texts[root], kinds)
        if all(c == 0 for c in codes):
            return
        if now > deadline:
            raise _timeout(job, jobdir, limit if started else None, startup_timeout_s=startup_timeout_s)
        if started and watch is not None:
            silence = watch.poll([c is None for c in codes])
            if silence is not None:
                raise _timeout(job, jobdir, limit, silent=silence)
        job.scan()
        time.sleep(0.05)


def _failure(job: ProcessJob, jobdir: Path, rank: int, detail: str, kinds: dict[int, str]) -> WorkerFailure:
    procs = job.procs
    code = procs[rank].returncode
    phases = {r: _phase(jobdir, r) for r in range(len(procs))}
    parts = [f"rank {rank} of {len(procs)} failed ({signal_name(code)}) in phase {phases[rank]!r}:",
             detail or "(no output)"]
    for other in range(len(procs)):
        if other != rank:
            state = signal_name(procs[other].poll())
            if kinds.get(other) == "peer":
                state += ", lost its peer"
            parts.append(f"--- rank {other} ({state}; phase {phases[other]!r}) last lines ---\n"
                         f"{tail(jobdir / f'rank{other}.log') or '(no output)'}")
    return WorkerFailure("\n".join(parts), rank=rank, returncode=code, pids=job.pids, phases=phases)


def _phase(jobdir: Path, rank: int) -> str:
    try:
        return (jobdir / f"rank{rank}.phase").read_text()
    except OSError:
        return "unknown (no phase recorded)"



def _timeout(job: ProcessJob, jobdir: Path, limit: WorkLimit | None,
             pg_timed_out: tuple[int, float | None] | None = None,
             startup_timeout_s: float | None = None, silent: Silence | None = None) -> WorkerTimeout:
    procs = job.procs
    # faulthandler in the worker dumps every thread's stack on SIGUSR1: that shows the hang site.
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1.0)
    phases = {r: _phase(jobdir, r) for r in range(len(procs))}
    collectives = {}
    for r in range(len(procs)):
        try:
            found = stack_collective((jobdir / f"rank{r}.log").read_text(errors="replace"))
        except OSError:
            found = None
        if found is None and (jobdir / f"rank{r}.err").exists():  # it ended with a traceback instead
            found = traceback_collective((jobdir / f"rank{r}.err").read_text(errors="replace"))
        if found:
            collectives[r] = found
    running = [r for r, p in enumerate(procs) if p.poll() is None]
    missing = [r for r in range(len(procs)) if not (jobdir / f"rank{r}.arrived").exists()]
    if limit is None:
        head = (f"hang at start-up: the ranks did not all join the process group within "
                f"{startup_timeout_s:g} s; never reached the rendezvous: rank(s) {missing}; "
                f"killed all {len(procs)} ranks.")
    elif pg_timed_out is not None and phases[pg_timed_out[0]].startswith("init_process_group"):
        head = (f"hang at start-up: rank {pg_timed_out[0]} gave up waiting for the others to join the "
                f"process group; never reached the rendezvous: rank(s) {missing}; killed all {len(procs)} ranks.")
    elif silent is not None:
        head = (f"hang: rank {silent.rank} is frozen (process {silent.state}; no heartbeat for "
                f"{silent.seconds:.0f} s and no CPU used) in phase {phases[silent.rank]!r}; "
                f"killed all {len(procs)} ranks.")
    elif pg_timed_out is None:
        why = f" ({limit.why})" if limit.why else ""
        head = f"hang: job did not finish within {limit.seconds:g} s{why}; killed all {len(procs)} ranks."
    else:
        rank, pg = pg_timed_out
        head = (f"hang: rank {rank}'s collective hit the process-group timeout"
                f"{f' ({pg:g} s)' if pg else ''} in phase {phases[rank]!r}; "
                f"still running (the likely culprits): {running or 'none'}; killed all {len(procs)} ranks.")
    in_flight = "; ".join(f"rank {r}: {phases[r]}" + (f" [{collectives[r]}]" if r in collectives else "")
                          for r in range(len(procs)))
    parts = [head, f"in flight: {in_flight}"]
    for r, p in enumerate(procs):
        state = "still running" if p.poll() is None else signal_name(p.returncode)
        parts.append(f"--- rank {r} ({state}); in flight: {phases[r]} ---\n{tail(jobdir / f'rank{r}.log', 25)}")
    return WorkerTimeout("\n".join(parts), phases=phases, pids=job.pids, collectives=collectives)
