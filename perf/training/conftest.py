"""Session cache of training launches, and the recording shared by the DDP and FSDP tests.

Each (engine, profile, world size) job measures all its cases in one launch, once per
session; tests read their case from it. Speedups against world 1 therefore compare two
launches of this very session. A perfgate re-measurement (``perf.attempt > 1``) launches
fresh jobs, so a retry sees new samples, never the cached ones.
"""
from __future__ import annotations

import pytest

from perfgate.launch import launch
from perfgate.workloads.training import plans
from perfgate.workloads.training.summary import CaseSummary, summarize_job

TARGETS = {"ddp": "perfgate.workloads.training.ddp:run", "fsdp": "perfgate.workloads.training.fsdp:run"}


class TrainingRuns:
    def __init__(self):
        self._cache: dict[tuple, dict[str, CaseSummary]] = {}

    def _job(self, engine: str, profile: plans.Profile, world: int):
        return plans.ddp_job(profile, world) if engine == "ddp" else plans.fsdp_job(profile, world)

    def _launch(self, engine: str, profile: plans.Profile, job) -> dict[str, CaseSummary]:
        # One thread per rank: ranks share the cores, and world 1 must not get more of them.
        env = {"OMP_NUM_THREADS": "1"} if profile.backend == "gloo" else {}
        per_rank = launch(TARGETS[engine], job, world_size=job.world_size, backend=profile.backend,
                          timeout_s=profile.launch_timeout_s, env=env)
        return summarize_job(per_rank)

    def get(self, engine: str, profile: plans.Profile, world: int, *, fresh: bool = False,
            labels: tuple[str, ...] = ()) -> dict[str, CaseSummary]:
        """Every case of the (engine, profile, world) job, launched once per session.

        ``fresh``: launch again, only the cases in ``labels`` (a re-measurement), and keep
        those new results for later readers too.
        """
        key = (engine, profile.name, world)
        job = self._job(engine, profile, world)  # validated here, before any rank starts
        if key not in self._cache:
            self._cache[key] = self._launch(engine, profile, job)
        elif fresh:
            self._cache[key] = {**self._cache[key], **self._launch(engine, profile, job.only(labels))}
        return self._cache[key]

    def ddp(self, profile, world, *labels: str, fresh=False) -> dict[str, CaseSummary]:
        return self.get("ddp", profile, world, fresh=fresh, labels=labels)

    def fsdp(self, profile, world, *labels: str, fresh=False) -> dict[str, CaseSummary]:
        return self.get("fsdp", profile, world, fresh=fresh, labels=labels)

    def scaling_pair(self, profile, world, label, *, fresh=False) -> tuple[CaseSummary, CaseSummary]:
        """(world-1 reference, world-N case) for a DDP case ``label``, both from this session.

        With ``profile.reference_in_launch`` the reference ran on rank 0 alone inside the
        world-N launch (case ``world1-<label>``); otherwise it comes from a world-1 launch.
        """
        if profile.reference_in_launch:
            runs = self.ddp(profile, world, label, f"world1-{label}", fresh=fresh)
            return runs[f"world1-{label}"], runs[label]
        return self.ddp(profile, 1, label, fresh=fresh)[label], self.ddp(profile, world, label, fresh=fresh)[label]


@pytest.fixture(scope="session")
def training_runs() -> TrainingRuns:
    return TrainingRuns()


def _record_throughput(perf, s: CaseSummary) -> None:
    perf.record("tokens_per_s", s.tokens_per_s, unit="tok/s", better="higher")
    perf.record("step_ms", s.step_ms, unit="ms", better="lower")  # slowest rank per step
    if s.peak_alloc_gib:
        perf.record("peak_alloc_gib", s.peak_alloc_gib, unit="GiB", better="lower")


def _record_tracked_memory(perf, s: CaseSummary) -> None:
    """Tracker peak per step and its breakdown (params, grads, optimizer, activations, temp, other)."""
    perf.record("tracked_peak_mib", s.tracked_peak_mib, unit="MiB", better="lower")
    for name, values in s.categories_mib.items():
        perf.record(f"{name}_at_peak_mib", values, unit="MiB", better="lower")


@pytest.fixture
def record_throughput():
    """tokens/s and slowest-rank step time per timed step; peak CUDA allocation on GPUs."""
    return _record_throughput


@pytest.fixture
def record_tracked_memory():
    return _record_tracked_memory
