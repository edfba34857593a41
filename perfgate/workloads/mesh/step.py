"""Rank side of the placement cost: one launch times a phase mix on every placement of one layout.

Each placement is the same degrees in another order, so one set of ranks builds every placement's
DeviceMesh once and alternates them step by step: the bad/default ratio is paired within one run,
at equal bytes, and a loaded machine slows both alike. Per step and placement, each dimension's
phase (all its rows of :mod:`perfgate.workloads.mesh.phases`) runs after a world barrier and is timed
on its own with the collectives area's timer (CUDA events on GPU, perf_counter on CPU).

Besides the times, each rank returns, per placement: its coordinate and its group along each
dimension as the DeviceMesh built them (the parent checks them against the layout: the mapping is
checked on every rank); the c10d operators and bytes per dimension of one step as the dispatcher saw
them (call_log, an untimed step); and the wrong elements of one more step on fresh rank-specific
data, run under the order guard, whose expected results are the collectives area's own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from perfgate.workloads.area import MIN_MEASURED_STEPS
from perfgate.workloads.collectives.ops import OP_DEFS, fill, timer_for
from perfgate.workloads.mesh.layout import MeshLayout, release_device_mesh
from perfgate.workloads.mesh.phases import MIX_DIMS, PhaseMix, expected_counts


@dataclass(frozen=True)
class PlacementSpec:
    """Every placement of one layout (name -> the layout in that order) and the step they all run."""

    placements: tuple[tuple[str, MeshLayout], ...]
    mix: PhaseMix
    warmup_steps: int = 2
    measured_steps: int = 7
    # A slow link's bandwidth and a call's latency under load: they set the hang budget, nothing else
    # (8 gloo ranks on 2 busy cores took ~3 ms a 64 KiB all_reduce).
    assumed_gb_s: float = 0.1
    assumed_call_s: float = 0.01

    def __post_init__(self) -> None:
        if not self.placements:
            raise ValueError("a placement spec needs at least one placement")
        layouts = [layout for _, layout in self.placements]
        if len({(lay.world_size, tuple(lay.degrees().items())) for lay in layouts}) != 1:
            raise ValueError(f"placements must share their degrees and world size (only the order differs), got "
                             f"{[lay.describe() for lay in layouts]}")
        if len({name for name, _ in self.placements}) != len(self.placements):
            raise ValueError(f"placement names repeat: {[name for name, _ in self.placements]}")
        if self.measured_steps < MIN_MEASURED_STEPS:
            raise ValueError(f"measured_steps must be >= {MIN_MEASURED_STEPS}, got {self.measured_steps}")
        if self.warmup_steps < 1:
            raise ValueError(f"warmup_steps must be >= 1 (the first step connects the groups), got {self.warmup_steps}")
        for _, layout in self.placements:
            self.mix.rows(layout)  # refuses a layout the mix has no rows for, here in the parent

    @property
    def world_size(self) -> int:
        return self.placements[0][1].world_size

    def device_memory_gib(self) -> float:
        """GPU memory each rank needs: every placement's buffers (each row's input, its saved copy and its
        output), the checked step's largest row once more, and 2 GiB for the CUDA context and NCCL."""
        per_row = []
        for _, layout in self.placements:
            for row in self.mix.rows(layout):
                opdef, n = OP_DEFS[row.op], getattr(layout, row.dim)
                elems = row.message_bytes // self.mix.element_bytes
                buffers = 2 * opdef.input_elems(elems, n) + opdef.output_elems(elems, n)
                per_row.append(buffers * self.mix.element_bytes)
        return round((sum(per_row) + max(per_row)) / 2**30 + 2.0, 1)

    def expected_s(self) -> float:
        """Healthy work time on the slow side (the launcher's hang budget is 3x this): every step of every
        placement, plus the counted and the checked one, at ``assumed_gb_s`` and ``assumed_call_s``."""
        counts = expected_counts(self.mix, self.placements[0][1])
        step_s = sum(c["bytes"] / (self.assumed_gb_s * 1e9) + c["calls"] * self.assumed_call_s for c in counts.values())
        return (self.warmup_steps + self.measured_steps + 2) * len(self.placements) * step_s + 5.0


class _Phases:
    """One placement's DeviceMesh, and per dimension the calls of one step on buffers made once (each
    phase restores its inputs first: in-place all_reduces would otherwise grow them step by step)."""

    def __init__(self, torch, dist, ctx, layout: MeshLayout, mix: PhaseMix):
        self.layout = layout
        self.mesh = layout.device_mesh(ctx.device.type)
        dtype = getattr(torch, mix.dtype)
        self.rows = mix.rows(layout)
        self.runs: dict[str, list[Callable[[], None]]] = {}
        self.resets: dict[str, list[Callable[[], None]]] = {}
        self.group_dims: dict[str, str] = {}
        for row in self.rows:
            group = self.mesh.get_group(row.dim)
            self.group_dims[group.group_name] = row.dim
            opdef = OP_DEFS[row.op]
            n, grank = dist.get_world_size(group), self.mesh.get_local_rank(row.dim)
            elems = row.message_bytes // mix.element_bytes
            inp = fill(torch, opdef.input_elems(elems, n), grank, ctx.device, dtype)
            init = inp.clone()
            out = torch.empty(max(opdef.output_elems(elems, n), 1), device=ctx.device, dtype=dtype)

            def call(opdef=opdef, inp=inp, out=out, grank=grank, n=n, group=group):
                opdef.call(dist, inp, out, grank, n, group)

            self.runs.setdefault(row.dim, []).extend([call] * row.calls_per_step)
            self.resets.setdefault(row.dim, []).append(lambda inp=inp, init=init: inp.copy_(init))

    def dims(self) -> tuple[str, ...]:
        return tuple(d for d in MIX_DIMS if d in self.runs)

    def run(self, dim: str) -> None:
        for call in self.runs[dim]:
            call()

    def reset(self, dim: str) -> None:
        for reset in self.resets[dim]:
            reset()

    def coordinate(self) -> dict[str, int]:
        return dict(zip(self.mesh.mesh_dim_names, self.mesh.get_coordinate()))

    def groups(self, dist) -> dict[str, list[int]]:
        return {d: dist.get_process_group_ranks(self.mesh.get_group(d)) for d in self.mesh.mesh_dim_names}


def _counted_step(phases: _Phases) -> dict[str, dict[str, int]]:
    """One untimed step under the dispatcher log: c10d operators and bytes per dimension."""
    from perfgate.workloads.mesh.call_log import GroupCallLog

    log = GroupCallLog()
    with log:
        for dim in phases.dims():
            phases.reset(dim)
            phases.run(dim)
    return log.per_dim(phases.group_dims)


def _checked_step(torch, dist, ctx, layout: MeshLayout, mix: PhaseMix, mesh) -> dict[str, int]:
    """Wrong output elements per dimension of one guarded call of each row on fresh data."""
    from perfgate.workloads.mesh.guard import OrderGuard

    wrong: dict[str, int] = {}
    dtype = getattr(torch, mix.dtype)
    for row in mix.rows(layout):
        group = mesh.get_group(row.dim)
        guard = OrderGuard(group, f"{row.dim} group {dist.get_process_group_ranks(group)}")
        opdef = OP_DEFS[row.op]
        n, grank = dist.get_world_size(group), mesh.get_local_rank(row.dim)
        elems = row.message_bytes // mix.element_bytes
        inp = fill(torch, opdef.input_elems(elems, n), grank, ctx.device, dtype)
        init = inp.clone()
        out = torch.full((max(opdef.output_elems(elems, n), 1),), -1, device=ctx.device, dtype=dtype)
        guard.check(f"{row.dim} {row.op}")
        opdef.call(dist, inp, out, grank, n, group)
        wrong[row.dim] = wrong.get(row.dim, 0) + opdef.wrong(torch, init, inp, out, elems, grank, n)
    return wrong


def run(spec: PlacementSpec, ctx) -> dict[str, dict]:
    """Worker entry point (perfgate.launch.jobs): this rank's raw results per placement."""
    import torch
    import torch.distributed as dist

    timer = timer_for(ctx.device)
    built: dict[str, _Phases] = {}
    for name, layout in spec.placements:
        ctx.phase(f"build the {name} mesh {layout.describe()}")
        built[name] = _Phases(torch, dist, ctx, layout, spec.mix)
    out: dict[str, dict] = {name: {"time_ms": {d: [] for d in p.dims()}} for name, p in built.items()}
    for name, phases in built.items():
        ctx.phase(f"{name}: counted step")
        out[name]["counts"] = _counted_step(phases)
        out[name]["coordinate"] = phases.coordinate()
        out[name]["groups"] = phases.groups(dist)
    names = list(built)
    for step in range(spec.warmup_steps + spec.measured_steps):
        measured = step >= spec.warmup_steps
        # alternate which placement goes first, so neither always follows the other
        for name in (names if step % 2 == 0 else names[::-1]):
            phases = built[name]
            for dim in phases.dims():
                phases.reset(dim)
                if ctx.device.type == "cuda":
                    torch.cuda.synchronize()
                dist.barrier()
                ctx.phase(f"{name}: step {step} {dim} phase")
                seconds = timer(lambda: phases.run(dim))
                if measured:
                    out[name]["time_ms"][dim].append(seconds * 1e3)
    for name, layout in spec.placements:
        ctx.phase(f"{name}: checked step")
        out[name]["wrong"] = _checked_step(torch, dist, ctx, layout, spec.mix, built[name].mesh)
    dist.barrier()
    for phases in built.values():
        release_device_mesh(phases.mesh)
    return out
