"""torch.distributed.pipelining worker: GPipe, 1F1B and interleaved 1F1B, several M per launch.

One launch (one rank per pipeline stage, gloo on CPU or NCCL on GPU) runs, for every M in
the spec, a real ``PipelineStage`` + schedule training step with an SGD update, and returns
raw per-iteration timings; :mod:`perfgate.workloads.pipeline.summary` turns them into bubble,
tokens/s and speedup series. Phases, in order:

1. **Correctness** (once per M, before any optimizer step): the pipeline's per-microbatch
   losses (last stage) and every stage's gradients are compared with a single-process run
   of the same model on the same microbatches (every rank rebuilds the whole model from the
   same seed and computes the reference itself). The differences come back; the test asserts.
   This is also each schedule's first, untimed step (the stages exchange shapes in it).
2. **Timing**, per M: ``warmup_steps`` discarded steps, then ``measured_steps`` steps, each one
   sample. A step: barrier, ``schedule.step``, then ``optimizer.step``. ``sched_s`` is the rank's
   time in the schedule step (the bubble's wall time), ``step_s`` includes the optimizer.
   Busy time: brackets around the stage's chunk methods (see :mod:`.chunk_timer` for the
   method and why it is the least invasive one).
3. **PP=1 reference**, interleaved with the pipeline steps so machine drift hits both alike:
   rank 0 alone trains the whole model on the same M microbatches (plain gradient
   accumulation, same optimizer) while the others wait at a barrier; its step time over the
   pipeline's is the speedup.
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass, field
from typing import Any

from perfgate.workloads import timing
from perfgate.workloads.area import MIN_MEASURED_STEPS
from perfgate.workloads.pipeline.layout import ParallelLayout, pipeline_layouts
from perfgate.workloads.training.model import GPTConfig

DTYPES = ("float32", "bfloat16")
# |pipeline - single process| bounds for the correctness phase (gradients relative to the
# tensor's largest). fp32: the same kernels on the same shapes, only the grouping of work into
# processes differs (measured: bit-identical). bf16: gradients accumulate over M microbatches in
# bf16, scaled before (reference) or after (schedule) the sum; a wrong stage or microbatch
# mapping is off by O(1), far above either bound.
TOLERANCES = {"float32": {"loss_abs": 1e-5, "grad_rel": 1e-4},
              "bfloat16": {"loss_abs": 2e-2, "grad_rel": 1e-1}}


@dataclass(frozen=True)
class TorchPipelineSpec:
    """One launch: a schedule at one PP degree, run for each M in ``microbatches``."""

    pp: int
    schedule: str                       # "gpipe" | "1f1b" | "interleaved-1f1b"
    model: GPTConfig
    microbatches: tuple[int, ...] = (1, 4, 16)
    virtual_stages: int = 1
    micro_batch_size: int = 4
    dtype: str = "float32"
    warmup_steps: int = 1
    measured_steps: int = 6
    lr: float = 1e-3
    seed: int = 0
    check_correctness: bool = True
    single_process_reference: bool = True
    layouts: tuple[ParallelLayout, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if not self.microbatches or len(set(self.microbatches)) != len(self.microbatches):
            raise ValueError(f"microbatches must be distinct values, got {self.microbatches}")
        if self.measured_steps < MIN_MEASURED_STEPS:
            raise ValueError(f"measured_steps must be >= {MIN_MEASURED_STEPS} (one sample per step), "
                             f"got {self.measured_steps}")
        if self.micro_batch_size < 1 or self.warmup_steps < 0:
            raise ValueError(f"micro_batch_size must be >= 1 and warmup_steps >= 0, got "
                             f"{self.micro_batch_size}, {self.warmup_steps}")
        if self.warmup_steps < 1 and not self.check_correctness:
            # The first step of a new PipelineStage also exchanges shapes between stages: it must
            # not be timed. With the correctness check on, the check is that step.
            raise ValueError("warmup_steps must be >= 1 when check_correctness is off")
        if self.model.tie_embeddings and self.pp > 1:
            raise ValueError(f"model {self.model.name} ties embedding and head; a pipeline needs an untied one")
        # Every (PP, M) layout is validated here, in the parent: a bad one never starts a process.
        object.__setattr__(self, "layouts", pipeline_layouts(self, "torch", self.model.n_layer))

    @property
    def world_size(self) -> int:
        return self.pp

    @property
    def tokens_per_microbatch(self) -> int:
        return self.micro_batch_size * self.model.seq_len


def _schedule_class(name: str):
    from torch.distributed import pipelining as pl

    return {"gpipe": pl.ScheduleGPipe, "1f1b": pl.Schedule1F1B,
            "interleaved-1f1b": pl.ScheduleInterleaved1F1B}[name]


def _tokens(spec: TorchPipelineSpec, m: int, step: int, device):
    """The global batch of step ``step`` at M=m: identical on every rank, a function of the seed."""
    import torch

    gen = torch.Generator().manual_seed(spec.seed * 1_000_003 + m * 10_007 + step + 1)
    tokens = torch.randint(0, spec.model.vocab, (m * spec.micro_batch_size, spec.model.seq_len + 1),
                           generator=gen)
    tokens = tokens.to(device)
    return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def _cross_entropy(logits, target):
    import torch.nn.functional as F

    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), target.reshape(-1))


class _Worker:
    """State of one rank across the phases."""

    def __init__(self, spec: TorchPipelineSpec, ctx):
        import torch

        from perfgate.workloads.pipeline.chunk_timer import ChunkTimer
        from perfgate.workloads.pipeline.stages import cut, param_count
        from perfgate.workloads.training.model import build_model

        self.spec, self.ctx = spec, ctx
        self.torch = torch
        self.device = ctx.device
        self.cuda = self.device.type == "cuda"
        self.dtype = getattr(torch, spec.dtype)
        self.layout = spec.layouts[0]  # the chunking does not depend on M
        self.chunk_ids = self.layout.rank_chunks(ctx.rank)
        last_chunk = self.layout.model_chunks - 1
        full = build_model(spec.model, device="cpu", seed=spec.seed).to(self.device, self.dtype)
        self.modules, self.name_map = {}, {}
        for c in self.chunk_ids:
            module, names = cut(full, self.layout.chunk_layers(c), first=c == 0, last=c == last_chunk)
            self.modules[c], self.name_map[c] = module, names
        del full
        self.params = [p for mod in self.modules.values() for p in mod.parameters()]
        self.chunk_params = {c: param_count(mod) for c, mod in self.modules.items()}
        self.optimizer = torch.optim.SGD(self.params, lr=spec.lr)
        self.timer = ChunkTimer(self.cuda)
        self.holds_first = 0 in self.chunk_ids
        self.holds_last = last_chunk in self.chunk_ids
        need_ref = spec.check_correctness or (spec.single_process_reference and ctx.rank == 0)
        self.ref = build_model(spec.model, device="cpu", seed=spec.seed).to(self.device, self.dtype) if need_ref else None
        self.ref_optimizer = torch.optim.SGD(self.ref.parameters(), lr=spec.lr) if self.ref is not None else None

    # -- building blocks ----------------------------------------------------------------
    def schedule(self, m: int):
        from torch.distributed.pipelining import PipelineStage

        n_chunks = self.layout.model_chunks
        stages = [self.timer.wrap_stage(PipelineStage(self.modules[c], c, n_chunks, self.device))
                  for c in self.chunk_ids]
        cls = _schedule_class(self.spec.schedule)
        if self.spec.schedule == "interleaved-1f1b":
            return cls(stages, n_microbatches=m, loss_fn=_cross_entropy)
        return cls(stages[0], n_microbatches=m, loss_fn=_cross_entropy)

    def pipeline_step(self, sched, m: int, step: int) -> list:
        x, y = _tokens(self.spec, m, step, self.device)
        losses: list = []
        kwargs: dict[str, Any] = {}
        if "return_outputs" in inspect.signature(sched.step).parameters:
            kwargs["return_outputs"] = False  # don't keep M x logits on the last stage
        args = (x,) if self.holds_first else ()
        if self.holds_last:
            kwargs.update(target=y, losses=losses)
        sched.step(*args, **kwargs)
        return losses

    def reference_grads(self, m: int, step: int) -> list[float]:
        """Single-process forward/backward of the whole model over the same M microbatches."""
        x, y = _tokens(self.spec, m, step, self.device)
        mbs = self.spec.micro_batch_size
        losses = []
        for i in range(m):
            loss = _cross_entropy(self.ref(x[i * mbs:(i + 1) * mbs]), y[i * mbs:(i + 1) * mbs])
            (loss / m).backward()  # what the schedules' scale_grads=True does to the stage grads
            losses.append(loss.detach())
        return losses

    def sync(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()

    def barrier(self) -> None:
        self.sync()
        self.torch.distributed.barrier()

    # -- phases ---------------------------------------------------------------------------
    def check(self, m: int, sched) -> dict:
        """Pipeline vs single process on one batch, no optimizer step; grads zeroed after.

        Also the schedule's first step (stage shape inference, allocator warm-up), so the
        timing phase may run without further warm-up steps.
        """
        self.ctx.phase(f"correctness M={m}")
        self.optimizer.zero_grad(set_to_none=True)
        self.ref_optimizer.zero_grad(set_to_none=True)
        losses = self.pipeline_step(sched, m, step=-1)
        ref_losses = self.reference_grads(m, step=-1)
        ref_params = dict(self.ref.named_parameters())
        grad_rel, compared = 0.0, 0
        for c, mod in self.modules.items():
            for name, p in mod.named_parameters():
                rg = ref_params[self.name_map[c][name]].grad
                if p.grad is None or rg is None:
                    raise RuntimeError(f"rank {self.ctx.rank} chunk {c}: no gradient for {name}")
                scale = rg.abs().max().clamp_min(1e-12)
                grad_rel = max(grad_rel, float(((p.grad.float() - rg.float()).abs().max() / scale.float())))
                compared += 1
        out = {"m": m, "grad_max_rel_diff": grad_rel, "params_compared": compared,
               "loss_max_abs_diff": None, "losses": None}
        if self.holds_last:
            if len(losses) != m:
                raise RuntimeError(f"pipeline returned {len(losses)} losses for M={m}")
            diffs = [abs(float(a) - float(b)) for a, b in zip(losses, ref_losses)]
            out["loss_max_abs_diff"] = max(diffs)
            out["losses"] = [float(v) for v in losses]
        self.optimizer.zero_grad(set_to_none=True)
        self.ref_optimizer.zero_grad(set_to_none=True)
        self.timer.reset()
        return out

    def reference_step(self, m: int, step: int) -> float | None:
        """PP=1 step on rank 0 (others wait); its wall seconds, or None on other ranks."""
        self.barrier()
        elapsed = None
        if self.ctx.rank == 0:
            t0 = timing.now()
            self.reference_grads(m, step)
            self.ref_optimizer.step()
            self.ref_optimizer.zero_grad(set_to_none=True)
            elapsed = timing.now(self.ctx.device) - t0
        self.barrier()
        return elapsed

    def timed(self, m: int, sched) -> dict:
        spec = self.spec
        rec: dict[str, Any] = {"m": m, "busy_s": [], "cpu_busy_s": [], "fwd_s": [], "bwd_s": [],
                               "sched_s": [], "step_s": [], "chunk_calls": [], "loss": [], "ref_step_s": []}
        for step in range(spec.warmup_steps + spec.measured_steps):
            measured = step >= spec.warmup_steps
            self.ctx.phase(f"M={m} step {step} ({'measured' if measured else 'warm-up'})")
            ref_s = self.reference_step(m, step) if spec.single_process_reference else None
            self.timer.reset()
            self.barrier()
            t0 = timing.now()
            losses = self.pipeline_step(sched, m, step)
            t1 = timing.now(self.ctx.device)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            t2 = timing.now(self.ctx.device)
            if not measured:
                continue
            by_kind = self.timer.seconds_by_kind()
            rec["fwd_s"].append(by_kind.get("forward", 0.0))
            rec["bwd_s"].append(by_kind.get("backward", 0.0))
            rec["busy_s"].append(self.timer.busy_s())
            rec["cpu_busy_s"].append(self.timer.cpu_busy_s())
            rec["chunk_calls"].append(sum(self.timer.calls_by_kind().values()))
            rec["sched_s"].append(t1 - t0)
            rec["step_s"].append(t2 - t0)
            if ref_s is not None:
                rec["ref_step_s"].append(ref_s)
            if self.holds_last:
                rec["loss"].append(float(sum(float(v) for v in losses) / len(losses)))
        return rec


def run_many(specs: tuple[TorchPipelineSpec, ...], ctx) -> list[dict]:
    """Worker entry point for several specs of one PP degree, one after the other.

    Starting ranks costs seconds of CPU each (imports); on a 2-core CI machine one launch
    for all schedules of a PP degree saves most of that. Each spec builds its own model
    and stages, so the runs share nothing but the process group.
    """
    import torch

    results = []
    for spec in specs:
        results.append(run(spec, ctx))
        torch.distributed.barrier()
    return results


def run(spec: TorchPipelineSpec, ctx) -> dict:
    """Worker entry point (inside :func:`perfgate.launch.jobs.launch`); returns this rank's raw results."""
    import torch

    if ctx.world_size != spec.world_size:
        raise ValueError(f"spec wants {spec.world_size} ranks (one per pipeline stage), launched with {ctx.world_size}")
    torch.manual_seed(spec.seed)
    worker = _Worker(spec, ctx)
    # One schedule (and stage) per M, kept from the correctness step through the timing, so
    # that the check is the schedule's first step; all checks run before any optimizer step.
    schedules = {m: worker.schedule(m) for m in spec.microbatches}
    checks = [worker.check(m, schedules[m]) for m in spec.microbatches] if spec.check_correctness else []
    if not (spec.single_process_reference and ctx.rank == 0):
        worker.ref = worker.ref_optimizer = None  # only rank 0 times the PP=1 reference
    runs = [worker.timed(m, schedules[m]) for m in spec.microbatches]
    return {"rank": ctx.rank, "chunks": worker.chunk_ids, "chunk_params": worker.chunk_params,
            "device": str(ctx.device), "torch": torch.__version__, "checks": checks, "runs": runs}
