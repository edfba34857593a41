"""MoE dispatch + combine over variable-split all_to_all_single on real gloo groups.

For any split matrix (zeros, skew, one hot expert rank, random) on 2, 3 and 4 ranks, one or two experts
per rank: the received counts are the transposed send counts, tokens are conserved, every token reaches
the expert it was routed to and comes back to its origin in its original position. The data path is
perfgate.workloads.moe.alltoall, the one the MoE perf step times.
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from correctness.alltoall_properties import routings, run_and_check
from correctness.hypothesis_settings import distributed

pytestmark = pytest.mark.cpu


@pytest.mark.parametrize("world_size", [2, 3, 4], ids=lambda w: f"world={w}")
@distributed(50)
@given(data=st.data())
def test_dispatch_then_combine_returns_every_token_to_its_origin_in_order(rank_pools, world_size, data):
    routing = data.draw(routings(world_size), label="routing")
    run_and_check(rank_pools, routing)
