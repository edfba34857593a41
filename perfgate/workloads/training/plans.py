"""Which DDP and FSDP cases a session measures, per machine class: data, not logic.

One launch per (engine, world size) measures every case that world size needs, in a
loop, because starting ranks costs seconds; the tests then read their case from it.

Two profiles:
- ``CPU``: gloo, tiny models, world 2 and 4 launches with one thread per rank (keep
  world <= 4 on a 2-core machine); world 1 runs inside each of them on rank 0 alone while
  the other ranks wait, and all cases' timed steps are interleaved. DDP bucket caps are scaled down with the model (0.25/1/4 MiB against a
  2.5 MiB gradient give 7/2/1 buckets, perfgate.workloads.training.anatomy.ddp_buckets; 4/25/100
  MiB against the 110M model's 419 MiB give tens to a few) -- the same caps on a tiny model would all be a single bucket.
- ``GPU``: NCCL, the seed report's models (gpt-110m for DDP, gpt-368m for FSDP), bf16
  autocast, the seed's batch sizes and bucket caps, on 2/4/8 GPUs, and the micro-batch sweep on
  one GPU too (the seed report's V100 numbers are imported against those ids). On one H200 their
  steps are host-bound (device busy 0.09-0.26 of the step, 1xH200 2026-12-02: the step time
  measures Python and kernel launches), so the 1-rank FSDP cases are gone and the 1-rank DDP
  timings are record-only there; one GPU's device-bound cases are GPU_LARGE's. Every GPU case
  records its device-busy share, so a host-bound multi-GPU case says so too.
- ``GPU_LARGE``: the device-bound GPU cases: a 1.3 B decoder at sequence length 2048, so one
  step is tens to hundreds of ms of device work and its time measures the GPU (busy >= 0.9 from
  micro-batch 4 for DDP; FSDP at 8; tools/device_bound_probe.py shows step time against micro-batch:
  on 1xH200 mb1 and mb2 read busy 0.57 and 0.74, host-bound, and say so). No bucket, accumulation
  or hook sweeps (the seed profile has them); micro-batch and FSDP at world 1, scaling and
  FSDP on more GPUs.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.workloads.training.specs import (DDPCase, DDPJob, FSDP_KINDS, FSDPJob, Schedule, ShardingMode,
                                               strong_scaling_case)


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str
    amp: str
    ddp_model: str
    fsdp_model: str
    worlds: tuple[int, ...]  # DDP launches; scaling tests run at those > 1 against world 1
    global_batch: int  # strong scaling: sequences per optimizer step, fixed
    micro_batch: int  # weak scaling and the sweeps: sequences per rank per micro-batch
    microbatches: tuple[int, ...]
    microbatch_worlds: tuple[int, ...]
    bucket_caps_mb: tuple[float, ...]
    bucket_reference_mb: float  # the sweep's point of comparison (DDP's default, 25 MiB, on GPUs)
    sweep_worlds: tuple[int, ...]  # bucket, accumulation and comm-hook sweeps
    accum_steps: int
    hook_reduce_dtypes: tuple[str, ...]  # DDP compress hooks compared with fp32 all-reduce
    fsdp_worlds: tuple[int, ...]
    fsdp_micro_batch: int
    fsdp_reduce_dtypes: tuple[str, ...]
    fsdp_lowp_worlds: tuple[int, ...]  # world sizes that also run the fp16/bf16-reduce modes
    ddp_schedule: Schedule
    fsdp_schedule: Schedule
    launch_timeout_s: float
    # World 1 measured inside each world-N launch, on rank 0 alone (CPU), rather than in a
    # world-1 launch of its own (GPU): on a shared CPU box the two then see the same load.
    reference_in_launch: bool = False
    interleave: bool = False  # round-robin timed steps over a launch's cases (gloo only)
    # FSDP step anatomy (seed §16.9; fp32 reduce, worlds > 1, in the FSDP launch): these kinds also
    # run with the root wrapped alone, and these FSDP1 kinds also without backward prefetch.
    fsdp_wrap_kinds: tuple[str, ...] = ()
    fsdp_prefetch_kinds: tuple[str, ...] = ()

    @property
    def gpu(self) -> bool:
        return self.backend == "nccl"

    def marker(self, world_size: int) -> str:
        """The pytest marker a test at this world size needs."""
        return f"{max(world_size, 1)}gpu" if self.gpu else "cpu"


CPU = Profile(
    name="cpu", backend="gloo", amp="none", ddp_model="gpt-tiny", fsdp_model="gpt-tiny-untied",
    worlds=(2, 4), global_batch=8, micro_batch=2, microbatches=(1, 2, 4, 8), microbatch_worlds=(2,),
    bucket_caps_mb=(0.25, 1.0, 4.0), bucket_reference_mb=1.0, sweep_worlds=(2,), accum_steps=4,
    hook_reduce_dtypes=("fp16", "bf16"), fsdp_worlds=(2, 4), fsdp_micro_batch=1,
    fsdp_reduce_dtypes=("fp32", "fp16"), fsdp_lowp_worlds=(2,),
    ddp_schedule=Schedule(warmup_steps=3, measured_steps=10, tracked_steps=5),
    fsdp_schedule=Schedule(warmup_steps=2, measured_steps=6, tracked_steps=5),
    launch_timeout_s=400.0, reference_in_launch=True, interleave=True,
    fsdp_wrap_kinds=("fsdp1-FULL_SHARD", "fsdp2-reshard"), fsdp_prefetch_kinds=("fsdp1-FULL_SHARD",),
)

GPU = Profile(
    name="gpu", backend="nccl", amp="bf16", ddp_model="gpt-110m", fsdp_model="gpt-368m",
    worlds=(1, 2, 4, 8), global_batch=16, micro_batch=2, microbatches=(1, 2, 4, 8), microbatch_worlds=(1, 2, 4, 8),
    bucket_caps_mb=(4.0, 25.0, 100.0), bucket_reference_mb=25.0, sweep_worlds=(2, 4, 8), accum_steps=4,
    hook_reduce_dtypes=("fp16", "bf16"), fsdp_worlds=(2, 4, 8), fsdp_micro_batch=1,
    fsdp_reduce_dtypes=("fp32", "fp16", "bf16"), fsdp_lowp_worlds=(2, 4, 8),
    ddp_schedule=Schedule(warmup_steps=3, measured_steps=10, tracked_steps=5, profiled_steps=5),
    fsdp_schedule=Schedule(warmup_steps=3, measured_steps=10, tracked_steps=5, profiled_steps=5),
    launch_timeout_s=600.0,
    fsdp_wrap_kinds=("fsdp1-FULL_SHARD", "fsdp2-reshard"), fsdp_prefetch_kinds=("fsdp1-FULL_SHARD",),
)

GPU_LARGE = Profile(
    name="gpu-large", backend="nccl", amp="bf16", ddp_model="gpt-1.3b", fsdp_model="gpt-1.3b-untied",
    worlds=(1, 2, 4, 8), global_batch=16, micro_batch=2, microbatches=(1, 2, 4, 8), microbatch_worlds=(1,),
    bucket_caps_mb=(), bucket_reference_mb=25.0, sweep_worlds=(), accum_steps=4, hook_reduce_dtypes=(),
    fsdp_worlds=(1, 2, 4, 8), fsdp_micro_batch=8, fsdp_reduce_dtypes=("fp32", "bf16"), fsdp_lowp_worlds=(1, 2, 4, 8),
    ddp_schedule=Schedule(warmup_steps=3, measured_steps=10, tracked_steps=5, profiled_steps=5),
    fsdp_schedule=Schedule(warmup_steps=3, measured_steps=10, tracked_steps=5, profiled_steps=5),
    launch_timeout_s=900.0,
)

PROFILES = (CPU, GPU, GPU_LARGE)


def bucket_label(cap_mb: float) -> str:
    return f"bucket{cap_mb:g}MiB"


def ddp_job(profile: Profile, world_size: int) -> DDPJob:
    """Every DDP case ``profile`` measures at ``world_size``, as one job (one launch)."""
    p = profile
    mb = p.micro_batch
    cases: list[DDPCase] = [
        strong_scaling_case("strong", global_batch=p.global_batch, micro_batch=mb, world_size=world_size),
        DDPCase("weak", micro_batch=mb),
    ]
    if world_size in p.microbatch_worlds:
        cases += [DDPCase(f"mb{m}", micro_batch=m, track_memory=True) for m in p.microbatches]
    if world_size in p.sweep_worlds:
        cases += [DDPCase(bucket_label(cap), micro_batch=mb, bucket_cap_mb=cap) for cap in p.bucket_caps_mb]
        cases += [DDPCase(f"ga{p.accum_steps}-no_sync", micro_batch=mb, grad_accum=p.accum_steps, no_sync=True),
                  DDPCase(f"ga{p.accum_steps}-sync_every_micro", micro_batch=mb, grad_accum=p.accum_steps,
                          no_sync=False)]
        cases.append(DDPCase("hook-fp32", micro_batch=mb, reduce_dtype="fp32"))
        cases += [DDPCase(f"hook-{dt}", micro_batch=mb, reduce_dtype=dt) for dt in p.hook_reduce_dtypes
                  if dt != "bf16" or p.gpu]
    refs: list[DDPCase] = []
    if p.reference_in_launch and world_size > 1:
        refs = [strong_scaling_case("world1-strong", global_batch=p.global_batch, micro_batch=mb, world_size=1),
                DDPCase("world1-weak", micro_batch=mb)]
        if world_size in p.microbatch_worlds:
            refs += [DDPCase(f"world1-mb{m}", micro_batch=m, track_memory=True) for m in p.microbatches]
    return DDPJob(model=p.ddp_model, world_size=world_size, backend=p.backend, cases=tuple(cases),
                  schedule=p.ddp_schedule, amp=p.amp, reference_cases=tuple(refs), interleave=p.interleave)


def fsdp_modes(profile: Profile, world_size: int) -> tuple[ShardingMode, ...]:
    modes = []
    for dt in profile.fsdp_reduce_dtypes:
        if dt != "fp32" and world_size not in profile.fsdp_lowp_worlds:
            continue
        if dt == "bf16" and not profile.gpu:
            continue  # DDP's bf16 hook, the reference, needs NCCL
        modes += [ShardingMode(kind, dt) for kind in FSDP_KINDS]
    if world_size > 1 and "fp32" in profile.fsdp_reduce_dtypes:  # one rank has nothing to shard
        modes += [ShardingMode(kind, "fp32", wrap="root") for kind in profile.fsdp_wrap_kinds]
        modes += [ShardingMode(kind, "fp32", backward_prefetch=False) for kind in profile.fsdp_prefetch_kinds]
    return tuple(modes)


def fsdp_job(profile: Profile, world_size: int) -> FSDPJob:
    return FSDPJob(model=profile.fsdp_model, world_size=world_size, backend=profile.backend,
                   modes=fsdp_modes(profile, world_size), micro_batch=profile.fsdp_micro_batch,
                   schedule=profile.fsdp_schedule, amp=profile.amp, interleave=profile.interleave)
