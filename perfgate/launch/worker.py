"""Entry point of one rank started by :func:`perfgate.launch.jobs.launch` (``python -m``).

Kept separate from launch.py so the parent never imports CUDA-touching code by accident
and so a rank's start-up is exactly: read the job, join the group, run, write the result.
"""
from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time
import traceback
from datetime import timedelta
from pathlib import Path

from perfgate.launch.core import resolve_target, write_pickle_atomic


def finish(jobdir: Path, rank: int, result) -> None:
    """Hand a rank's result to the parent (atomically: it reads whole files only) and leave the group."""
    import torch.distributed as dist

    write_pickle_atomic(jobdir / f"rank{rank}.result.pkl", result)
    dist.destroy_process_group()


def _die_with_parent(parent_pid: int, interval_s: float = 0.5) -> None:
    """Take this rank's whole process group down if the launching process dies.

    The launcher kills its ranks in a ``finally`` clause, which never runs when the
    launcher itself is SIGKILLed (a CI timeout, the OOM killer, a crashed xdist worker).
    The ranks live in their own sessions, so nothing else would stop them: a hung rank
    would wait out its process-group timeout, a healthy one would finish a long sweep
    for nobody. A thread (not PR_SET_PDEATHSIG, which would kill the rank but orphan its
    children) notices the re-parenting and kills the group, children included."""
    def watch() -> None:
        while True:
            _kill_group_if_orphaned(parent_pid)
            time.sleep(interval_s)

    threading.Thread(target=watch, name="perfgate-parent-watch", daemon=True).start()


def _kill_group_if_orphaned(parent_pid: int | None) -> None:
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.stderr.write(f"perfgate: launcher (pid {parent_pid}) is gone; killing this rank's process group\n")
        sys.stderr.flush()
        os.killpg(os.getpgid(0), signal.SIGKILL)


def main(jobdir: Path) -> int:
    rank = int(os.environ["RANK"])
    log_fd = sys.stderr
    faulthandler.enable(file=log_fd)
    faulthandler.register(signal.SIGUSR1, file=log_fd, all_threads=True)
    if os.environ.get("PERFGATE_LAUNCH_PARENT"):
        _die_with_parent(int(os.environ["PERFGATE_LAUNCH_PARENT"]))
    try:
        with open(jobdir / "job.pkl", "rb") as fh:
            job = pickle.load(fh)
        import torch
        import torch.distributed as dist

        from perfgate.launch.faults import fault_from_env
        from perfgate.launch.jobs import WorkerContext
        from perfgate.launch.liveness import start_heartbeat

        phase_path = jobdir / f"rank{rank}.phase"
        init_phase = "init_process_group (rendezvous with the other ranks)"
        phase_path.write_text(init_phase)
        start_heartbeat(phase_path)  # the parent finds a stopped or frozen rank by its silence
        fault = fault_from_env()
        if fault is not None and fault.phase and fault.due(rank, init_phase):
            fault.fire(init_phase)
        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        backend = job["backend"]
        timeout = timedelta(seconds=job["pg_timeout_s"])
        startup = timedelta(seconds=job.get("startup_timeout_s") or job["pg_timeout_s"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=False, timeout=startup)
        # Meet the other ranks first (under the start-up clock), so that a short process-group
        # timeout bounds collectives only, never a slow import on another rank.
        store.set(f"perfgate/arrived/{rank}", "1")
        (jobdir / f"rank{rank}.arrived").touch()
        store.wait([f"perfgate/arrived/{r}" for r in range(world_size)], startup)
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
            dist.init_process_group("nccl", store=store, rank=rank, world_size=world_size,
                                    timeout=timeout, device_id=device)
        else:
            device = torch.device("cpu")
            dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size, timeout=timeout)
        ctx = WorkerContext(rank=rank, world_size=world_size, local_rank=local_rank, backend=backend,
                            device=device, jobdir=str(jobdir), node_rank=int(os.environ.get("GROUP_RANK", 0)),
                            phase_path=str(phase_path), fault=fault)
        (jobdir / f"rank{rank}.ready").touch()  # the parent's work clock starts when all are ready
        ctx.phase("started")
        result = resolve_target(job["target"])(job["spec"], ctx)
        ctx.phase("finished")
        finish(jobdir, rank, result)
        return 0
    except BaseException as exc:  # noqa: BLE001 - every failure must reach the parent as text
        text = traceback.format_exc()
        try:
            (jobdir / f"rank{rank}.err").write_text(text)
        finally:
            sys.stderr.write(text)
            sys.stderr.flush()
        if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code != 0:
            return exc.code  # sys.exit(3) in a worker reports exit code 3
        return 1


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    # A rank that ends after its launcher died (e.g. its peer was killed with it) takes its
    # children along: nobody else will.
    _parent = os.environ.get("PERFGATE_LAUNCH_PARENT")
    _kill_group_if_orphaned(int(_parent) if _parent else None)
    os._exit(code)  # skip interpreter teardown: NCCL/gloo atexit handlers can hang after a failure
