"""Megatron-Core pipeline worker: non-interleaved 1F1B and interleaved 1F1B, several M per launch.

The schedule is Megatron's own ``get_forward_backward_func()`` (the seed report's §8 setup:
TP=1, DP=1, one GPU per stage, microbatch size 2). Busy time per stage comes from
Megatron's own instrumentation points: ``config.timers`` is set to a
:class:`~perfgate.workloads.pipeline.chunk_timer.ChunkTimer`, whose 'forward-compute' and
'backward-compute' brackets (started and stopped by ``schedules.forward_step`` /
``backward_step`` around every chunk computation) record CUDA events; nothing of Megatron
is wrapped or patched. The 'forward-recv', 'backward-send-forward-recv', ... brackets are
P2P waits and are returned separately for diagnosis.

Per M: ``warmup_steps`` discarded optimizer steps, then ``measured_steps`` samples. Raw per-
iteration timings come back in the same shape as torch_pp's, for ``series.series_by_m``.
PP=1 (``pp=1``) runs ``forward_backward_no_pipelining`` on one GPU: the speedup reference.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from perfgate.workloads.pipeline.layout import ParallelLayout, pipeline_layouts
from perfgate.workloads.pipeline.megatron_common import MIN_MEASURED_STEPS, PP_MODEL, MegatronModel


@dataclass(frozen=True)
class MegatronPipelineSpec:
    pp: int
    schedule: str = "1f1b"                # "1f1b" | "interleaved-1f1b"
    model: MegatronModel = PP_MODEL
    microbatches: tuple[int, ...] = (1, 4, 16)
    virtual_stages: int = 1
    micro_batch_size: int = 2
    warmup_steps: int = 2
    measured_steps: int = 6
    seed: int = 1234
    layouts: tuple[ParallelLayout, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.microbatches or len(set(self.microbatches)) != len(self.microbatches):
            raise ValueError(f"microbatches must be distinct values, got {self.microbatches}")
        if self.measured_steps < MIN_MEASURED_STEPS or self.warmup_steps < 1:
            raise ValueError(f"need warmup_steps >= 1 and measured_steps >= {MIN_MEASURED_STEPS}, got "
                             f"{self.warmup_steps}, {self.measured_steps}")
        object.__setattr__(self, "layouts", pipeline_layouts(self, "megatron", self.model.num_layers))

    @property
    def world_size(self) -> int:
        return self.pp

    @property
    def tokens_per_microbatch(self) -> int:
        return self.micro_batch_size * self.model.seq_len


def run_many(specs: tuple[MegatronPipelineSpec, ...], ctx) -> list[dict]:
    """Several specs of one PP degree in one launch (Megatron's groups are rebuilt for each)."""
    import gc

    import torch

    results = []
    for spec in specs:
        results.append(run(spec, ctx))
        gc.collect()
        torch.cuda.empty_cache()
        torch.distributed.barrier()
    return results


def run(spec: MegatronPipelineSpec, ctx) -> dict:
    """Worker entry point: this rank's raw per-M timings (see module docstring)."""
    import torch

    from perfgate.workloads.pipeline import megatron_common as mc
    from perfgate.workloads.pipeline.chunk_timer import MEGATRON_BUSY, ChunkTimer

    if ctx.device.type != "cuda":
        raise RuntimeError("Megatron-Core schedules need CUDA (they allocate with device='cuda')")
    if ctx.world_size != spec.world_size:
        raise ValueError(f"spec wants {spec.world_size} ranks, launched with {ctx.world_size}")
    layout = spec.layouts[0]
    ctx.phase("megatron init")
    mc.init_parallel(layout, spec.seed)
    timer = ChunkTimer(cuda=True)
    trainer = mc.build_trainer(spec.model, layout, recompute=False, timers=timer)
    runs = []
    for m in spec.microbatches:
        rec = {"m": m, "busy_s": [], "fwd_s": [], "bwd_s": [], "p2p_s": [], "sched_s": [], "step_s": [],
               "chunk_calls": [], "loss": [], "unpaired_timer_stops": 0}
        for step in range(spec.warmup_steps + spec.measured_steps):
            measured = step >= spec.warmup_steps
            ctx.phase(f"M={m} step {step} ({'measured' if measured else 'warm-up'})")
            batches = mc.synthetic_microbatches(spec.model, spec.micro_batch_size, m, step, spec.seed)
            mc.barrier()
            timer.reset()
            losses, sched_s, step_s = mc.train_step(trainer, batches, seq_len=spec.model.seq_len,
                                                    micro_batch_size=spec.micro_batch_size)
            if losses and not all(math.isfinite(v) for v in losses):
                raise RuntimeError(f"non-finite loss at M={m} step {step}: {losses}")
            if not measured:
                continue
            by_name = timer.seconds_by_kind()
            calls = timer.calls_by_kind()
            rec["fwd_s"].append(by_name.get("forward-compute", 0.0))
            rec["bwd_s"].append(by_name.get("backward-compute", 0.0))
            rec["busy_s"].append(timer.busy_s(MEGATRON_BUSY))
            rec["p2p_s"].append(sum(s for k, s in by_name.items() if "send" in k or "recv" in k))
            rec["chunk_calls"].append(sum(calls.get(k, 0) for k in MEGATRON_BUSY))
            rec["sched_s"].append(sched_s)
            rec["step_s"].append(step_s)
            rec["unpaired_timer_stops"] += timer.unpaired
            if losses:
                rec["loss"].append(sum(losses) / len(losses))
        runs.append(rec)
    chunks = layout.rank_chunks(ctx.rank)
    # Parameters per rank (all its chunks together; series.stage_params sums chunk_params).
    result = {"rank": ctx.rank, "chunks": chunks, "chunk_params": {chunks[0]: trainer.params_local},
              "device": torch.cuda.get_device_name(), "torch": torch.__version__,
              "megatron_core": _megatron_version(),
              "peak_alloc_gib": torch.cuda.max_memory_allocated() / 2**30, "runs": runs}
    mc.destroy_parallel()
    return result


def _megatron_version() -> str:
    try:
        from megatron.core import package_info

        return package_info.__version__
    except Exception:  # noqa: BLE001 - a version string is informative only
        return "unknown"
