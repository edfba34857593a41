"""One pytest run of a selection in a child process, its results saved: the step that `perfgate ab`,
`perfgate power` and `perfgate calibrate` repeat, each run a fresh session as a user's would be.

Every such run fingerprints the machine, and the fingerprint asks the run's torch for its CPU
capability in a child of its own (importing torch: 1.8 s on 2 CPU cores, more beside a GPU). The
answer depends only on the interpreter, so it is asked once per interpreter here and handed to each
run (perfgate.machine.cpu_info.TORCH_CACHE_ENV); another interpreter (an A/B side's venv) is asked
itself, never handed this one's.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from perfgate.machine import cpu_info


class PytestRunError(ValueError):
    """A run exited with an error and wrote no results; the message has pytest's last lines."""


def run_saving(pytest_args: list[str], save: Path, *, root: Path, hardware_id: str | None,
               python: str = sys.executable, env_extra: dict[str, str] | None = None, remeasure: bool = False) -> int:
    """``python -m pytest PYTEST_ARGS --perf-save SAVE`` in ``root`` -> pytest's exit status, 0 or 1.

    1 (a test failed, e.g. against a baseline) still counts: its numbers were saved. Re-measurement
    is off (``--perf-retries=0``): the caller repeats runs itself; ``remeasure`` leaves it as configured,
    for a caller that judges the run as CI would (`perfgate power --against-baselines`)."""
    env_extra = env_extra or {}
    cmd = [python, "-m", "pytest", *pytest_args, "-p", "no:cacheprovider",
           *([] if remeasure else ["--perf-retries=0"]), f"--perf-save={save}"]
    if hardware_id:
        cmd += ["--perf-hardware-id", hardware_id]
    env = {**os.environ, cpu_info.TORCH_CACHE_ENV: cpu_info.torch_cpu_capability(python=python) or "", **env_extra}
    proc = subprocess.run(cmd, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode not in (0, 1) or not save.exists():
        tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
        shown = " ".join([*(f"{k}={v}" for k, v in env_extra.items()), *cmd])
        raise PytestRunError(f"pytest exited {proc.returncode} and wrote no results ({shown}):\n{tail}")
    return proc.returncode
