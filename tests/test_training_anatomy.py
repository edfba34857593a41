"""The step-anatomy rules (perfgate.workloads.training.anatomy) against torch's own code and the seed.

The perf tests assert collective counts exactly against these rules, so the rules themselves are
checked here: DDP's bucketing against torch's ``_compute_bucket_assignment_by_size`` (the function
the C++ reducer rebuilds its buckets with), the FSDP counts against the seed's 25 / 13 at 12
blocks, the prefetch count against logged sequences of real FSDP1 steps.
"""
from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from perfgate.workloads.training import AREA
from perfgate.workloads.training.anatomy import (BACKWARD, MIB, count_collectives, ddp_allreduces_per_step,
                                                 ddp_buckets, exposed_comm_s, fsdp_collectives,
                                                 prefetched_all_gathers)
from perfgate.workloads.training.ddp import grad_bytes_in_ready_order
from perfgate.workloads.training.model import CONFIGS, GPT
from perfgate.workloads.training.specs import ShardingMode, SpecError


def _meta_model(name: str) -> GPT:
    with torch.device("meta"):
        return GPT(CONFIGS[name])


@pytest.mark.parametrize("name", ["gpt-tiny", "gpt-tiny-untied", "gpt-110m"])
@pytest.mark.parametrize("cap_mb", [0.25, 1.0, 4.0, 25.0, 100.0])
def test_ddp_buckets_match_torchs_assignment(name, cap_mb):
    """Same buckets as torch's reducer code computes for the same gradients in the same order."""
    params = list(reversed(list(_meta_model(name).parameters())))
    torch_buckets, _ = dist._compute_bucket_assignment_by_size(params, [int(cap_mb * MIB)], [False] * len(params),
                                                              list(range(len(params))))
    sizes = [p.numel() * p.element_size() for p in params]
    assert ddp_buckets(sizes, cap_mb) == [sum(sizes[i] for i in bucket) for bucket in torch_buckets]


def test_ddp_default_cap_has_a_small_first_bucket():
    """bucket_cap_mb=None: the first bucket closes at 1 MiB, the rest at 25 MiB; an explicit cap is
    also the first bucket's. A cap is a target: a bucket ends at the first gradient that reaches it."""
    assert ddp_buckets([MIB // 2, MIB // 2, MIB, 30 * MIB], None) == [MIB, 31 * MIB]
    assert ddp_buckets([MIB // 2, MIB // 2, MIB, 30 * MIB], 25.0) == [32 * MIB]
    assert ddp_buckets([MIB, 3], 0.25) == [MIB, 3]


def test_seed_counts():
    """§5.7: the 110M model reduces in 13 buckets; §16.2: 8 micro-batches without no_sync() are
    8 x 13 = 104 all-reduces a step, 13 with it; §16.9: FSDP1 FULL_SHARD at 12 blocks, 25 / 13."""
    buckets = ddp_buckets(grad_bytes_in_ready_order(_meta_model("gpt-110m")), 25.0)
    assert len(buckets) == 13
    assert ddp_allreduces_per_step(13, 8, no_sync=False) == 104
    assert ddp_allreduces_per_step(13, 8, no_sync=True) == 13
    seed = fsdp_collectives("fsdp1-FULL_SHARD", wrapped_blocks=12, backward_prefetch=True)
    assert (seed.all_gather, seed.reduce_scatter, seed.prefetched_all_gathers) == (25, 13, 11)
    root = fsdp_collectives("fsdp1-FULL_SHARD", wrapped_blocks=0, backward_prefetch=True)
    assert (root.all_gather, root.reduce_scatter, root.prefetched_all_gathers) == (1, 1, 0)
    assert fsdp_collectives("fsdp2-reshard", wrapped_blocks=8, backward_prefetch=True).prefetched_all_gathers is None
    with pytest.raises(ValueError, match="no collective rule"):
        fsdp_collectives("ddp", wrapped_blocks=8, backward_prefetch=True)


# Rank 0's logged collectives of one FSDP1 FULL_SHARD step of gpt-tiny-untied (8 blocks) on gloo.
AG, RS = "c10d::allgather_", "c10d::_reduce_scatter_base_"
FORWARD = [AG] * 9
WITH_PREFETCH = FORWARD + [BACKWARD, AG, AG, RS] + [AG, RS] * 6 + [RS, RS]
WITHOUT_PREFETCH = FORWARD + [BACKWARD, AG, RS] + [AG, RS] * 7 + [RS]


def test_prefetched_all_gathers_of_logged_steps():
    assert count_collectives(WITH_PREFETCH) == count_collectives(WITHOUT_PREFETCH) == {
        "all_gather": 17, "reduce_scatter": 9, "all_reduce": 0}
    assert prefetched_all_gathers(WITH_PREFETCH) == 7 == fsdp_collectives(
        "fsdp1-FULL_SHARD", wrapped_blocks=8, backward_prefetch=True).prefetched_all_gathers
    assert prefetched_all_gathers(WITHOUT_PREFETCH) == 0
    with pytest.raises(ValueError, match="no backward marker"):
        prefetched_all_gathers(FORWARD)


def test_exposed_comm_is_the_tail_after_the_last_bucket_plus_blocking():
    assert exposed_comm_s([1.0, 2.0], [1.5, 2.25], blocked_s=0.0) == pytest.approx(0.25)
    assert exposed_comm_s([1.0, 2.0], [1.5, 1.9], blocked_s=0.1) == pytest.approx(0.1)  # all hidden
    assert exposed_comm_s([], [], blocked_s=0.0) == 0.0  # a no_sync() micro-batch


def test_anatomy_modes_are_validated_and_kept_out_of_the_old_cases():
    with pytest.raises(SpecError, match="FSDP1 only"):
        ShardingMode("fsdp2-reshard", backward_prefetch=False)
    with pytest.raises(SpecError, match="DDP has no wrap policy"):
        ShardingMode("ddp", wrap="root")
    assert ShardingMode("fsdp1-FULL_SHARD", wrap="root").label == "fsdp1-FULL_SHARD-fp32reduce-rootwrap"
    old = [c for kind in ("fsdp_memory", "fsdp_throughput") for c in AREA.all_cases(kind)]
    assert old and not any("rootwrap" in c.id or "noprefetch" in c.id for c in old)
    wrap = AREA.all_cases("fsdp_wrap")
    assert wrap and all(c.values.world > 1 and c.values.reads[0].endswith("-rootwrap") for c in wrap)
