"""Megatron-Core tensor/sequence parallelism and full activation recompute worker (GPU only).

The seed report's §7 experiments on a fixed GPU budget: every case trains the same GPT with
the same global batch (16 sequences, microbatch 2, gradient accumulation = 16 / (2 x DP)),
changing only (TP, DP), sequence parallelism, and full recompute. All cases of a spec run in
one launch, one after the other, so throughput and memory ratios between them are measured
in one run on the same GPUs: Megatron's process groups are torn down and rebuilt when TP
changes (``destroy_model_parallel`` + ``initialize_model_parallel``, as Megatron's own tests do).

Per case: ``warmup_steps`` steps, then ``measured_steps`` steps; each measured step is one
sample of step time (-> tokens/s over the global batch) and of peak allocated memory (the
peak counter is reset before every measured step, so a sample is that step's peak: weights,
grads and optimizer state that persist, plus the step's activations).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfgate.workloads.pipeline.layout import ParallelLayout
from perfgate.workloads.pipeline.megatron_common import MIN_MEASURED_STEPS, TP_MODEL, MegatronModel


@dataclass(frozen=True)
class TPCase:
    tp: int
    dp: int
    sequence_parallel: bool = False
    recompute: bool = False

    @property
    def name(self) -> str:
        return (f"tp{self.tp}-dp{self.dp}-sp_{'on' if self.sequence_parallel else 'off'}"
                f"-recompute_{'on' if self.recompute else 'off'}")


@dataclass(frozen=True)
class MegatronTPSpec:
    world_size: int
    cases: tuple[TPCase, ...]
    model: MegatronModel = TP_MODEL
    micro_batch_size: int = 2
    global_batch: int = 16
    warmup_steps: int = 3
    measured_steps: int = 6
    seed: int = 1234
    layouts: tuple[ParallelLayout, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.cases:
            raise ValueError("no cases")
        if len({c.name for c in self.cases}) != len(self.cases):
            raise ValueError(f"duplicate cases: {[c.name for c in self.cases]}")
        if self.measured_steps < MIN_MEASURED_STEPS or self.warmup_steps < 1:
            raise ValueError(f"need warmup_steps >= 1 and measured_steps >= {MIN_MEASURED_STEPS}, got "
                             f"{self.warmup_steps}, {self.measured_steps}")
        layouts = []
        for case in self.cases:
            per_step = self.micro_batch_size * case.dp
            if self.global_batch % per_step:
                raise ValueError(f"{case.name}: global batch {self.global_batch} is not a multiple of "
                                 f"micro_batch_size {self.micro_batch_size} x dp {case.dp} = {per_step}")
            self.model.check_tp(case.tp)
            layouts.append(ParallelLayout(world_size=self.world_size, tp=case.tp, dp=case.dp, pp=1,
                                          microbatches=self.global_batch // per_step, engine="megatron",
                                          schedule="1f1b", num_layers=self.model.num_layers,
                                          sequence_parallel=case.sequence_parallel))
        object.__setattr__(self, "layouts", tuple(layouts))

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.model.seq_len


def run(spec: MegatronTPSpec, ctx) -> dict:
    """Worker entry point: per case, per measured step, step seconds and peak GiB on this rank."""
    import gc

    import torch

    from perfgate.workloads.pipeline import megatron_common as mc

    if ctx.device.type != "cuda":
        raise RuntimeError("Megatron-Core needs CUDA")
    if ctx.world_size != spec.world_size:
        raise ValueError(f"spec wants {spec.world_size} ranks, launched with {ctx.world_size}")
    results = []
    current_tp = None
    for case, layout in zip(spec.cases, spec.layouts):
        if layout.tp != current_tp:
            if current_tp is not None:
                mc.destroy_parallel()
            ctx.phase(f"{case.name}: megatron init")
            mc.init_parallel(layout, spec.seed)
            current_tp = layout.tp
        ctx.phase(f"{case.name}: build")
        trainer = mc.build_trainer(spec.model, layout, recompute=case.recompute, timers=None)
        rec = {"case": case.name, "tp": case.tp, "dp": case.dp, "sequence_parallel": case.sequence_parallel,
               "recompute": case.recompute, "microbatches": layout.microbatches,
               "params_local": trainer.params_local, "step_s": [], "peak_alloc_gib": [], "loss": []}
        for step in range(spec.warmup_steps + spec.measured_steps):
            measured = step >= spec.warmup_steps
            ctx.phase(f"{case.name}: step {step} ({'measured' if measured else 'warm-up'})")
            # Each DP replica trains on its own data; TP ranks of one replica see the same batch.
            dp_rank = ctx.rank // case.tp  # Megatron's default order tp-cp-ep-dp-pp puts TP innermost
            batches = mc.synthetic_microbatches(spec.model, spec.micro_batch_size, layout.microbatches,
                                                step * 1000 + dp_rank, spec.seed)
            mc.barrier()
            if measured:
                torch.cuda.reset_peak_memory_stats()
            losses, _sched_s, step_s = mc.train_step(trainer, batches, seq_len=spec.model.seq_len,
                                                     micro_batch_size=spec.micro_batch_size)
            if losses and not all(math.isfinite(v) for v in losses):
                raise RuntimeError(f"{case.name}: non-finite loss at step {step}: {losses}")
            if measured:
                rec["peak_alloc_gib"].append(torch.cuda.max_memory_allocated() / 2**30)
                rec["step_s"].append(step_s)  # this rank's; the area's reduce takes the slowest
                if losses:
                    rec["loss"].append(sum(losses) / len(losses))
        results.append(rec)
        del trainer
        gc.collect()
        torch.cuda.empty_cache()
    mc.destroy_parallel()
    return {"rank": ctx.rank, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
            "cases": results}

