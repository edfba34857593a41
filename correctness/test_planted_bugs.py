"""Each property catches its planted bug, and hypothesis shrinks the failure to a minimal case.

A property that cannot fail proves nothing. For every property in this folder we switch on
a test-only fault in the system under test (a checkpoint writer that skips fsync, an
all-to-all that drops its last split, ...), ask ``hypothesis.find`` for a case that breaks
the property, and then check two things about the minimal case it returns: it does break
the property with the bug on, and it passes with the bug off, so the failure is the bug's
and not the case's. The minimal examples are printed and listed in the end-of-run summary
(docs/correctness.md keeps a copy).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

import pytest
from hypothesis import find
from hypothesis import strategies as st
from hypothesis.errors import NoSuchExample

from correctness import alltoall_properties as a2a
from correctness import checkpoint_properties as ckpt
from correctness import collective_properties as coll
from correctness import mesh_properties as mesh
from correctness.hypothesis_settings import planted
from correctness.property_violation import PropertyViolation

pytestmark = pytest.mark.cpu


@dataclass(frozen=True)
class Planted:
    bug: str
    prop: str  # the property (test) that must catch it
    strategy: Callable[[], Any]  # cases with the bug switched on
    check: Callable[[Any, Any], None]  # (rank_pools, case) -> raises PropertyViolation
    without_bug: Callable[[Any], Any]
    describe: Callable[[Any], str] = repr


def _no_bugs(case):
    return replace(case, bugs=frozenset())


def _describe_train(c: ckpt.TrainCase) -> str:
    return (f"widths={c.widths} {c.dtype} optimizer={c.optimizer} steps={c.steps} seed={c.seed} "
            f"buffer={c.buffer_values} cursor={dict(c.cursor)}")


def _describe_crash(c: ckpt.CrashCase) -> str:
    return f"{c.where()}; 4 shards of {c.payload_bytes} B"


def _describe_corruption(c: ckpt.CorruptionCase) -> str:
    sizes = {n: len(b) for n, b in c.shards}
    return f"{c.kind} {c.target} (offset {c.offset}, mask {c.mask:#04x}); shard sizes {sizes}"


def _describe_dcp(case) -> str:
    n, m, c = case
    tensors = ", ".join(f"{t.name} {t.dtype}{t.shape} {ckpt.placement_name(t.save_placement)}->"
                        f"{ckpt.placement_name(t.load_placement)}" for t in c.tensors)
    return f"save on {n} ranks, load on {m}: {tensors}"


def _describe_routing(r) -> str:
    return (f"world={r.world_size}, {r.experts_per_rank} expert(s) per rank, send counts {r.send_counts()}, "
            f"dest={r.dest}")


def _describe_collective(c) -> str:
    inputs = "; ".join(f"rank {r}: " + ", ".join(repr(a.tolist()) for a in arrays)
                       for r, arrays in enumerate(c.inputs))
    root = f", root={c.root}" if c.op == "broadcast" else ""
    return f"{c.op} world={c.world_size} {c.dtype}{root}; inputs {inputs}"


def _mesh_worlds():
    return st.sampled_from(mesh.WORLDS)


def _mesh_in_order(case):
    """The same mesh case with every rank issuing its collectives in the same order."""
    return replace(case, reorder_rank=None, reorder_dim=None)


def _pools_free(check):
    return lambda pools, case: check(case)


PLANTED = [
    Planted("drop_python_rng", "test_round_trip_restores_model_optimizer_rng_and_cursor_bitwise",
            lambda: ckpt.train_cases(frozenset({"drop_python_rng"})), _pools_free(ckpt.check_round_trip),
            _no_bugs, _describe_train),
    Planted("drop_optimizer_state", "test_round_trip_restores_model_optimizer_rng_and_cursor_bitwise",
            lambda: ckpt.train_cases(frozenset({"drop_optimizer_state"})), _pools_free(ckpt.check_round_trip),
            _no_bugs, _describe_train),
    Planted("skip_fsync", "test_crash_at_any_point_of_a_save_leaves_a_complete_latest",
            lambda: ckpt.crash_cases(frozenset({"skip_fsync"})), _pools_free(ckpt.check_crash),
            _no_bugs, _describe_crash),
    Planted("skip_rename", "test_crash_at_any_point_of_a_save_leaves_a_complete_latest",
            lambda: ckpt.crash_cases(frozenset({"skip_rename"})), _pools_free(ckpt.check_crash),
            _no_bugs, _describe_crash),
    Planted("skip_verify", "test_flipped_truncated_or_missing_file_is_refused_naming_it",
            lambda: ckpt.corruption_cases(frozenset({"skip_verify"})), _pools_free(ckpt.check_corruption),
            _no_bugs, _describe_corruption),
    Planted("assume_even_shards", "test_dcp_save_on_n_ranks_load_on_m_gives_identical_full_tensors",
            lambda: ckpt.dcp_cases(bug="assume_even_shards"),
            lambda pools, case: ckpt.check_dcp_reshard(pools, *case),
            lambda case: (case[0], case[1], replace(case[2], bug="")), _describe_dcp),
    Planted("drop_last_split", "test_dispatch_then_combine_returns_every_token_to_its_origin_in_order",
            lambda: st.sampled_from(coll.WORLDS).flatmap(lambda w: a2a.routings(w, drop_last_split=True)),
            a2a.run_and_check, lambda r: replace(r, drop_last_split=False), _describe_routing),
    Planted("reorder_on_last_rank", "test_all_reduce_equals_the_sum_of_inputs",
            lambda: coll.collective_cases("all_reduce", bug="reorder_on_last_rank"), coll.run_and_check,
            lambda c: replace(c, bug=""), _describe_collective),
    Planted("rotated_gather", "test_reduce_scatter_then_all_gather_equals_all_reduce",
            lambda: coll.collective_cases("rs_ag", bug="rotated_gather"), coll.run_and_check,
            lambda c: replace(c, bug=""), _describe_collective),
    Planted("root_ignored", "test_broadcast_from_any_root_gives_the_roots_tensor",
            lambda: coll.collective_cases("broadcast", bug="root_ignored"), coll.run_and_check,
            lambda c: replace(c, bug=""), _describe_collective),
    Planted("mesh_swapped_dims", "test_every_group_of_every_mesh_dimension_passes_the_group_sum",
            lambda: _mesh_worlds().flatmap(lambda w: mesh.mesh_cases(w, bug="swapped_dims")), mesh.run_group_sums,
            lambda c: replace(c, bug=""), mesh.describe),
    Planted("mesh_reordered_collectives", "test_every_group_of_every_mesh_dimension_passes_the_group_sum",
            lambda: _mesh_worlds().flatmap(lambda w: mesh.mesh_cases(w, reorder=True)), mesh.run_group_sums,
            _mesh_in_order, mesh.describe),
    Planted("mesh_reordered_unguarded", "test_every_group_of_every_mesh_dimension_passes_the_group_sum",
            lambda: _mesh_worlds().flatmap(lambda w: mesh.mesh_cases(w, reorder=True, guard=False)),
            mesh.run_group_sums, _mesh_in_order, mesh.describe),
    Planted("mesh_guard_keyed_by_shape", "test_mesh_order_mismatch_is_stopped_before_any_data_moves",
            lambda: _mesh_worlds().flatmap(lambda w: mesh.mesh_cases(w, reorder=True, bug="guard_keyed_by_shape")),
            mesh.run_reorder, lambda c: replace(c, bug=""), mesh.describe),
]


@pytest.mark.parametrize("planted_bug", PLANTED, ids=lambda p: p.bug)
def test_planted_bug_is_caught_with_a_minimal_example(planted_bug: Planted, rank_pools, planted_report):
    evaluations = 0

    def violates(case) -> bool:
        nonlocal evaluations
        evaluations += 1
        try:
            planted_bug.check(rank_pools, case)
        except PropertyViolation:
            return True
        return False

    try:
        minimal = find(planted_bug.strategy(), violates, settings=planted())
    except NoSuchExample:
        pytest.fail(f"{planted_bug.prop} did not catch planted bug {planted_bug.bug!r} in "
                    f"{planted().max_examples} examples: the property is too weak")
    with pytest.raises(PropertyViolation) as caught:
        planted_bug.check(rank_pools, minimal)
    planted_bug.check(rank_pools, planted_bug.without_bug(minimal))  # must pass: the bug is the cause
    example = planted_bug.describe(minimal)
    print(f"\nplanted bug {planted_bug.bug}: minimal example ({evaluations} cases run) {example}\n"
          f"  property says: {caught.value}")
    planted_report(planted_bug.bug, planted_bug.prop,
                   f"{example}\n    property says: {caught.value}\n    ({evaluations} cases run to find and shrink it)")
