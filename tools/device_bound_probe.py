"""Does this training step measure the GPU? Step time against micro-batch, and the device-busy share.

    python tools/device_bound_probe.py --model gpt-1.3b --micro-batches 1,2,4,8
    python tools/device_bound_probe.py --engine fsdp --model gpt-1.3b-untied --micro-batches 2
    PERFGATE_TEST_MUTATION=gpu_step_slowdown:0.10 python tools/device_bound_probe.py --model gpt-1.3b --micro-batches 4

Runs the real DDP (or FSDP) engine of perf/training at world 1 through perfgate's launcher and
prints, per case: the median step time, tokens/s, the device's busy time per step and its share
of the step (perfgate.workloads.device_time). A step whose time grows in proportion to its
tokens, with a busy share >= 0.9, measures the GPU; one that stays flat measures the host.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.launch.jobs import launch  # noqa: E402
from perfgate.workloads.training.specs import DDPCase, DDPJob, FSDPJob, Schedule, ShardingMode  # noqa: E402
from perfgate.workloads.training import by_case  # noqa: E402
from perfgate.workloads.training.summary import summarize_case  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--engine", choices=("ddp", "fsdp"), default="ddp")
    ap.add_argument("--model", default="gpt-1.3b")
    ap.add_argument("--micro-batches", default="1,2,4,8")
    ap.add_argument("--fsdp-kinds", default="ddp,fsdp1-FULL_SHARD,fsdp2-reshard")
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--backend", default="nccl", help="gloo runs it on CPU (no device time): a check of the tool")
    ap.add_argument("--save", type=Path)
    args = ap.parse_args(argv)
    schedule = Schedule(warmup_steps=3, measured_steps=max(5, args.steps), profiled_steps=5,
                        tracked_steps=5 if args.engine == "fsdp" else 0)  # FSDP jobs always track memory
    amp = "bf16" if args.backend == "nccl" else "none"
    mbs = [int(x) for x in args.micro_batches.split(",")]
    if args.engine == "ddp":
        job = DDPJob(model=args.model, world_size=1, backend=args.backend, amp=amp,
                     schedule=schedule,
                     cases=tuple(DDPCase(f"mb{m}", micro_batch=m) for m in mbs))
    else:
        modes = tuple(ShardingMode(k, "fp32") for k in args.fsdp_kinds.split(","))
        job = FSDPJob(model=args.model, world_size=1, backend=args.backend, amp=amp,
                     schedule=schedule,
                      modes=modes, micro_batch=mbs[0])
    per_case = by_case(launch(f"perfgate.workloads.training.{args.engine}:run", job, world_size=1,
                              backend=args.backend, timeout_s=900))
    got = {label: summarize_case(ranks) for label, ranks in per_case.items()}
    rows = []
    print(f"{'case':<28}{'step ms':>10}{'tok/s':>12}{'device ms':>11}{'busy':>7}")
    for label, s in got.items():
        row = {"case": label, "step_ms": statistics.median(s.step_ms), "tokens_per_s": statistics.median(s.tokens_per_s),
               "device_ms": statistics.median(s.device_ms) if s.device_ms else None,
               "busy": statistics.median(s.device_busy_fraction) if s.device_busy_fraction else None,
               "peak_alloc_gib": max(s.peak_alloc_gib) if s.peak_alloc_gib else None,
               "step_ms_all": s.step_ms, "device_ms_all": s.device_ms, "busy_all": s.device_busy_fraction}
        rows.append(row)
        dev = f"{row['device_ms']:.2f}" if row["device_ms"] is not None else "-"
        busy = f"{row['busy']:.3f}" if row["busy"] is not None else "-"
        print(f"{label:<28}{row['step_ms']:>10.2f}{row['tokens_per_s']:>12,.0f}{dev:>11}{busy:>7}")
    if args.save:
        args.save.write_text(json.dumps({"model": args.model, "engine": args.engine, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
