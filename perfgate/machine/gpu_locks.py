"""One measuring job per GPU: an exclusive file lock per device, held for a whole launch.

Two pytest-xdist workers that each start an NCCL job would otherwise share a GPU and
measure each other. The lock files live in ``$PERFGATE_GPU_LOCK_DIR`` (default: a
``perfgate-gpu-locks`` folder in the temp directory), shared by every process on the machine.
"""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import Iterator

GPU_LOCK_DIR = Path(os.environ.get("PERFGATE_GPU_LOCK_DIR", Path(tempfile.gettempdir()) / "perfgate-gpu-locks"))


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

