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
:class:`WorkerTimeout` with each rank's in-flight phase and Python stack.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

DEFAULT_TIMEOUT_S = 300.0
_KILL_GRACE_S = 3.0
_FAILURE_GRACE_S = 2.0
_TAIL_LINES = 15

GPU_LOCK_DIR = Path(os.environ.get("PERFGATE_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "perfgate-gpu-locks"))


class LaunchError(RuntimeError):
    """Base class: the distributed job did not produce results."""


class WorkerFailure(LaunchError):
    """A rank raised, exited non-zero or was killed by a signal."""

    def __init__(self, message: str, *, rank: int, returncode: int | None):
        super().__init__(message)
        self.rank = rank
        self.returncode = returncode


class WorkerTimeout(LaunchError):
    """The job outlived its timeout (a hang, usually inside a collective)."""

    def __init__(self, message: str, *, phases: dict[int, str]):
        super().__init__(message)
        self.phases = phases


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
    _phase_path: str = field(default="", repr=False)

    def phase(self, text: str) -> None:
        """Record what is in flight, so that a hang report can name it."""
        if self._phase_path:
            tmp = self._phase_path + ".tmp"
            with open(tmp, "w") as fh:
                fh.write(text)
            os.replace(tmp, self._phase_path)


def _tail(path: Path, lines: int = _TAIL_LINES) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def _signal_name(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal {-returncode}"
    return f"exit code {returncode}"


def _kill_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _kill_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank's process group, then SIGKILL what is left."""
    for p in procs:
        _kill_group(p, signal.SIGTERM)
    deadline = time.monotonic() + _KILL_GRACE_S
    for p in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
    for p in procs:
        # The group may still hold grandchildren even when the leader is gone.
        _kill_group(p, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(timeout=_KILL_GRACE_S)


@contextlib.contextmanager
def gpu_locks(devices: list[int]) -> Iterator[None]:
    """Hold an exclusive file lock per GPU so two xdist workers never measure on one GPU."""
    if not devices:
        yield
        return
    from filelock import FileLock

    GPU_LOCK_DIR.mkdir(parents=True, exist_ok=True)
    locks = [FileLock(str(GPU_LOCK_DIR / f"gpu{d}.lock")) for d in sorted(devices)]
    for lock in locks:  # sorted order: no lock-order deadlock between workers
        lock.acquire()
    try:
        yield
    finally:
        for lock in reversed(locks):
            lock.release()


def _visible_gpu_count() -> int:
    from perfgate.hardware import gpu_count

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
) -> list[Any]:
    """Run ``target(spec, ctx)`` on ``world_size`` fresh ranks and return their results.

    ``target`` is ``"package.module:function"``; ``spec`` must pickle. ``backend`` is
    ``gloo`` (CPU tensors) or ``nccl`` (one GPU per rank). The process group's own
    timeout defaults to just under ``timeout_s`` so that a hang inside a collective is
    reported by the library too, but the parent's kill is what guarantees the bound.
    """
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    devices: list[int] = []
    if backend == "nccl":
        have = _visible_gpu_count()
        if have < world_size:
            raise LaunchError(f"nccl job needs {world_size} GPUs, this machine has {have}")
        visible = (env or {}).get("CUDA_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
        ids = [int(v) for v in visible.split(",") if v.strip()] if visible else list(range(have))
        devices = ids[:world_size]
    with gpu_locks(devices):
        return _launch_locked(target, spec, world_size, backend, timeout_s, env or {}, pg_timeout_s)


def _launch_locked(target, spec, world_size, backend, timeout_s, env, pg_timeout_s) -> list[Any]:
    from torch.distributed import TCPStore  # parent owns the rendezvous: port 0, no clashes
    from datetime import timedelta

    jobdir = Path(tempfile.mkdtemp(prefix="perfgate-job-"))
    procs: list[subprocess.Popen] = []
    store = None
    try:
        store = TCPStore("127.0.0.1", 0, world_size, is_master=True, wait_for_workers=False,
                         timeout=timedelta(seconds=max(timeout_s, 30)))
        pg_timeout = pg_timeout_s if pg_timeout_s is not None else max(10.0, timeout_s - 5.0)
        with open(jobdir / "job.pkl", "wb") as fh:
            pickle.dump({"target": target, "spec": spec, "backend": backend,
                         "pg_timeout_s": pg_timeout}, fh)
        base_env = dict(os.environ)
        base_env.setdefault("OMP_NUM_THREADS", "1")
        base_env.update(env)
        base_env.update({
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(store.port),
            "WORLD_SIZE": str(world_size),
            "LOCAL_WORLD_SIZE": str(world_size),
            "PYTHONUNBUFFERED": "1",
        })
        for rank in range(world_size):
            rank_env = dict(base_env, RANK=str(rank), LOCAL_RANK=str(rank))
            log = open(jobdir / f"rank{rank}.log", "wb")
            try:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", "perfgate.launch_worker", str(jobdir)],
                    env=rank_env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                    start_new_session=True,  # own process group: killpg reaches its children too
                ))
            finally:
                log.close()
        _wait(procs, jobdir, timeout_s)
        results = []
        for rank in range(world_size):
            with open(jobdir / f"rank{rank}.result.pkl", "rb") as fh:
                results.append(pickle.load(fh))
        return results
    finally:
        if procs:
            _kill_all(procs)
        del store
        shutil.rmtree(jobdir, ignore_errors=True)


def _wait(procs: list[subprocess.Popen], jobdir: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            # Give the others a moment: their own errors often explain the first one.
            grace_end = time.monotonic() + _FAILURE_GRACE_S
            while time.monotonic() < grace_end and any(p.poll() is None for p in procs):
                time.sleep(0.05)
            raise _failure(procs, jobdir, failed[0])
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            raise _timeout(procs, jobdir, timeout_s)
        time.sleep(0.05)


def _failure(procs, jobdir: Path, rank: int) -> WorkerFailure:
    code = procs[rank].returncode
    err = jobdir / f"rank{rank}.err"
    detail = err.read_text(errors="replace").rstrip() if err.exists() else _tail(jobdir / f"rank{rank}.log")
    parts = [f"rank {rank} of {len(procs)} failed ({_signal_name(code)}):", detail or "(no output)"]
    for other in range(len(procs)):
        if other != rank:
            parts.append(f"--- rank {other} last lines ---\n{_tail(jobdir / f'rank{other}.log') or '(no output)'}")
    return WorkerFailure("\n".join(parts), rank=rank, returncode=code)


def _phase(jobdir: Path, rank: int) -> str:
    try:
        return (jobdir / f"rank{rank}.phase").read_text()
    except OSError:
        return "unknown (no phase recorded)"


def _timeout(procs, jobdir: Path, timeout_s: float) -> WorkerTimeout:
    # faulthandler in the worker dumps every thread's stack on SIGUSR1: that shows the hang site.
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGUSR1)
    time.sleep(1.0)
    phases = {r: _phase(jobdir, r) for r in range(len(procs))}
    parts = [f"hang: job did not finish within {timeout_s:.0f} s; killed all {len(procs)} ranks."]
    for r, p in enumerate(procs):
        state = "still running" if p.poll() is None else _signal_name(p.returncode)
        parts.append(f"--- rank {r} ({state}); in flight: {phases[r]} ---\n{_tail(jobdir / f'rank{r}.log', 25)}")
    return WorkerTimeout("\n".join(parts), phases=phases)
