"""Each sequentially run training case says where its wall time went (info.phase_s).

A one-case GPU session took 32 s for ~2 s of timed steps (docs/training.md); the phases are
attached with the case so a results file shows where the rest goes. The engine's own loop on a
one-rank gloo group with a stand-in step (the harness's logic, not a workload's numbers).
"""
from __future__ import annotations

import time
from datetime import timedelta

import torch

from perfgate.workloads.training.engine import BuiltCase, CaseResult, run_cases
from perfgate.workloads.training.specs import MIN_MEASURED_STEPS, Schedule


def test_a_sequential_case_attaches_the_seconds_of_each_phase(tmp_path):
    import torch.distributed as dist

    def build():
        def step(i):
            time.sleep(0.01)
            return float(i)
        return BuiltCase(result=CaseResult(label="mb1", rank=0, world_size=1), step=step)

    schedule = Schedule(warmup_steps=2, measured_steps=MIN_MEASURED_STEPS)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        [res] = run_cases([build], schedule, torch.device("cpu"))
    finally:
        dist.destroy_process_group()
    spent = res.info["phase_s"]
    assert list(spent) == ["build", "warmup", "timed", "profiled", "tracked"]
    assert spent["warmup"] >= 2 * 0.01 and spent["timed"] >= MIN_MEASURED_STEPS * 0.01
    assert sum(res.step_s) <= spent["timed"]
    assert all(v >= 0 for v in spent.values())
