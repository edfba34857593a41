"""TP x PP x DP (x CP) meshes built with DeviceMesh on real gloo groups of 8, 4 and 2 ranks.

For random layouts (degrees and the order of the dimensions), every rank sits where the layout puts
it and every group of every dimension passes the group-sum oracle (all_reduce, two same-shaped calls
each its own; all_gather; reduce_scatter; send/recv along PP). A rank that issues two same-shaped
all_reduces of one dimension in the opposite order is stopped by the order guard on every rank of its
group, before any data moves (seed report §16.8: unguarded, they mix silently).

Layouts are drawn here and shipped to one warm group of ranks per world size, so each layout costs a
mesh build and a few collectives, not a launch (correctness/rankpool.py).
"""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from correctness.hypothesis_settings import distributed
from correctness.mesh_properties import mesh_cases, run_group_sums, run_reorder

pytestmark = pytest.mark.cpu

# Examples per world size: 8 ranks is the seed's TP2 x PP2 x DP2 world and has the most layouts.
GROUP_SUM_EXAMPLES = {8: 40, 4: 12, 2: 5}  # 40 draws of 8 ranks: 21-35 distinct layouts over 300 seeds
MIN_DISTINCT_8_RANK_LAYOUTS = 20


@pytest.mark.parametrize("world_size", [8, 4, 2], ids=lambda w: f"world={w}")
def test_every_group_of_every_mesh_dimension_passes_the_group_sum(rank_pools, world_size):
    layouts = set()
    settings = distributed(GROUP_SUM_EXAMPLES[world_size])

    @settings
    @given(case=mesh_cases(world_size))
    def group_sums(case):
        layouts.add((case.layout.mesh_dims, case.layout.mesh_shape))
        run_group_sums(rank_pools, case)

    group_sums()
    if world_size == 8 and settings.max_examples >= GROUP_SUM_EXAMPLES[8]:  # the coverage claimed, counted
        assert len(layouts) >= MIN_DISTINCT_8_RANK_LAYOUTS, sorted(layouts)


@pytest.mark.parametrize("world_size", [8, 4], ids=lambda w: f"world={w}")
@distributed(10)
@given(data=st.data())
def test_mesh_order_mismatch_is_stopped_before_any_data_moves(rank_pools, world_size, data):
    run_reorder(rank_pools, data.draw(mesh_cases(world_size, reorder=True), label="case"))
