"""Rank side of the mesh properties: build one layout's DeviceMesh, run every dimension's collectives.

Each rank contributes values that name it: in all_reduce A it adds ``2**rank`` (times element j+1),
in all_reduce B ``2**(rank + 16)``, so a sum is the bit mask of exactly the ranks (and the calls)
it summed; all_gather gathers rank ids; reduce_scatter's chunk i is ``2**rank * (i * elems + j + 1)``,
so the chunk a rank gets back names its position in the group; along PP each rank sends its id one
stage on (a ring). The parent computes every group from the layout alone and checks the outputs
(correctness/mesh_properties.py); ranks only run collectives and hand back plain lists.

Collectives go through the collectives area's own calls (``OP_DEFS[op].call`` with the group), each
preceded, unless the case turns it off, by the product's order guard (perfgate.workloads.mesh.guard).
A guard that stops a group is reported as data, not raised: every rank of the group stops at the
same call, the ranks agree after each dimension whether any group stopped, and all end the case
together, so the warm group of ranks stays in step for the next case.

Test-only planted bugs (``MeshCase.bug``), never in the product:

* ``swapped_dims``: the mesh builder hands DeviceMesh the names of its two outer axes swapped
  (same shape): every rank agrees on the wrong groups, so nothing hangs or raises.
* ``guard_keyed_by_shape``: the guard names each call by its operation and shape only, as
  ``TORCH_DISTRIBUTED_DEBUG=DETAIL`` compares calls: two same-shaped all_reduces look alike.

A rank that issues its two same-shaped all_reduces of one dimension in the opposite order
(``reorder_rank``, ``reorder_dim``) is not a bug of ours but the fault the guard exists for (seed
report §16.8): the properties generate it as an input.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfgate.workloads.mesh.layout import MeshLayout

BUGS = ("swapped_dims", "guard_keyed_by_shape")
B_SHIFT = 16  # all_reduce B's contributions sit this many bits above A's


@dataclass(frozen=True)
class MeshCase:
    """One layout, the buffers' length, and optionally one rank that reorders one dimension's all_reduces."""

    layout: MeshLayout
    elems: int = 1
    guard: bool = True
    reorder_rank: int | None = None
    reorder_dim: str | None = None
    bug: str = ""

    def __post_init__(self) -> None:
        if self.bug and self.bug not in BUGS:
            raise ValueError(f"unknown planted bug {self.bug!r}; known: {BUGS}")
        if (self.reorder_rank is None) != (self.reorder_dim is None):
            raise ValueError("reorder_rank and reorder_dim go together")
        if self.reorder_dim is not None and self.reorder_dim not in self.layout.mesh_dims:
            raise ValueError(f"reorder_dim {self.reorder_dim!r} is not an axis of {self.layout.describe()}")
        if not 1 <= self.elems <= 64:
            raise ValueError(f"elems must be in 1..64, got {self.elems}")

    @property
    def world_size(self) -> int:
        return self.layout.world_size


def _build_mesh(case: MeshCase, device_type: str):
    if case.bug == "swapped_dims" and len(case.layout.mesh_dims) >= 2:
        from torch.distributed.device_mesh import init_device_mesh

        names = list(case.layout.mesh_dims)
        names[0], names[1] = names[1], names[0]
        return init_device_mesh(device_type, case.layout.mesh_shape, mesh_dim_names=tuple(names))
    return case.layout.device_mesh(device_type)


def _dimension(torch, dist, case: MeshCase, mesh, dim: str, rank: int, device) -> dict[str, Any]:
    """Every collective of one dimension on this rank; stops early (reporting it) if the guard fires."""
    from perfgate.workloads.collectives.ops import OP_DEFS
    from perfgate.workloads.mesh.guard import CollectiveOrderMismatch, OrderGuard

    group = mesh.get_group(dim)
    n, grank = dist.get_world_size(group), mesh.get_local_rank(dim)
    ranks = dist.get_process_group_ranks(group)
    out: dict[str, Any] = {"ranks": ranks}
    guard = OrderGuard(group, f"{dim} group {ranks}") if case.guard else None
    k = case.elems
    scale = torch.arange(1, k + 1, dtype=torch.int64, device=device)

    def call(op: str, name: str, inp, result):
        if guard is not None:
            guard.check(f"{op} {tuple(inp.shape)} {inp.dtype}" if case.bug == "guard_keyed_by_shape" else name)
        OP_DEFS[op].call(dist, inp, result, grank, n, group)

    try:
        pair = [("all_reduce A", (2 ** rank) * scale), ("all_reduce B", (2 ** (rank + B_SHIFT)) * scale)]
        if case.reorder_rank == rank and case.reorder_dim == dim:
            pair.reverse()
        for name, tensor in pair:
            call("all_reduce", f"{dim} {name}", tensor, None)
            out[name] = tensor.cpu().tolist()
        gathered = torch.empty(n * k, dtype=torch.int64, device=device)
        call("all_gather", f"{dim} all_gather", torch.full((k,), rank, dtype=torch.int64, device=device), gathered)
        out["all_gather"] = gathered.cpu().tolist()
        chunks = (2 ** rank) * torch.arange(1, n * k + 1, dtype=torch.int64, device=device)
        mine = torch.empty(k, dtype=torch.int64, device=device)
        call("reduce_scatter", f"{dim} reduce_scatter", chunks, mine)
        out["reduce_scatter"] = mine.cpu().tolist()
        if dim == "pp":
            received = torch.full((k,), -1, dtype=torch.int64, device=device)
            call("send_recv", "pp send/recv", torch.full((k,), rank, dtype=torch.int64, device=device), received)
            out["received"] = received.cpu().tolist()
    except CollectiveOrderMismatch as stopped:
        out["stopped"] = {"calls": {r: list(c) for r, c in stopped.calls.items()}, "message": str(stopped)}
    return out


def run(case: MeshCase, ctx) -> dict[str, Any]:
    """This rank's coordinate and, per dimension in the layout's order, its groups' outputs."""
    import torch
    import torch.distributed as dist

    from perfgate.workloads.mesh.layout import release_device_mesh

    if case.world_size != ctx.world_size:
        raise ValueError(f"case is for {case.world_size} ranks, the group has {ctx.world_size}")
    ctx.phase(f"build mesh {case.layout.describe()}")
    mesh = _build_mesh(case, ctx.device.type)
    try:
        result: dict[str, Any] = {"coordinate": dict(zip(mesh.mesh_dim_names, mesh.get_coordinate())), "dims": {}}
        for dim in case.layout.mesh_dims:
            if case.layout.degrees()[dim] < 2:
                continue  # a one-rank mesh: nothing to communicate
            ctx.phase(f"{dim} collectives")
            result["dims"][dim] = _dimension(torch, dist, case, mesh, dim, ctx.rank, ctx.device)
            stopped = torch.tensor([int("stopped" in result["dims"][dim])], device=ctx.device)
            dist.all_reduce(stopped)  # every rank learns whether any group stopped, and ends here too
            if int(stopped.item()):
                break
        return result
    finally:
        release_device_mesh(mesh)
