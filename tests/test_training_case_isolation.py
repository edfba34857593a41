"""A memory-tracked case leaves nothing alive for the next case to count.

torch's module tracker (inside MemTracker and FSDPMemTracker) registers multi-grad hooks whose
closures hold the autograd nodes they hang on, a cycle gc cannot free; the tracked step's graph
kept the case's parameters and gradients alive, and the next case's peak GPU memory counted them
(56.8 GiB for 1.3b-mb4 after two tracked cases on the H200, 38.0 GiB alone). The engine removes
those hooks after each tracked step. Here: the real engine and real trackers on a one-rank gloo
group with the CPU model; weak references to each case's parameters, checked as the next case is
built and after the run.
"""
from __future__ import annotations

import functools
import gc
import types
import weakref
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from perfgate.workloads.training import ddp, fsdp
from perfgate.workloads.training.engine import run_cases
from perfgate.workloads.training.specs import DDPCase, DDPJob, FSDPJob, Schedule, ShardingMode

SCHEDULE = Schedule(warmup_steps=1, measured_steps=5, tracked_steps=5)


@pytest.fixture
def one_rank(tmp_path):
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=timedelta(seconds=60))
    yield types.SimpleNamespace(rank=0, world_size=1, device=torch.device("cpu"), phase=lambda text: None)
    dist.destroy_process_group()


def _watched(build, watched: list[list[weakref.ref]], alive_at_build: list[int]):
    """``build`` whose case's parameters are watched; records how many earlier ones are alive."""
    def wrapped():
        gc.collect()
        alive_at_build.append(sum(r() is not None for refs in watched for r in refs))
        case = build()
        modules = [c.cell_contents for c in case.step.__closure__ or ()
                   if isinstance(c.cell_contents, torch.nn.Module)]
        assert modules, "the step closure holds the wrapped model"
        watched.append([weakref.ref(p) for p in modules[0].parameters()])
        return case
    return wrapped


def _run_watched(builders, ctx):
    watched: list[list[weakref.ref]] = []
    alive_at_build: list[int] = []
    results = run_cases([_watched(b, watched, alive_at_build) for b in builders], SCHEDULE, ctx.device)
    assert all(r.tracked_peak_bytes and not r.tracker_error for r in results[:-1])
    gc.collect()
    return alive_at_build, [sum(r() is not None for r in refs) for refs in watched]


def test_a_ddp_case_tracked_by_memtracker_is_freed_before_the_next(one_rank):
    job = DDPJob(model="gpt-tiny", world_size=1, backend="gloo", schedule=SCHEDULE,
                 cases=(DDPCase("a", 2, track_memory=True), DDPCase("b", 2, track_memory=True), DDPCase("c", 2)))
    builders = [functools.partial(ddp.build_case, job, case, one_rank) for case in job.cases]
    alive_at_build, alive_after = _run_watched(builders, one_rank)
    assert alive_at_build == [0, 0, 0]
    assert alive_after == [0, 0, 0]


def test_an_fsdp2_case_tracked_by_fsdpmemtracker_is_freed_before_the_next(one_rank):
    from torch.distributed.device_mesh import init_device_mesh

    modes = (ShardingMode("fsdp2-reshard"), ShardingMode("ddp"))
    job = FSDPJob(model="gpt-tiny", world_size=1, backend="gloo", modes=modes, schedule=SCHEDULE)
    assert all(job.tracks(m) for m in modes)
    mesh = init_device_mesh("cpu", (1,))
    builders = [functools.partial(fsdp.build_mode, job, mode, one_rank, mesh) for mode in job.modes]
    alive_at_build, alive_after = _run_watched(builders, one_rank)
    assert alive_at_build == [0, 0]
    assert alive_after == [0, 0]


def test_a_gpu_case_peak_is_counted_from_what_was_allocated_when_it_was_built(one_rank, monkeypatch):
    """What gc cannot free (FSDP1 keeps its flat parameters in a cycle through C++ from construction
    on) stays allocated into later cases; each case's peak is counted from its own floor. The CUDA
    allocator's counters are stood in for (this checks the engine's arithmetic, not a GPU)."""
    from perfgate.workloads.training import engine
    from perfgate.workloads.training.engine import BuiltCase, CaseResult

    gib = 2**30
    allocated = {"now": 3 * gib, "peak": 3 * gib}  # 3 GiB left by earlier cases of the launch
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: allocated["now"])
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: allocated["peak"])
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats",
                        lambda device=None: allocated.update(peak=allocated["now"]))
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
    monkeypatch.setattr(engine, "synchronize", lambda device: None)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)  # the step window's clock

    def build(leaves_gib: float):
        def step(i):
            allocated["peak"] = max(allocated["peak"], allocated["now"] + 5 * gib)  # the step needs 5 GiB
            return 1.0
        def built():
            allocated["now"] += int(leaves_gib * gib)  # what this case's model keeps past its end
            return BuiltCase(result=CaseResult(label=f"leaves-{leaves_gib}", rank=0, world_size=1), step=step)
        return built

    schedule = Schedule(warmup_steps=1, measured_steps=5)
    first, second = run_cases([build(2), build(0)], schedule, torch.device("cuda", 0))
    assert first.info["alloc_floor_gib"] == 3 and second.info["alloc_floor_gib"] == 5
    assert {b / gib for b in first.peak_alloc_bytes} == {7.0}  # its own 2 GiB + the step's 5
    assert {b / gib for b in second.peak_alloc_bytes} == {5.0}  # not the 2 GiB the first one left


def test_a_finished_fsdp1_case_holds_no_memory_even_where_its_parameters_outlive_it(one_rank):
    """FSDP1's flat parameters sit in a reference cycle through C++ from construction on, so the
    objects outlive the case; on an H100 each finished 368M case kept 2.75 GiB and the 1.3 B launch
    ran out of memory. The engine frees their storages (engine.free_storages): whatever stays alive
    holds no bytes, and the next case's build finds nothing of the last one's parameters in memory."""
    modes = (ShardingMode("fsdp1-FULL_SHARD"), ShardingMode("fsdp1-SHARD_GRAD_OP"), ShardingMode("ddp"))
    job = FSDPJob(model="gpt-tiny", world_size=1, backend="gloo", modes=modes, schedule=SCHEDULE)
    watched: list[list[weakref.ref]] = []
    held_at_build: list[int] = []

    def bytes_held() -> int:
        return sum(p().untyped_storage().nbytes() for refs in watched for p in refs if p() is not None)

    def watching(build):
        def wrapped():
            gc.collect()
            held_at_build.append(bytes_held())
            case = build()
            watched.append([weakref.ref(p) for owner in case.owners if isinstance(owner, torch.nn.Module)
                            for p in owner.parameters()])
            assert watched[-1], "the case names its wrapped model among its owners"
            return case
        return wrapped

    builders = [functools.partial(fsdp.build_mode, job, mode, one_rank, None) for mode in job.modes]
    run_cases([watching(b) for b in builders], SCHEDULE, one_rank.device)
    gc.collect()
    assert held_at_build == [0, 0, 0]
    assert bytes_held() == 0
