"""DDP engine: build one DistributedDataParallel case and run it through the step loop.

Runs inside a launcher rank (``launch("perfgate.workloads.training.ddp:run", job, ...)``)
and returns one :class:`~perfgate.workloads.training.engine.CaseResult` per case.

Every case registers a comm hook from torch's ``default_hooks`` (``allreduce_hook`` for
fp32, ``fp16_compress_hook``, ``bf16_compress_hook``) wrapped in a counter, which is how
the number of gradient all-reduce calls per optimizer step is observed: DDP calls the
hook once per bucket it reduces. Using the Python ``allreduce_hook`` for fp32 too keeps
the fp32/fp16 comparison about bytes on the wire, not about hook dispatch.
"""
from __future__ import annotations

import functools
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from perfgate import mutations
from perfgate.workloads.training.anatomy import exposed_comm_s
from perfgate.workloads.training.engine import (BuiltCase, CaseResult, autocast, make_adamw,
                                                maybe_extra_param_copy, run_cases)
from perfgate.workloads.training.model import SyntheticTokens, build_model, get_config, loss_fn
from perfgate.workloads.training.specs import DDPCase, DDPJob


class HookCounter:
    """``counter()``: how often DDP called the comm hook; ``blocked_s``: seconds the backward pass
    spent inside it. DDP overlaps communication with backward only while the hook returns at once
    (an async all-reduce); a hook that waits for its bucket serialises the two."""

    def __init__(self):
        self.calls = 0
        self.blocked_s = 0.0

    def __call__(self) -> int:
        return self.calls

    def bucket_handed_over(self, fut):
        return fut

    def end_backward(self) -> None:
        pass


class ExposedCommCounter(HookCounter):
    """A :class:`HookCounter` that also sums ``exposed_s``: per backward pass, the communication no
    compute hid (perfgate.workloads.training.anatomy.exposed_comm_s). CPU only: a gloo future
    completes when its all-reduce is done; an NCCL future completes at enqueue (stream semantics),
    so on GPUs the same clock would read zero."""

    def __init__(self):
        super().__init__()
        self.exposed_s = 0.0
        self._ready_s: list[float] = []
        self._done_s: list[float] = []
        self._blocked_at_start = 0.0

    def bucket_handed_over(self, fut):
        self._ready_s.append(time.perf_counter())
        done = self._done_s

        def stamp(f):
            done.append(time.perf_counter())
            return f.value()
        return fut.then(stamp)  # DDP waits on this one, so every stamp is in before backward returns

    def end_backward(self) -> None:
        self.exposed_s += exposed_comm_s(self._ready_s, self._done_s, self.blocked_s - self._blocked_at_start)
        self._ready_s, self._done_s, self._blocked_at_start = [], [], self.blocked_s


def counting_hook(reduce_dtype_hook: str, counter: HookCounter | None = None):
    """(hook, counter) where ``hook`` is the named default hook and ``counter`` a :class:`HookCounter`.

    ``functools.wraps`` keeps the wrapped hook's name and signature, so DDP's own checks
    (e.g. bf16_compress_hook needs NCCL) still apply to the wrapper.
    """
    inner = getattr(default_hooks, reduce_dtype_hook)
    counter = HookCounter() if counter is None else counter

    @functools.wraps(inner)
    def hook(state, bucket):
        counter.calls += 1
        t0 = time.perf_counter()
        fut = inner(state, bucket)
        if mutations.active("ddp_no_overlap"):
            fut.wait()  # planted bug: backward stalls until this bucket is reduced
        counter.blocked_s += time.perf_counter() - t0
        return counter.bucket_handed_over(fut)

    return hook, counter


def wrap_ddp(model: torch.nn.Module, device: torch.device, *, bucket_cap_mb: float, reduce_dtype_hook: str,
             group=None):
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, process_group=group,
              bucket_cap_mb=bucket_cap_mb, gradient_as_bucket_view=True)
    hook, calls = counting_hook(reduce_dtype_hook, ExposedCommCounter() if device.type == "cpu" else None)
    ddp.register_comm_hook(group, hook)  # the state a default hook gets is its process group
    return ddp, calls


def grad_bytes_in_ready_order(model: torch.nn.Module) -> list[int]:
    """Gradient bytes per parameter in reverse registration order: the order DDP's rebuilt buckets
    take them (gradients become ready back to front), what anatomy.ddp_buckets is given."""
    return [p.numel() * p.element_size() for p in reversed(list(model.parameters()))]


def accumulation_step(ddp: DDP, opt: torch.optim.Optimizer, data: SyntheticTokens, *, grad_accum: int,
                      no_sync: bool, device: torch.device, amp: str, counter: HookCounter | None = None):
    """step(i) -> mean loss of optimizer step i over ``grad_accum`` micro-batches."""
    no_sync = no_sync and not mutations.active("ddp_no_sync_ignored")  # planted bug: sync every micro-batch

    def step(i: int) -> float:
        opt.zero_grad(set_to_none=True)
        total = torch.zeros((), device=device)
        for micro in range(grad_accum):
            skip_sync = no_sync and micro < grad_accum - 1
            with ddp.no_sync() if skip_sync else nullcontext():
                with autocast(device, amp):
                    loss = loss_fn(ddp, data.batch(i, micro)) / grad_accum
                loss.backward()
            if counter is not None:
                counter.end_backward()
            total += loss.detach()
        opt.step()
        return float(total.item())

    return step


def build_case(job: DDPJob, case: DDPCase, ctx, *, group=None, group_ranks: tuple[int, ...] | None = None
               ) -> BuiltCase:
    """Model, DDP wrapper, optimizer and data of one case; ``group`` None means every rank."""
    from torch.distributed._tools.mem_tracker import MemTracker

    world = len(group_ranks) if group_ranks else ctx.world_size
    result = CaseResult(label=case.label, rank=ctx.rank, world_size=world,
                        info={"tokens_per_step": job.tokens_per_step(case, world), "micro_batch": case.micro_batch,
                              "grad_accum": case.grad_accum, "bucket_cap_mb": case.bucket_cap_mb,
                              "no_sync": case.no_sync, "comm_hook": case.comm_hook, "amp": job.amp,
                              "n_params": get_config(job.model).n_params})
    if group_ranks and ctx.rank not in group_ranks:
        return BuiltCase(result=result, step=None, group=group)
    device = ctx.device
    cfg = get_config(job.model)
    model = build_model(cfg, device, seed=job.seed)
    extra = maybe_extra_param_copy(model)
    result.extra_param_copy = bool(extra)
    result.info["grad_bytes_in_ready_order"] = grad_bytes_in_ready_order(model)
    ddp, calls = wrap_ddp(model, device, bucket_cap_mb=case.bucket_cap_mb, reduce_dtype_hook=case.comm_hook,
                          group=group)
    opt = make_adamw(ddp.parameters(), device, job.lr)
    group_rank = group_ranks.index(ctx.rank) if group_ranks else ctx.rank
    data = SyntheticTokens(cfg, case.micro_batch, device, job.seed, group_rank, world)
    step = accumulation_step(ddp, opt, data, grad_accum=case.grad_accum, no_sync=case.no_sync,
                             device=device, amp=job.amp, counter=calls)

    def make_tracker():
        tracker = MemTracker()
        tracker.track_external(ddp.module, opt, *extra)
        return tracker

    return BuiltCase(result=result, step=step, group=group, make_tracker=make_tracker if case.track_memory else None,
                     allreduce_counter=calls, keepalive=extra, owners=(ddp, opt))


def run(job: DDPJob, ctx) -> list[CaseResult]:
    """Worker entry point: every case of ``job`` on this rank (reference cases on rank 0 alone)."""
    builders = [functools.partial(build_case, job, case, ctx) for case in job.cases]
    if job.reference_cases:
        solo = dist.new_group([0])  # every rank must take part in creating it
        builders += [functools.partial(build_case, job, case, ctx, group=solo, group_ranks=(0,))
                     for case in job.reference_cases]
    return run_cases(builders, job.schedule, ctx.device, interleave=job.interleave, phase=ctx.phase)
