"""DDP: strong and weak scaling, micro-batch, bucket-cap, accumulation and comm-hook sweeps.

Seed report §5 (8x V100 PCIe, 110M GPT): strong scaling 2.82x on 8 GPUs (35.3 %), weak
scaling 26.5 %, bucket caps within 2 %, micro-batch 1 -> 8 lifting 8-GPU weak efficiency
from 31.9 % to 51.2 %. Here: gloo on CPU with a tiny GPT (world 1/2/4), NCCL on GPUs
with the seed's 110M model. Speedups and efficiencies compare with world 1 measured in
this same session and are what CI gates on (with the CPU tolerances of
baselines/cpu-*/tolerances.toml); tokens/s, step time and memory are recorded.

Cases: perfgate.workloads.training (``cases``, ``measure``); the checks (finite losses, the
same trajectory as world 1, all-reduce counts) and the records of each test: its ``records``.
"""
from __future__ import annotations

import pytest
import torch

from fixtures.cases import parametrize, record
from perfgate.workloads.training import AREA
from perfgate.workloads.training.model import CONFIGS, GPT, SEED_PARAM_COUNTS


@pytest.mark.cpu
@pytest.mark.parametrize("name", sorted(SEED_PARAM_COUNTS))
def test_model_matches_seed_param_count(name):
    """The GPU configs are the seed's models: same parameter count, built on the meta device."""
    with torch.device("meta"):
        model = GPT(CONFIGS[name])
    assert sum(p.numel() for p in model.parameters()) == SEED_PARAM_COUNTS[name] == CONFIGS[name].n_params


@parametrize(AREA, "strong")
def test_ddp_strong_scaling(perf, runs, case):
    """Fixed global batch; world N accumulates global/(micro x N) micro-batches per step."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "weak")
def test_ddp_weak_scaling(perf, runs, case):
    """Fixed local batch; efficiency = aggregate tokens/s over N x world-1 tokens/s."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "microbatch")
def test_ddp_microbatch(perf, runs, case):
    """One all-reduce per step amortised over more tokens; activation memory grows with it."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "bucket")
def test_ddp_bucket_cap(perf, runs, case):
    """Smaller buckets: more all-reduce calls, earlier overlap; tokens/s relative to the reference cap."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "accumulation")
def test_ddp_grad_accumulation(perf, runs, case):
    """Accumulating under no_sync() all-reduces once per step instead of once per micro-batch."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "comm_hook")
def test_ddp_comm_hook(perf, runs, case):
    """Gradient compression hooks (fp16/bf16) against the fp32 all-reduce hook, same buckets."""
    record(perf, AREA.run(runs, case))
