"""Checkpoint properties: exact round trip, crash at any point, corruption refused, DCP reshard.

The protocol under test is correctness.systems.checkpoint (shards + SHA256 manifest, atomic
publish); the reshard property uses torch.distributed.checkpoint on real gloo groups.
Every example works in its own folder on the real disk.
"""
import pytest
from hypothesis import example, given

from correctness.checkpoint_properties import (
    check_corruption, check_crash, check_dcp_reshard, check_round_trip, corruption_cases, crash_cases,
    dcp_cases, train_cases,
)
from correctness.dcp_cases import DcpCase, TensorSpec
from correctness.hypothesis_settings import distributed

pytestmark = pytest.mark.cpu


@distributed(25)
@given(case=train_cases())
def test_round_trip_restores_model_optimizer_rng_and_cursor_bitwise(case):
    check_round_trip(case)


@distributed(60)
@given(case=crash_cases())
def test_crash_at_any_point_of_a_save_leaves_a_complete_latest(case):
    check_crash(case)


@distributed(50)
@given(case=corruption_cases())
def test_flipped_truncated_or_missing_file_is_refused_naming_it(case):
    check_corruption(case)


_UNEVEN = (TensorSpec("w", (5, 3), "float32", save_placement=0, load_placement=1),
           TensorSpec("b", (7,), "bfloat16", save_placement=0, load_placement=-1),
           TensorSpec("step", (1,), "int64", save_placement=-1, load_placement=0))


@distributed(12)
@given(case=dcp_cases())
@example(case=(4, 2, DcpCase(path="", tensors=_UNEVEN, seed=1)))
@example(case=(2, 4, DcpCase(path="", tensors=_UNEVEN, seed=2)))
def test_dcp_save_on_n_ranks_load_on_m_gives_identical_full_tensors(rank_pools, case):
    save_world, load_world, dcp_case = case
    check_dcp_reshard(rank_pools, save_world, load_world, dcp_case)
