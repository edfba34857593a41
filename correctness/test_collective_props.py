"""Collectives on real gloo groups for random shapes (0-d to 3-d, empty included), eight dtypes
and world sizes 2-4: all_reduce is the sum (exact for integers, within the dtype's error for
floats, identical bits on every rank), reduce_scatter + all_gather equals all_reduce, and a
broadcast from any root leaves the root's tensor, bit for bit, on every rank.
"""
import pytest
from hypothesis import given

from correctness.collective_properties import collective_cases, run_and_check
from correctness.hypothesis_settings import distributed

pytestmark = pytest.mark.cpu


@distributed(100)
@given(case=collective_cases("all_reduce"))
def test_all_reduce_equals_the_sum_of_inputs(rank_pools, case):
    run_and_check(rank_pools, case)


@distributed(100)
@given(case=collective_cases("rs_ag"))
def test_reduce_scatter_then_all_gather_equals_all_reduce(rank_pools, case):
    run_and_check(rank_pools, case)


@distributed(100)
@given(case=collective_cases("broadcast"))
def test_broadcast_from_any_root_gives_the_roots_tensor(rank_pools, case):
    run_and_check(rank_pools, case)
