"""Run perfgate's distributed workers across nodes, under torchrun (c10d rendezvous) or SLURM srun.

On one node :func:`perfgate.launch.jobs.launch` owns everything: it opens the rendezvous
store and spawns every rank. Across nodes only the cluster's launcher can start remote
processes, so the roles split, and the worker contract stays the same:

- every rank runs ``python -m perfgate.launch.multinode worker JOBDIR``, started by a torchrun
  agent on each node (or by ``srun`` directly). It reads the job (``target`` and pickled
  ``spec``) from JOBDIR, which must be on a filesystem every node sees, joins the default
  process group from the launcher's environment (``env://``), runs ``target(spec, ctx)``
  exactly as :func:`perfgate.launch.jobs.launch` would, and writes its result back to JOBDIR.
- :func:`launch_multinode`, called on the head node (from a ``multinode`` test), writes the
  job, starts one torchrun agent per node -- through ``srun`` inside a SLURM allocation, or
  as local processes on loopback to exercise the path on one machine -- waits with a hard
  timeout, and returns the per-rank results or raises ``WorkerFailure``/``WorkerTimeout``.

``python -m perfgate.launch.multinode probe`` under torchrun is a cluster smoke test: an
all_reduce and an all_gather of rank facts, printed by rank 0. See docs/multinode.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from perfgate.launch.jobs import WorkerFailure, WorkerTimeout
from perfgate.launch.core import ProcessJob, resolve_target, start_in_own_session, tail

LAUNCHERS = ("local", "srun")
DEFAULT_TIMEOUT_S = 600.0


@dataclass(frozen=True)
class ProbeSpec:
    """The smoke-test job: all_reduce ``elems`` floats per rank and report who is where."""

    elems: int = 1

    def __post_init__(self):
        if self.elems < 1:
            raise ValueError(f"elems must be >= 1, got {self.elems}")


def probe(spec: ProbeSpec, ctx) -> dict:
    """Worker: every rank contributes rank+1; the sum must be n(n+1)/2 on every rank."""
    import torch
    import torch.distributed as dist

    ctx.phase("probe all_reduce")
    t = torch.full((spec.elems,), float(ctx.rank + 1), device=ctx.device)
    dist.all_reduce(t)
    ctx.phase("probe all_gather")
    facts = torch.tensor([ctx.rank, ctx.local_rank, ctx.node_rank], dtype=torch.int64, device=ctx.device)
    gathered = [torch.zeros_like(facts) for _ in range(ctx.world_size)]
    dist.all_gather(gathered, facts)
    n = ctx.world_size
    return {"rank": ctx.rank, "local_rank": ctx.local_rank, "node_rank": ctx.node_rank, "world_size": n,
            "host": socket.gethostname(), "pid": os.getpid(), "sum": float(t[0].item()),
            "expected_sum": n * (n + 1) / 2, "wrong": int((t != n * (n + 1) / 2).sum().item()),
            "ranks": [g.tolist() for g in gathered]}


# ---------------------------------------------------------------- the rank side


def env_from_slurm(env: dict[str, str]) -> dict[str, str]:
    """srun without torchrun: derive torch's variables from SLURM's (MASTER_ADDR/PORT must be set)."""
    if "RANK" in env or "SLURM_PROCID" not in env:
        return env
    out = dict(env)
    out["RANK"] = env["SLURM_PROCID"]
    out["WORLD_SIZE"] = env.get("SLURM_NTASKS", "1")
    out["LOCAL_RANK"] = env.get("SLURM_LOCALID", "0")
    out["GROUP_RANK"] = env.get("SLURM_NODEID", "0")
    out.setdefault("LOCAL_WORLD_SIZE", env.get("SLURM_NTASKS_PER_NODE", "1").split("(")[0])
    return out


def _context(backend: str, jobdir: str, phase_dir: Path | None):
    import torch

    from perfgate.launch.faults import fault_from_env
    from perfgate.launch.jobs import WorkerContext

    rank, local_rank = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device("cuda", local_rank) if backend == "nccl" else torch.device("cpu")
    return WorkerContext(rank=rank, world_size=int(os.environ["WORLD_SIZE"]), local_rank=local_rank,
                         backend=backend, device=device, jobdir=jobdir,
                         node_rank=int(os.environ.get("GROUP_RANK", 0)),
                         phase_path=str(phase_dir / f"rank{rank}.phase") if phase_dir else "",
                         fault=fault_from_env())  # the same test-only drill knob


def _init(backend: str, timeout_s: float) -> None:
    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=timeout_s)
    if backend == "nccl":
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        torch.cuda.set_device(local_rank)
        dist.init_process_group("nccl", init_method="env://", timeout=timeout,
                                device_id=torch.device("cuda", local_rank))
    else:
        dist.init_process_group("gloo", init_method="env://", timeout=timeout)


def worker_main(jobdir: Path) -> int:
    """One rank: read the job, join the group from the launcher's environment, run, write the result."""
    import faulthandler
    import signal

    from perfgate.launch.worker import finish

    os.environ.update(env_from_slurm(dict(os.environ)))
    rank = int(os.environ.get("RANK", -1))
    faulthandler.enable(file=sys.stderr)
    with contextlib.suppress(ValueError, AttributeError):
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
    try:
        with open(jobdir / "job.pkl", "rb") as fh:
            job = pickle.load(fh)
        target = resolve_target(job["target"])  # a bad target fails here, before the rendezvous waits on it
        _init(job["backend"], job["pg_timeout_s"])
        ctx = _context(job["backend"], str(jobdir), jobdir)
        ctx.phase("started")
        result = target(job["spec"], ctx)
        ctx.phase("finished")
        finish(jobdir, rank, result)
        return 0
    except BaseException:  # noqa: BLE001 - every failure must reach the head node as text
        text = f"host {socket.gethostname()} pid {os.getpid()}\n" + traceback.format_exc()
        with contextlib.suppress(OSError):
            (jobdir / f"rank{rank}.err").write_text(text)
        sys.stderr.write(text)
        sys.stderr.flush()
        return 1


def probe_main(elems: int) -> int:
    """``torchrun ... -m perfgate.launch.multinode probe``: run the probe without a job folder; rank 0 prints."""
    import torch.distributed as dist

    os.environ.update(env_from_slurm(dict(os.environ)))
    backend = "nccl" if _cuda_ok() else "gloo"
    _init(backend, 300)
    result = probe(ProbeSpec(elems=elems), _context(backend, "", None))
    gathered: list[Any] = [None] * result["world_size"]
    dist.all_gather_object(gathered, result)
    if result["rank"] == 0:
        print(json.dumps({"backend": backend, "ranks": gathered}, indent=1))
    dist.destroy_process_group()
    return 0 if result["wrong"] == 0 else 1


def _cuda_ok() -> bool:
    try:
        import torch
        return torch.cuda.is_available() and torch.cuda.device_count() > int(os.environ.get("LOCAL_RANK", 0))
    except Exception:
        return False


# ---------------------------------------------------------------- the head-node side


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def torchrun_argv(*, nnodes: int, nproc_per_node: int, endpoint: str, run_id: str, jobdir: Path,
                  is_host: bool | None = None, local_addr: str | None = None,
                  python: str = sys.executable) -> list[str]:
    """The torchrun command one node runs: c10d rendezvous, no restarts (a failure is a result)."""
    argv = [python, "-m", "torch.distributed.run", f"--nnodes={nnodes}", f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={run_id}", "--max-restarts=0",
            "--monitor-interval=0.5"]
    if is_host is not None:
        argv.append(f"--rdzv-conf=is_host={int(is_host)}")
    if local_addr:
        argv.append(f"--local-addr={local_addr}")
    return argv + ["-m", "perfgate.launch.multinode", "worker", str(jobdir)]


def srun_argv(nnodes: int, inner: list[str]) -> list[str]:
    """One torchrun agent per node of the allocation; a failing node ends the step."""
    return ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
            "--job-name=perfgate-multinode", *inner]


def nodes_from_env() -> tuple[int, int]:
    """(PERFGATE_NNODES, PERFGATE_NPROC_PER_NODE); processes per node default to the visible GPUs, else 1."""
    nnodes = int(os.environ.get("PERFGATE_NNODES", "1"))
    nproc = os.environ.get("PERFGATE_NPROC_PER_NODE")
    if nproc is None:
        from perfgate.machine.hardware import gpu_count
        nproc = str(max(1, gpu_count()))
    return nnodes, int(nproc)


def _default_launcher() -> str:
    chosen = os.environ.get("PERFGATE_MULTINODE_LAUNCHER")
    if chosen:
        return chosen
    if os.environ.get("SLURM_JOB_ID"):
        return "srun"
    raise ValueError("no multi-node launcher: run inside a SLURM allocation (srun) or set "
                     "PERFGATE_MULTINODE_LAUNCHER=local|srun (docs/multinode.md)")


def launch_multinode(target: str, spec: Any, *, nnodes: int, nproc_per_node: int, backend: str = "gloo",
                     launcher: str | None = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                     shared_dir: Path | None = None, env: dict[str, str] | None = None,
                     pg_timeout_s: float | None = None) -> list[Any]:
    """Run ``target(spec, ctx)`` on ``nnodes * nproc_per_node`` ranks; results in global rank order.

    ``launcher``: ``srun`` (inside a SLURM allocation; JOBDIR under ``shared_dir`` or
    $PERFGATE_SHARED_DIR must be visible on every node) or ``local`` (``nnodes`` torchrun
    agents on this machine, rendezvous on 127.0.0.1: the multi-node code path on one box).
    """
    launcher = launcher or _default_launcher()
    if launcher not in LAUNCHERS:
        raise ValueError(f"launcher must be one of {LAUNCHERS}, got {launcher!r}")
    if nnodes < 1 or nproc_per_node < 1:
        raise ValueError(f"nnodes and nproc_per_node must be >= 1, got {nnodes} and {nproc_per_node}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend must be 'gloo' or 'nccl', got {backend!r}")
    if ":" not in target:
        raise ValueError(f"target must look like 'package.module:function', got {target!r}")
    shared = shared_dir or (Path(os.environ["PERFGATE_SHARED_DIR"]) if os.environ.get("PERFGATE_SHARED_DIR") else None)
    if launcher == "srun" and shared is None:
        raise ValueError("srun needs a job folder every node can read: set PERFGATE_SHARED_DIR to a shared "
                         "filesystem path (NFS, Lustre, ...)")
    root = Path(shared) if shared else Path(tempfile.gettempdir())
    root.mkdir(parents=True, exist_ok=True)
    jobdir = Path(tempfile.mkdtemp(prefix="perfgate-mn-", dir=root))
    world = nnodes * nproc_per_node
    pg_timeout = pg_timeout_s if pg_timeout_s is not None else max(10.0, timeout_s - 10.0)
    with open(jobdir / "job.pkl", "wb") as fh:
        pickle.dump({"target": target, "spec": spec, "backend": backend, "pg_timeout_s": pg_timeout}, fh)
    run_id = f"perfgate-{uuid.uuid4().hex[:12]}"
    base_env = dict(os.environ)
    base_env.setdefault("OMP_NUM_THREADS", "1")
    base_env["PYTHONUNBUFFERED"] = "1"
    base_env.update(env or {})
    procs: list[subprocess.Popen] = []
    try:
        if launcher == "local":
            port = free_port()
            base_env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # keep every byte on loopback
            for node in range(nnodes):
                argv = torchrun_argv(nnodes=nnodes, nproc_per_node=nproc_per_node, endpoint=f"127.0.0.1:{port}",
                                     run_id=run_id, jobdir=jobdir, is_host=(node == 0), local_addr="127.0.0.1")
                procs.append(start_in_own_session(argv, base_env, jobdir / f"node{node}.log"))
        else:
            head = socket.gethostname()
            argv = torchrun_argv(nnodes=nnodes, nproc_per_node=nproc_per_node, endpoint=f"{head}:{free_port('')}",
                                 run_id=run_id, jobdir=jobdir)
            procs.append(start_in_own_session(srun_argv(nnodes, argv), base_env, jobdir / "srun.log"))
        _wait(procs, jobdir, world, timeout_s)
        results = []
        for rank in range(world):
            path = jobdir / f"rank{rank}.result.pkl"
            if not path.exists():
                raise WorkerFailure(f"rank {rank} of {world} wrote no result although every node launcher "
                                    f"exited 0:\n{_logs(jobdir)}", rank=rank, returncode=None)
            with open(path, "rb") as fh:
                results.append(pickle.load(fh))
        return results
    finally:
        if procs:
            ProcessJob(procs).kill_all()
        shutil.rmtree(jobdir, ignore_errors=True)


def _logs(jobdir: Path) -> str:
    parts = []
    for log in sorted(jobdir.glob("*.log")):
        parts.append(f"--- {log.stem} last lines ---\n{tail(log, 20) or '(no output)'}")
    return "\n".join(parts)


def _wait(procs: list[subprocess.Popen], jobdir: Path, world: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        errs = list(jobdir.glob("rank*.err"))
        codes = [p.poll() for p in procs]
        if errs or any(c not in (None, 0) for c in codes):
            grace = time.monotonic() + 3.0  # let the other ranks' errors land: they often explain the first
            while time.monotonic() < grace and any(p.poll() is None for p in procs):
                time.sleep(0.1)
            # The first rank to fail is the cause; ranks that failed later mostly lost their peer.
            errs = sorted(jobdir.glob("rank*.err"), key=lambda p: (p.stat().st_mtime_ns, int(p.stem[4:])))
            if errs:
                rank = int(errs[0].stem[4:])
                others = "".join(f"\n--- rank {p.stem[4:]} failed later ---\n{tail(p, 6)}" for p in errs[1:])
                raise WorkerFailure(f"rank {rank} of {world} failed (first of {len(errs)} to fail):\n"
                                    f"{errs[0].read_text(errors='replace').rstrip()}{others}\n{_logs(jobdir)}",
                                    rank=rank, returncode=1)
            bad = next(i for i, p in enumerate(procs) if p.returncode not in (None, 0))
            raise WorkerFailure(f"node launcher {bad} exited {procs[bad].returncode} before its ranks reported:\n"
                                f"{_logs(jobdir)}", rank=-1, returncode=procs[bad].returncode)
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            phases = {}
            for r in range(world):
                try:
                    phases[r] = (jobdir / f"rank{r}.phase").read_text()
                except OSError:
                    phases[r] = "unknown (no phase recorded: not started or never reached the group)"
            shown = "\n".join(f"rank {r}: {ph}" for r, ph in phases.items())
            raise WorkerTimeout(f"hang: multi-node job did not finish within {timeout_s:.0f} s; killed the node "
                                f"launchers.\n{shown}\n{_logs(jobdir)}", phases=phases)
        time.sleep(0.1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perfgate.launch.multinode", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    w = sub.add_parser("worker", help="one rank of a launch_multinode job (started by torchrun/srun)")
    w.add_argument("jobdir", type=Path)
    p = sub.add_parser("probe", help="cluster smoke test; run under torchrun or srun")
    p.add_argument("--elems", type=int, default=1 << 20)
    lp = sub.add_parser("launch", help="run the probe through launch_multinode and print the ranks")
    lp.add_argument("--nnodes", type=int, default=None)
    lp.add_argument("--nproc-per-node", type=int, default=None)
    lp.add_argument("--launcher", choices=LAUNCHERS)
    lp.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    lp.add_argument("--timeout", type=float, default=300.0)
    args = parser.parse_args(argv)
    if args.cmd == "worker":
        code = worker_main(args.jobdir)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)  # skip interpreter teardown: gloo/NCCL atexit handlers can hang after a failure
    if args.cmd == "probe":
        return probe_main(args.elems)
    env_nodes, env_nproc = nodes_from_env()
    res = launch_multinode("perfgate.launch.multinode:probe", ProbeSpec(), nnodes=args.nnodes or env_nodes,
                           nproc_per_node=args.nproc_per_node or env_nproc, backend=args.backend,
                           launcher=args.launcher, timeout_s=args.timeout)
    print(json.dumps(res, indent=1))
    return 0 if all(r["wrong"] == 0 for r in res) else 1


if __name__ == "__main__":
    sys.exit(main())
