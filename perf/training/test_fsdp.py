"""FSDP memory and throughput against DDP, with the gradient reduce dtype held equal.

Seed report §6 (8x V100 PCIe, 368M GPT, micro-batch 1): DDP fp32 comm 5,274 tok/s at
6.49 GiB; DDP fp16 hook 8,280; SHARD_GRAD_OP 10,009 tok/s at 1.55 GiB (-76 %);
FULL_SHARD 7,704 tok/s at 1.06 GiB. Here every FSDP mode (FSDP1 SHARD_GRAD_OP /
FULL_SHARD, FSDP2 with and without reshard-after-forward) is compared with DDP reducing
in the same dtype, in the same launch.

Memory: torch's MemTracker / FSDPMemTracker give the peak per rank and its breakdown on
CPU and GPU (deterministic: the saving ratio is the CPU gate); GPUs add
``torch.cuda.max_memory_allocated`` per step. Setting PERFGATE_TEST_MUTATION=extra_param_copy
(TEST-ONLY, see docs/training.md) keeps a full extra parameter copy alive on every rank,
which makes test_fsdp_memory fail with verdict ``regression``. Cases, checks and records:
perfgate.workloads.training (``cases``, ``measure``, ``records``).

Step anatomy (seed §16.9; docs/training.md): block-level against root-only wrapping, and FSDP1
backward prefetch on against off, measured in the same launch; the all-gathers, reduce-scatters
and prefetched all-gathers of a step are checked exactly against counts computed from the wrapped
units (perfgate.workloads.training.anatomy).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.training import AREA


@parametrize(AREA, "fsdp_memory")
def test_fsdp_memory(perf, runs, case):
    """Peak memory per rank by category, and the saving against DDP (fp32 reduce). The DDP case itself
    gates nothing on the CPU machine: it is the reference of the others' savings, and its own
    figures are absolute (GiB, gated on GPU hardware ids)."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "fsdp_throughput")
def test_fsdp_throughput(perf, runs, case):
    """tokens/s against DDP with the same reduce dtype; losses must match DDP's. The fp32 DDP case
    gates nothing on the CPU machine: it is the reference of the others' ratios (its tokens/s is
    absolute, gated on GPU hardware ids)."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "fsdp_wrap")
def test_fsdp_wrap_policy(perf, runs, case):
    """Each GPTBlock its own FSDP unit against the root alone (seed §16.9): the tracker peak of block
    wrapping over root wrapping, and the exact all-gathers and reduce-scatters per step of both."""
    record(perf, AREA.run(runs, case))


@parametrize(AREA, "fsdp_prefetch")
def test_fsdp_backward_prefetch(perf, runs, case):
    """FSDP1 BACKWARD_PRE against no backward prefetch (seed §16.9): the prefetched all-gathers per
    step (exact) and the throughput ratio, paired step by step (interleaved on CPU)."""
    record(perf, AREA.run(runs, case))
