"""FSDP engine: DDP, FSDP1 and FSDP2 modes on one model, batch and reduce dtype.

Runs inside a launcher rank (``launch("perfgate.workloads.training.fsdp:run", job, ...)``)
and returns one :class:`~perfgate.workloads.training.engine.CaseResult` per mode.

Choices that keep the comparison about sharding only:
- the same autocast compute dtype for every mode (none on CPU, bf16 on GPU); FSDP's
  mixed precision sets only ``reduce_dtype``, and DDP gets the matching compress hook;
- FSDP1 wraps each ``GPTBlock`` (``ModuleWrapPolicy``), ``limit_all_gathers=True`` as the seed,
  but ``use_orig_params=False``: torch's MemTracker installs post-accumulate-grad hooks on the
  module parameters, which the non-leaf views of ``use_orig_params=True`` refuse;
- FSDP2 ``fully_shard`` on each block, then on the root.
- The step anatomy modes (``ShardingMode.wrap="root"``, ``backward_prefetch=False``) change only
  that; the last warm-up step of every FSDP mode runs under a
  :class:`~perfgate.workloads.training.collective_log.CollectiveLog` (the collectives it issued,
  in order, with where backward began), which the reduce checks against
  :mod:`perfgate.workloads.training.anatomy`.
"""
from __future__ import annotations

import functools
from contextlib import nullcontext

import torch

from perfgate import mutations
from perfgate.workloads.training.collective_log import CollectiveLog
from perfgate.workloads.training.ddp import accumulation_step, wrap_ddp
from perfgate.workloads.training.engine import (BuiltCase, CaseResult, autocast, make_adamw,
                                                maybe_extra_param_copy, run_cases)
from perfgate.workloads.training.model import GPTBlock, SyntheticTokens, build_model, get_config, loss_fn
from perfgate.workloads.training.specs import DDP_HOOK_FOR_REDUCE, FSDPJob, ShardingMode

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def wraps_blocks(mode: ShardingMode) -> bool:
    """Whether each GPTBlock is its own FSDP unit (else the root alone is: one flat parameter)."""
    return mode.wrap == "block" and not mutations.active("fsdp_root_wrap")  # planted bug: root only


def _fsdp1(model, mode: ShardingMode, device: torch.device):
    from torch.distributed.fsdp import BackwardPrefetch, MixedPrecision, ShardingStrategy
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    strategy = ShardingStrategy[mode.kind.split("-", 1)[1]]
    mp = None if mode.reduce_dtype == "fp32" else MixedPrecision(reduce_dtype=DTYPES[mode.reduce_dtype])
    return FSDP(model, sharding_strategy=strategy,
                auto_wrap_policy=ModuleWrapPolicy({GPTBlock}) if wraps_blocks(mode) else None,
                backward_prefetch=BackwardPrefetch.BACKWARD_PRE if mode.backward_prefetch else None,
                mixed_precision=mp, device_id=device, use_orig_params=False, limit_all_gathers=True)


def _fsdp2(model, mode: ShardingMode, mesh):
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    reshard = mode.kind == "fsdp2-reshard"
    mp = MixedPrecisionPolicy(reduce_dtype=None if mode.reduce_dtype == "fp32" else DTYPES[mode.reduce_dtype])
    if wraps_blocks(mode):
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)
    return fully_shard(model, mesh=mesh, reshard_after_forward=reshard, mp_policy=mp)


def build_mode(job: FSDPJob, mode: ShardingMode, ctx, mesh) -> BuiltCase:
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed._tools.mem_tracker import MemTracker

    device = ctx.device
    cfg = get_config(job.model)
    model = build_model(cfg, device, seed=job.seed)
    extra = maybe_extra_param_copy(model)
    calls = None
    if mode.is_ddp:
        wrapped, calls = wrap_ddp(model, device, bucket_cap_mb=25.0,
                                  reduce_dtype_hook=DDP_HOOK_FOR_REDUCE[mode.reduce_dtype])
    elif mode.kind.startswith("fsdp1"):
        wrapped = _fsdp1(model, mode, device)
    else:
        wrapped = _fsdp2(model, mode, mesh)
    opt = make_adamw(wrapped.parameters(), device, job.lr)
    data = SyntheticTokens(cfg, job.micro_batch, device, job.seed, ctx.rank, ctx.world_size)
    result = CaseResult(label=mode.label, rank=ctx.rank, world_size=ctx.world_size, extra_param_copy=bool(extra),
                        info={"tokens_per_step": job.tokens_per_step, "kind": mode.kind,
                              "reduce_dtype": mode.reduce_dtype, "micro_batch": job.micro_batch,
                              "amp": job.amp, "n_params": cfg.n_params, "wrap": mode.wrap,
                              "backward_prefetch": mode.backward_prefetch, "n_layer": cfg.n_layer})
    if mode.is_ddp:
        step = accumulation_step(wrapped, opt, data, grad_accum=1, no_sync=True, device=device, amp=job.amp,
                                 counter=calls)
    else:
        logged_step = job.schedule.warmup_steps - 1  # the last warm-up step: lazy init is done, never timed

        def step(i: int) -> float:
            log = CollectiveLog() if i == logged_step else None
            with log if log is not None else nullcontext():
                opt.zero_grad(set_to_none=True)
                with autocast(device, job.amp):
                    loss = loss_fn(wrapped, data.batch(i, 0))
                if log is not None:
                    log.mark_backward()
                loss.backward()
                opt.step()
            if log is not None:
                result.collective_ops.append(log.ops)
            return float(loss.detach().item())

    def make_tracker():
        if mode.kind.startswith("fsdp2"):
            tracker = FSDPMemTracker(wrapped, opt)
            if extra:
                tracker.track_inputs(tuple(extra))  # FSDPMemTracker.track_external is a no-op
        else:
            tracker = MemTracker()
            tracker.track_external(wrapped, opt, *extra)
        return tracker

    return BuiltCase(result=result, step=step, make_tracker=make_tracker if job.tracks(mode) else None,
                     allreduce_counter=calls, keepalive=extra, owners=(wrapped, opt))


def run(job: FSDPJob, ctx) -> list[CaseResult]:
    """Worker entry point: every mode of ``job``, in order, on this rank."""
    mesh = None
    if any(m.kind.startswith("fsdp2") for m in job.modes):
        from torch.distributed.device_mesh import init_device_mesh

        mesh = init_device_mesh(ctx.device.type, (ctx.world_size,))
    builders = [functools.partial(build_mode, job, mode, ctx, mesh) for mode in job.modes]
    return run_cases(builders, job.schedule, ctx.device, interleave=job.interleave, phase=ctx.phase)
