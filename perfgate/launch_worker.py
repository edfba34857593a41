"""Entry point of one rank started by :func:`perfgate.launch.launch` (``python -m``).

Kept separate from launch.py so the parent never imports CUDA-touching code by accident
and so a rank's start-up is exactly: read the job, join the group, run, write the result.
"""
from __future__ import annotations

import faulthandler
import importlib
import os
import pickle
import signal
import sys
import traceback
from datetime import timedelta
from pathlib import Path


def _resolve(target: str):
    module_name, _, attr = target.partition(":")
    obj = importlib.import_module(module_name)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def main(jobdir: Path) -> int:
    rank = int(os.environ["RANK"])
    log_fd = sys.stderr
    faulthandler.enable(file=log_fd)
    faulthandler.register(signal.SIGUSR1, file=log_fd, all_threads=True)
    try:
        with open(jobdir / "job.pkl", "rb") as fh:
            job = pickle.load(fh)
        import torch
        import torch.distributed as dist

        from perfgate.launch import WorkerContext

        world_size = int(os.environ["WORLD_SIZE"])
        local_rank = int(os.environ.get("LOCAL_RANK", rank))
        backend = job["backend"]
        timeout = timedelta(seconds=job["pg_timeout_s"])
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size,
                              is_master=False, timeout=timeout)
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
                            _phase_path=str(jobdir / f"rank{rank}.phase"))
        ctx.phase("started")
        result = _resolve(job["target"])(job["spec"], ctx)
        ctx.phase("finished")
        tmp = jobdir / f"rank{rank}.result.pkl.tmp"
        with open(tmp, "wb") as fh:
            pickle.dump(result, fh)
        os.replace(tmp, jobdir / f"rank{rank}.result.pkl")
        dist.destroy_process_group()
        return 0
    except BaseException:  # noqa: BLE001 - every failure must reach the parent as text
        text = traceback.format_exc()
        try:
            (jobdir / f"rank{rank}.err").write_text(text)
        finally:
            sys.stderr.write(text)
            sys.stderr.flush()
        return 1


if __name__ == "__main__":
    code = main(Path(sys.argv[1]))
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: NCCL/gloo atexit handlers can hang after a failure
