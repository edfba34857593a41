"""The mesh area: the layout's validation and rank -> coordinate map, the placement chosen from a link
matrix (the seed's 8x V100 one), the phase mix's exact counts, the area's cases and its reduce's checks
on hand-made per-rank results, and the dispatcher count of one real in-process step (world 1, gloo)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfgate.workloads import mesh
from perfgate.workloads.area import CheckFailed, Measured
from perfgate.workloads.mesh.layout import MeshLayout
from perfgate.workloads.mesh.phases import PhaseMix, expected_counts
from perfgate.workloads.mesh.placement import dim_links, link_slowness, one_link_class, tp_on_slowest_link
from perfgate.workloads.mesh.step import PlacementSpec
from perfgate.workloads.pipeline.layout import ParallelLayout

ROOT = Path(__file__).resolve().parents[1]


def _v100_links() -> list[list[str]]:
    """The seed machine's pairwise links, as stored with its imported collectives baselines."""
    doc = json.loads((ROOT / "baselines" / "8xV100-PCIE-32GB-PCIe" / "collectives.json").read_text())
    return doc["fingerprint"]["links"]


# -- the layout -------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, message", [
    (dict(world_size=8, tp=2, pp=2, dp=1), r"tp 2 x pp 2 x dp 1 = 4 ranks, but world size is 8"),
    (dict(world_size=8, tp=2, pp=2, dp=1, cp=4), r"tp 2 x pp 2 x dp 1 x cp 4 = 16 ranks, but world size is 8"),
    (dict(world_size=4, tp=2, dp=2, order=("dp", "ep", "tp")), r"unknown dimension\(s\) \['ep'\]"),
    (dict(world_size=4, tp=2, dp=2, order=("tp", "dp", "tp")), r"names tp more than once"),
    (dict(world_size=4, tp=2, dp=2, order=("pp", "tp")), r"leaves out dp \(degree 2\)"),
    (dict(world_size=4, tp=0, dp=4), r"tp must be an integer >= 1, got 0"),
    (dict(world_size=4, tp=True, dp=4), r"tp must be an integer >= 1, got True"),
])
def test_layout_refuses_degrees_or_orders_that_do_not_fit_naming_the_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        MeshLayout(**kwargs)


def test_parallel_layout_shares_the_mesh_degree_rule():
    with pytest.raises(ValueError, match=r"^tp 2 x pp 2 x dp 1 = 4 ranks, but world size is 2$"):
        ParallelLayout(world_size=2, tp=2, pp=2, engine="megatron")


def test_default_order_puts_tp_on_neighbouring_ranks_and_pp_outermost():
    layout = MeshLayout(8, tp=2, pp=2, dp=2)
    assert layout.mesh_dims == ("pp", "dp", "tp") and layout.mesh_shape == (2, 2, 2)
    assert layout.groups("tp") == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.groups("dp") == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.groups("pp") == ((0, 4), (1, 5), (2, 6), (3, 7))
    assert layout.groups("cp") == tuple((r,) for r in range(8))  # degree 1: no axis, one rank per group
    assert layout.coordinate(6) == {"tp": 0, "pp": 1, "dp": 1, "cp": 0}
    assert layout.label() == "tp2-pp2-dp2" and layout.describe() == "tp2-pp2-dp2 (order pp, dp, tp)"


def test_coordinate_and_rank_at_are_inverse_and_groups_partition_the_ranks():
    layout = MeshLayout(16, tp=2, pp=4, dp=1, cp=2, order=("tp", "cp", "pp"))
    for rank in range(16):
        assert layout.rank_at(layout.coordinate(rank)) == rank
    for dim in ("tp", "pp", "dp", "cp"):
        members = sorted(r for g in layout.groups(dim) for r in g)
        assert members == list(range(16))
        assert all(len(g) == getattr(layout, dim) for g in layout.groups(dim))
    assert layout.group_of(5, "pp") == tuple(layout.rank_at({**layout.coordinate(5), "pp": i}) for i in range(4))


def test_a_one_rank_layout_has_one_axis():
    assert MeshLayout(1).mesh_dims == ("tp",) and MeshLayout(1).mesh_shape == (1,)


# -- placement ---------------------------------------------------------------------------------------

def test_link_slowness_orders_nvlink_before_pcie_paths():
    order = ["NV18", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS", "???"]
    assert sorted(reversed(order), key=link_slowness) == order


def test_on_the_seed_v100_the_default_puts_tp_on_pix_and_the_bad_placement_on_sys():
    links = _v100_links()
    layout = MeshLayout(8, tp=2, pp=2, dp=2)
    assert dim_links(layout, links) == {"pp": "SYS", "dp": "PHB", "tp": "PIX"}
    bad = tp_on_slowest_link(layout, links)
    assert bad.mesh_dims == ("tp", "pp", "dp")
    assert bad.groups("tp") == ((0, 4), (1, 5), (2, 6), (3, 7))  # the seed's TP moved from PIX onto SYS
    assert dim_links(bad, links)["tp"] == "SYS"
    assert one_link_class(links, 8) is None


def test_without_a_slower_link_the_bad_placement_is_tp_outermost():
    layout = MeshLayout(8, tp=2, pp=2, dp=2)
    assert tp_on_slowest_link(layout, None).mesh_dims == ("tp", "pp", "dp")
    nvswitch = [["X" if i == j else "NV18" for j in range(8)] for i in range(8)]
    assert one_link_class(nvswitch, 8) == "NV18"
    with pytest.raises(ValueError, match="needs tp >= 2"):
        tp_on_slowest_link(MeshLayout(4, pp=2, dp=2), None)


# -- the phase mix -----------------------------------------------------------------------------------

def test_phase_mix_counts_are_exact_and_follow_the_layout():
    mix = PhaseMix(hidden=256, tokens=64, layers=2, microbatches=4)
    activation = 64 * 256 * 4
    assert expected_counts(mix, MeshLayout(8, tp=2, pp=2, dp=2)) == {
        "tp": {"calls": 32, "bytes": 32 * activation},               # 4 per layer and microbatch
        "pp": {"calls": 16, "bytes": 16 * activation},               # 2 exchanges per microbatch, send + receive
        "dp": {"calls": 1, "bytes": 2 * 12 * 256 * 256 // 2 * 4},   # the stage's TP shard of the gradients
    }
    assert set(expected_counts(mix, MeshLayout(4, tp=4))) == {"tp"}
    with pytest.raises(ValueError, match="no context-parallel row"):
        mix.rows(MeshLayout(4, tp=2, cp=2))


def test_placement_spec_refuses_placements_of_other_degrees_before_any_rank_starts():
    mix = PhaseMix(hidden=8, tokens=2, layers=1, microbatches=1)
    with pytest.raises(ValueError, match="share their degrees"):
        PlacementSpec((("a", MeshLayout(8, tp=2, pp=2, dp=2)), ("b", MeshLayout(8, tp=4, dp=2))), mix)
    with pytest.raises(ValueError, match="measured_steps must be >= 5"):
        PlacementSpec((("a", MeshLayout(2, tp=2)),), mix, measured_steps=3)


# -- the area ----------------------------------------------------------------------------------------

def test_cases_read_like_a_report_and_share_one_launch():
    cpu = mesh.cases(mesh.CPU)
    assert [c.id for c in cpu] == ["gloo-8rank-tp2-pp2-dp2-default", "gloo-8rank-tp2-pp2-dp2-tp-on-slowest-link"]
    assert {c.group for c in cpu} == {"mesh-gloo-8rank-tp2-pp2-dp2"} and all(c.marks == ("cpu",) for c in cpu)
    assert cpu[0].values.spec is cpu[1].values.spec
    gpu = mesh.cases(mesh.GPU)
    assert [c.id for c in gpu] == ["nccl-8gpu-tp2-pp2-dp2-default", "nccl-8gpu-tp2-pp2-dp2-tp-on-slowest-link"]
    assert all(c.marks == ("8gpu",) for c in gpu)
    # both placements' buffers (DP's 384 MiB gradient shard, its saved copy: 1.5 GiB), the checked row, 2 GiB
    assert [c.device_memory_gib for c in gpu] == [4.3, 4.3] and cpu[0].device_memory_gib is None


def _rank(layout: MeshLayout, rank: int, times: list[float], mix=mesh.CPU.mix, **override) -> dict:
    counts = expected_counts(mix, layout)
    out = {"time_ms": {d: list(times) for d in counts}, "counts": counts, "wrong": {d: 0 for d in counts},
           "coordinate": {d: layout.coordinate(rank)[d] for d in layout.mesh_dims},
           "groups": {d: list(layout.group_of(rank, d)) for d in layout.mesh_dims}}
    out.update(override)
    return out


def _per_rank(cases, times=(1.0, 2.0, 3.0, 4.0, 5.0), bad_times=(2.0, 4.0, 6.0, 8.0, 10.0), **override):
    by_name = {c.values.placement: c.values.layout for c in cases}
    return [{mesh.DEFAULT: _rank(by_name[mesh.DEFAULT], r, times),
             mesh.BAD: _rank(by_name[mesh.BAD], r, bad_times, **(override if r == 3 else {}))} for r in range(8)]


def test_reduce_records_exact_counts_phase_times_and_paired_ratios():
    cases = mesh.cases(mesh.CPU)
    records = {r.name: r for r in mesh.reduce(cases[1], _per_rank(cases)) if isinstance(r, Measured)}
    assert records["tp_calls_per_step"].samples == [32] and records["tp_calls_per_step"].unit == "count"
    assert records["dp_bytes_per_step"].samples == [2 * 12 * 256 * 256 // 2 * 4]
    assert records["tp_over_default_x"].samples == [2.0] * 5
    assert records["comm_over_default_x"].samples == [2.0] * 5
    assert records["comm_ms"].samples == [6.0, 12.0, 18.0, 24.0, 30.0]  # three phases of the slowest rank
    default = {r.name for r in mesh.reduce(cases[0], _per_rank(cases))}
    assert "tp_over_default_x" not in default and "tp_ms" in default


@pytest.mark.parametrize("override, message", [
    (dict(counts={"tp": {"calls": 33, "bytes": 33 * 65536}, "pp": {"calls": 16, "bytes": 16 * 65536},
                  "dp": {"calls": 1, "bytes": 1572864}}), r"rank 3 issued .*'calls': 33.* issues"),
    (dict(coordinate={"tp": 1, "pp": 1, "dp": 0}), r"rank 3 sits at .* puts it at"),
    (dict(groups={"tp": [2, 3], "pp": [3, 5], "dp": [1, 3]}), r"rank 3's tp group is \[2, 3\]"),
    (dict(wrong={"tp": 2, "pp": 0, "dp": 0}), r"wrong output elements per dimension \{'tp': 2"),
])
def test_reduce_refuses_a_wrong_mapping_count_or_output_on_any_rank(override, message):
    cases = mesh.cases(mesh.CPU)
    with pytest.raises(CheckFailed, match=message):
        mesh.reduce(cases[1], _per_rank(cases, **override))


# -- one real step, world 1 (in process) ---------------------------------------------------------------

def test_the_dispatcher_counts_calls_and_largest_buffers_per_group(tmp_path):
    import torch
    import torch.distributed as dist

    from perfgate.workloads.collectives.ops import OP_DEFS
    from perfgate.workloads.mesh.call_log import GroupCallLog

    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        inp, out = torch.ones(16), torch.empty(16)
        log = GroupCallLog()
        with log:
            for _ in range(3):
                OP_DEFS["all_reduce"].call(dist, inp, out, 0, 1, group)
            OP_DEFS["all_gather"].call(dist, inp, out, 0, 1, group)
        assert log.per_dim({group.group_name: "tp"}) == {"tp": {"calls": 4, "bytes": 4 * 64}}
        assert log.per_dim({}) == {"other": {"calls": 4, "bytes": 4 * 64}}
    finally:
        dist.destroy_process_group()
