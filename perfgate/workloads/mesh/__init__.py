"""The mesh area: the cost of a placement of a TP x PP x DP mesh (issue 52; seed report §16.7).

Modules, each with one job, none importing pytest: ``layout`` (the validated mesh description and
the DeviceMesh built from it), ``placement`` (the default order and the one that puts TP across the
machine's slowest link, from its link matrix), ``phases`` (a training step's communication as rows,
and its exact counts), ``guard`` (the order guard that stops a silent collective mismatch),
``call_log`` (c10d operators and bytes per process group, as the dispatcher sees them) and ``step``
(the worker). This file is the area: profiles, cases, ``measure`` and ``reduce``.

One case per placement: ``gloo-8rank-tp2-pp2-dp2-default`` and ``...-tp-on-slowest-link``; one launch
measures both, alternating step by step (step.py). Every case records, per dimension, the c10d calls
and bytes per step (exact: checked against :func:`~perfgate.workloads.mesh.phases.expected_counts`
and gated on any machine) and the phase time per step; the bad placement also records each
dimension's time over the default's, paired step by step. The CPU profile runs 8 gloo ranks of one
host, whose loopback is one link class: its ratio shows what a placement costs there (about
nothing), not what it costs on GPUs. The GPU profile needs 8 GPUs of more than one link class.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.judge.metrics import paired_ratio
from perfgate.runcache import RunCache
from perfgate.workloads.area import Area, Attached, Case, Measured, PerRank, Record, check
from perfgate.workloads.mesh.layout import MeshLayout
from perfgate.workloads.mesh.phases import PhaseMix, expected_counts
from perfgate.workloads.mesh.placement import dim_links, one_link_class, tp_on_slowest_link
from perfgate.workloads.mesh.step import PlacementSpec

TARGET = "perfgate.workloads.mesh.step:run"
DEFAULT, BAD = "default", "tp-on-slowest-link"


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str
    layout: MeshLayout    # the default placement (TP innermost)
    mix: PhaseMix
    warmup_steps: int = 2
    measured_steps: int = 7
    assumed_gb_s: float = 0.1  # a slow link under load: sets the hang budget only (step.PlacementSpec)


CPU = Profile("cpu", "gloo", MeshLayout(8, tp=2, pp=2, dp=2), PhaseMix(hidden=256, tokens=64, layers=2, microbatches=4))
GPU = Profile("gpu", "nccl", MeshLayout(8, tp=2, pp=2, dp=2),
              PhaseMix(hidden=4096, tokens=512, layers=2, microbatches=4, dtype="bfloat16"), measured_steps=10,
              assumed_gb_s=1.0)
PROFILES = {"cpu": CPU, "gpu": GPU}


@dataclass(frozen=True)
class PlacementCase:
    """One placement of a launch that measures every placement of the profile's layout."""

    placement: str
    backend: str
    spec: PlacementSpec
    links: tuple[tuple[str, str | None], ...]  # per dimension, the slowest link its groups cross (None: no matrix)

    @property
    def layout(self) -> MeshLayout:
        return dict(self.spec.placements)[self.placement]


def _links(profile: Profile) -> list[list[str]] | None:
    """The machine's GPU link matrix (GPU profile), or None: gloo ranks share one host's loopback."""
    if profile.backend == "gloo":
        return None
    from perfgate.machine import hardware

    links = hardware.fingerprint()["links"]
    return links if len(links) >= profile.layout.world_size else None


def cases(profile: Profile) -> list[Case]:
    """Both placements of the profile's layout; the bad one is read from this machine's link matrix."""
    layout, links = profile.layout, _links(profile)
    cpu = profile.backend == "gloo"
    key = f"gloo-{layout.world_size}rank" if cpu else f"nccl-{layout.world_size}gpu"
    marks = ("cpu",) if cpu else (f"{layout.world_size}gpu",)
    bad = tp_on_slowest_link(layout, links)
    spec = PlacementSpec(((DEFAULT, layout), (BAD, bad)), profile.mix, profile.warmup_steps, profile.measured_steps,
                         assumed_gb_s=profile.assumed_gb_s)
    only = None if cpu else one_link_class(links, layout.world_size)
    skip = {BAD: (f"every pair of the first {layout.world_size} GPUs is linked by {only}: no placement puts TP "
                  f"on a slower link than the default") if only else None}
    group = f"mesh-{key}-{layout.label()}"
    need = None if cpu else spec.device_memory_gib()
    return [Case(f"{key}-{layout.label()}-{name}",
                 PlacementCase(name, profile.backend, spec, tuple(dim_links(placed, links).items())),
                 marks, group, skip=skip.get(name), device_memory_gib=need)
            for name, placed in spec.placements]


def measure(runs: RunCache, case: Case) -> PerRank[dict]:
    """Every rank's raw results of the launch that measured every placement of ``case``'s layout."""
    from perfgate.launch.jobs import launch

    c: PlacementCase = case.values

    def key(name):
        return ("mesh", c.backend, c.spec, name)

    def produce(missing) -> dict:
        per_rank = launch(TARGET, c.spec, world_size=c.spec.world_size, backend=c.backend, timeout_s=600)
        return {key(name): per_rank for name, _ in c.spec.placements}
    return runs.get_many([key(c.placement)], produce, batch=[key(name) for name, _ in c.spec.placements])[0]


def _check_mapping(case: Case, layout: MeshLayout, ranks: list[dict]) -> None:
    """Every rank's coordinate and groups, as its DeviceMesh built them, are the layout's."""
    for rank, r in enumerate(ranks):
        want = {d: layout.coordinate(rank)[d] for d in layout.mesh_dims}
        check(r["coordinate"] == want, f"{case.id}: rank {rank} sits at {r['coordinate']} of the DeviceMesh, the "
                                       f"layout {layout.describe()} puts it at {want}")
        for dim, members in r["groups"].items():
            check(tuple(members) == layout.group_of(rank, dim),
                  f"{case.id}: rank {rank}'s {dim} group is {members}, the layout {layout.describe()} says "
                  f"{list(layout.group_of(rank, dim))}")


def _check_counts(case: Case, c: PlacementCase, ranks: list[dict]) -> dict[str, dict[str, int]]:
    want = expected_counts(c.spec.mix, c.layout)
    for rank, r in enumerate(ranks):
        check(r["counts"] == want, f"{case.id}: rank {rank} issued {r['counts']} (c10d calls and bytes per dimension "
                                   f"of one step), the phase mix on {c.layout.describe()} issues {want}")
    return want


def _slowest(ranks: list[dict], dim: str) -> list[float]:
    return [max(col) for col in zip(*(r["time_ms"][dim] for r in ranks))]


def _phase_ms(ranks: list[dict], dims) -> dict[str, list[float]]:
    return {d: _slowest(ranks, d) for d in dims}


def reduce(case: Case, per_rank: PerRank[dict]) -> list[Record]:
    """Checks the mapping, the exact counts and the outputs on every rank; records per dimension the calls
    and bytes per step and the slowest rank's phase time, and for the bad placement each phase's time over
    the default's, paired step by step."""
    c: PlacementCase = case.values
    ranks = [r[c.placement] for r in per_rank]
    _check_mapping(case, c.layout, ranks)
    counts = _check_counts(case, c, ranks)
    wrong = {d: sum(r["wrong"][d] for r in ranks) for d in counts}
    check(not any(wrong.values()), f"{case.id}: wrong output elements per dimension {wrong}")
    dims = tuple(counts)
    phase_ms = _phase_ms(ranks, dims)
    step_ms = [sum(col) for col in zip(*phase_ms.values())]
    out: list[Record] = []
    for d in dims:
        out += [Measured(f"{d}_calls_per_step", [counts[d]["calls"]], "count", "lower"),
                Measured(f"{d}_bytes_per_step", [counts[d]["bytes"]], "count", "lower"),
                Measured(f"{d}_ms", phase_ms[d], "ms", "lower")]
    out.append(Measured("comm_ms", step_ms, "ms", "lower"))
    if c.placement != DEFAULT:
        default = _phase_ms([r[DEFAULT] for r in per_rank], dims)
        out += [Measured(f"{d}_over_default_x", paired_ratio(phase_ms[d], default[d]), "x", "lower") for d in dims]
        out.append(Measured("comm_over_default_x",
                            paired_ratio(step_ms, [sum(col) for col in zip(*default.values())]), "x", "lower"))
    out.append(Attached("placement", {"order": list(c.layout.mesh_dims), "slowest_link_by_dim": dict(c.links),
                                      "groups": {d: [list(g) for g in c.layout.groups(d)] for d in dims},
                                      "phases": [vars(row) for row in c.spec.mix.rows(c.layout)],
                                      "phase_ms_by_rank": {d: [r["time_ms"][d] for r in ranks] for d in dims}}))
    return out


AREA: Area[Profile, RunCache, PerRank[dict]] = Area("mesh", PROFILES, cases, measure, reduce)
