"""A warm group of gloo ranks that runs property-test cases one at a time.

Why: hypothesis runs tens of examples per property, and shrinking a failure runs hundreds
more. A fresh :func:`perfgate.launch.jobs.launch` costs seconds on a small machine; a case on a
warm group costs milliseconds. The group stays real: separate processes started by the
launcher, a real gloo process group, cases and results passed as files in a spool folder.

Why a failing case ends the group: after a failed gloo collective the ranks can lose sync,
so a case that raised on any rank never shares a group with the next case. The pool kills
that group (by the pids its ranks wrote, nothing else) and starts a fresh one on demand.

Nothing here imports pytest: the pool is a harness piece; the properties live in tests.
"""
from __future__ import annotations

import contextlib
import os
import pickle
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from perfgate.launch.core import kill_process_groups, resolve_target, write_pickle_atomic

REPO_ROOT = Path(__file__).resolve().parents[1]
_POLL_FAST_S = 0.0005
_POLL_IDLE_S = 0.02


class CaseError(RuntimeError):
    """A case raised on at least one rank, or the group died or hung while running it."""


@dataclass(frozen=True)
class _ServeSpec:
    spool: str
    parent_pid: int


def serve(spec: _ServeSpec, ctx) -> None:
    """Rank side: run case files ``case<n>.pkl`` in order until ``stop`` or a failure."""
    spool = Path(spec.spool)
    (spool / f"pid{ctx.rank}").write_text(str(os.getpid()))
    n, delay = 0, _POLL_FAST_S
    while True:
        case_path = spool / f"case{n}.pkl"
        if not case_path.exists():
            if (spool / "stop").exists() or os.getppid() != spec.parent_pid:
                return  # asked to stop, or the test process is gone: never outlive it
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL_IDLE_S)
            continue
        delay = _POLL_FAST_S
        with open(case_path, "rb") as fh:
            target, case = pickle.load(fh)
        ctx.phase(f"case {n}: {target}")
        try:
            outcome = ("ok", resolve_target(target)(case, ctx))
        except BaseException:  # noqa: BLE001 - the parent reports it; this group is finished
            write_pickle_atomic(spool / f"result{n}.rank{ctx.rank}.pkl", ("error", traceback.format_exc()))
            return
        write_pickle_atomic(spool / f"result{n}.rank{ctx.rank}.pkl", outcome)
        ctx.phase(f"idle after case {n}")
        n += 1


def ping(case: Any, ctx) -> int:
    """Health check: an all_reduce of the ranks' ids (the group is in sync if every rank returns the same)."""
    import torch
    import torch.distributed as dist

    t = torch.tensor([ctx.rank], dtype=torch.int64, device=ctx.device)
    dist.all_reduce(t)
    return int(t)


class RankPool:
    """``world_size`` warm ranks; :meth:`run` sends one case to all of them and returns their results."""

    def __init__(self, world_size: int, *, backend: str = "gloo", case_timeout_s: float = 60.0,
                 pg_timeout_s: float = 30.0):
        self.world_size = world_size
        self.backend = backend
        self.case_timeout_s = case_timeout_s
        self.pg_timeout_s = pg_timeout_s
        self.starts = 0  # how many groups this pool has launched (restarts after failures count)
        self._thread: threading.Thread | None = None
        self._spool: Path | None = None
        self._launch_error: BaseException | None = None
        self._n = 0

    # ------------------------------------------------------------ lifecycle
    def _alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _start(self) -> None:
        import tempfile

        from perfgate.launch.jobs import launch

        self._spool = Path(tempfile.mkdtemp(prefix=f"perfgate-pool{self.world_size}-"))
        self._n = 0
        self._launch_error = None
        spec = _ServeSpec(spool=str(self._spool), parent_pid=os.getpid())
        path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH", "")) if p)

        def body() -> None:
            try:
                launch("correctness.rankpool:serve", spec, world_size=self.world_size, backend=self.backend,
                       timeout_s=3600.0, pg_timeout_s=self.pg_timeout_s, env={"PYTHONPATH": path})
            except BaseException as exc:  # noqa: BLE001 - surfaced by run()
                self._launch_error = exc

        self._thread = threading.Thread(target=body, name=f"rankpool-{self.world_size}", daemon=True)
        self._thread.start()
        self.starts += 1

    def _kill(self) -> None:
        """SIGKILL the ranks of this pool's current group (their own process groups) and reap."""
        if self._spool is not None:
            pids = []
            for rank in range(self.world_size):
                with contextlib.suppress(OSError, ValueError):
                    pids.append(int((self._spool / f"pid{rank}").read_text()))
            kill_process_groups(pids)  # the launcher starts each rank as a session leader
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._cleanup()

    def _cleanup(self) -> None:
        import shutil

        if self._spool is not None:
            shutil.rmtree(self._spool, ignore_errors=True)
        self._spool = None
        self._thread = None

    def close(self) -> None:
        """Ask the ranks to stop; kill them if they do not."""
        if self._spool is None:
            return
        (self._spool / "stop").write_text("")
        if self._thread is not None:
            self._thread.join(timeout=15)
        if self._alive():
            self._kill()
        else:
            self._cleanup()

    # ------------------------------------------------------------ cases
    def run(self, target: str, case: Any) -> list[Any]:
        """Run ``target(case, ctx)`` on every rank; return the per-rank results or raise :class:`CaseError`."""
        if not self._alive():
            self._cleanup()
            self._start()
        assert self._spool is not None
        n = self._n
        self._n += 1
        write_pickle_atomic(self._spool / f"case{n}.pkl", (target, case))
        deadline = time.monotonic() + self.case_timeout_s
        results: dict[int, Any] = {}
        delay = _POLL_FAST_S
        while len(results) < self.world_size:
            for rank in range(self.world_size):
                path = self._spool / f"result{n}.rank{rank}.pkl"
                if rank not in results and path.exists():
                    with open(path, "rb") as fh:
                        results[rank] = pickle.load(fh)
                    path.unlink()
                    delay = _POLL_FAST_S
            errors = {r: text for r, (kind, text) in results.items() if kind == "error"}
            if errors:
                # Others may be stuck in a collective that the failing rank never joined.
                grace = time.monotonic() + 2.0
                while time.monotonic() < grace and len(results) < self.world_size and self._alive():
                    time.sleep(0.01)
                self._kill()
                detail = "\n".join(f"--- rank {r} ---\n{t}" for r, t in sorted(errors.items()))
                raise CaseError(f"{target} raised on rank(s) {sorted(errors)} of {self.world_size} "
                                f"(group discarded):\n{detail}")
            if len(results) == self.world_size:
                break
            if not self._alive():
                err = self._launch_error
                self._cleanup()
                raise CaseError(f"the rank group of {self.world_size} died while running {target}: {err}")
            if time.monotonic() > deadline:
                self._kill()
                raise CaseError(f"{target} did not finish on {self.world_size} ranks within "
                                f"{self.case_timeout_s:.0f} s (hang?); group killed")
            time.sleep(delay)
            delay = min(delay * 1.5, _POLL_IDLE_S)
        if (self._spool / f"case{n}.pkl").exists():
            (self._spool / f"case{n}.pkl").unlink()
        return [value for _, (_, value) in sorted(results.items())]


def backend_for(world_size: int, choice: str | None = None) -> str:
    """``nccl`` when this machine has a GPU per rank (and the choice allows it), else ``gloo``.

    ``choice`` (default: env ``CORRECTNESS_BACKEND``) is ``auto``, ``gloo`` or ``nccl``.
    """
    choice = (choice or os.environ.get("CORRECTNESS_BACKEND", "auto")).lower()
    if choice not in ("auto", "gloo", "nccl"):
        raise ValueError(f"CORRECTNESS_BACKEND must be auto, gloo or nccl, got {choice!r}")
    if choice == "gloo":
        return "gloo"
    from perfgate.machine.hardware import gpu_count

    gpus = gpu_count()
    if gpus >= world_size:
        return "nccl"
    if choice == "nccl":
        raise RuntimeError(f"CORRECTNESS_BACKEND=nccl needs {world_size} GPUs, this machine has {gpus}")
    return "gloo"


class RankPools:
    """One warm :class:`RankPool` per world size, started on first use, on :func:`backend_for` it."""

    def __init__(self, **pool_kwargs: Any):
        self._kwargs = pool_kwargs
        self._pools: dict[int, RankPool] = {}

    def __getitem__(self, world_size: int) -> RankPool:
        if world_size not in self._pools:
            self._pools[world_size] = RankPool(world_size, backend=backend_for(world_size), **self._kwargs)
        return self._pools[world_size]

    def run(self, world_size: int, target: str, case: Any) -> list[Any]:
        return self[world_size].run(target, case)

    def close(self, backend: str | None = None) -> None:
        """Stop every pool (or only those on ``backend``); they restart on next use."""
        for world_size, pool in list(self._pools.items()):
            if backend is None or pool.backend == backend:
                pool.close()
                del self._pools[world_size]


__all__ = ["CaseError", "RankPool", "RankPools", "backend_for", "ping", "serve"]
