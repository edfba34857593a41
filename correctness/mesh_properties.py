"""Strategies and checks for TP x PP x DP (x CP) meshes on real process groups (seed report §15.1, §16.7-8).

A case is a :class:`correctness.mesh_cases.MeshCase`: a layout (degrees that multiply to the world
size, and an order of the dimensions) drawn here, in the test process, and shipped to a warm group
of ranks. The expected answer of every group comes from the layout alone (``MeshLayout.groups``), never
from the DeviceMesh the ranks built: that is what makes a mesh built with the wrong order fail.

Two properties:

* the group sum: every rank sits where the layout puts it, and along every dimension its group's
  all_reduce is the sum over exactly that group's ranks (both of two same-shaped calls, each its own),
  all_gather returns the group's ranks in coordinate order, reduce_scatter returns the rank's own
  chunk, and PP's send/recv delivers the previous stage's data;
* the order guard: when one rank issues a dimension's two same-shaped all_reduces in the opposite
  order, every rank of its group reports the mismatch at that call and no rank returns mixed data.
"""
from __future__ import annotations

from hypothesis import strategies as st

from correctness.mesh_cases import B_SHIFT, MeshCase
from correctness.property_violation import PropertyViolation
from perfgate.workloads.mesh.layout import DEFAULT_ORDER, MeshLayout

WORLDS = (2, 4, 8)
TARGET = "correctness.mesh_cases:run"


def factorizations(world: int) -> list[dict[str, int]]:
    """Every way to write ``world`` as tp x pp x dp x cp, ``tp<world>`` first (where hypothesis shrinks to)."""
    out = []
    for cp in (d for d in range(1, world + 1) if world % d == 0):
        for dp in (d for d in range(1, world // cp + 1) if (world // cp) % d == 0):
            for pp in (d for d in range(1, world // (cp * dp) + 1) if (world // (cp * dp)) % d == 0):
                out.append({"tp": world // (cp * dp * pp), "pp": pp, "dp": dp, "cp": cp})
    return out


@st.composite
def mesh_layouts(draw, world: int) -> MeshLayout:
    """Any degrees and any order of the dimensions of degree > 1: each draw a distinct mesh, shrinking to
    ``tp<world>`` and towards the default order (TP innermost)."""
    degrees = draw(st.sampled_from(factorizations(world)), label="degrees")
    used = [d for d in DEFAULT_ORDER if degrees[d] > 1]
    order = tuple(draw(st.permutations(used), label="order")) if used else DEFAULT_ORDER
    return MeshLayout(world, order=order, **degrees)


@st.composite
def mesh_cases(draw, world: int, *, reorder: bool = False, guard: bool = True, bug: str = "") -> MeshCase:
    """A layout and buffer length; with ``reorder``, one rank that issues one dimension's all_reduces reversed."""
    layout = draw(mesh_layouts(world))
    elems = draw(st.integers(1, 4), label="elems")
    if not reorder:
        return MeshCase(layout, elems, guard=guard, bug=bug)
    dims = [d for d in layout.mesh_dims if layout.degrees()[d] > 1]
    return MeshCase(layout, elems, guard=guard, bug=bug, reorder_rank=draw(st.integers(0, world - 1), label="rank"),
                    reorder_dim=draw(st.sampled_from(dims), label="dim"))


def describe(case: MeshCase) -> str:
    reorder = (f"; rank {case.reorder_rank} reorders its {case.reorder_dim} all_reduces"
               if case.reorder_rank is not None else "")
    return (f"{case.world_size} ranks, {case.layout.describe()}, {case.elems} element(s)"
            f"{'' if case.guard else ', no order guard'}{reorder}")


def _ranks_in(mask: int) -> list[int]:
    return [r for r in range(B_SHIFT) if mask >> r & 1]


def _explain_sum(value: int) -> str:
    a, b = value & ((1 << B_SHIFT) - 1), value >> B_SHIFT
    return f"A of ranks {_ranks_in(a)}" + (f" and B of ranks {_ranks_in(b)}" if b else "")


def _check_dimension(case: MeshCase, rank: int, dim: str, got: dict) -> None:
    layout, k = case.layout, case.elems
    group = layout.group_of(rank, dim)
    where = f"{case.layout.describe()}: rank {rank} along {dim}"
    if got["ranks"] != list(group):
        raise PropertyViolation(f"{where}: its process group is ranks {got['ranks']}, the layout's is {list(group)}")
    mask = sum(2 ** r for r in group)
    for name, shift in (("all_reduce A", 0), ("all_reduce B", B_SHIFT)):
        want = [(mask << shift) * (j + 1) for j in range(k)]
        if got[name] != want:
            raise PropertyViolation(f"{where}: {name} summed {_explain_sum(got[name][0])}, expected "
                                    f"{_explain_sum(want[0])} (the group {list(group)}, each rank its own {name[-1]})")
    want = [r for r in group for _ in range(k)]
    if got["all_gather"] != want:
        raise PropertyViolation(f"{where}: all_gather returned ranks {got['all_gather']}, expected {want}")
    position = group.index(rank)
    want = [mask * (position * k + j + 1) for j in range(k)]
    if got["reduce_scatter"] != want:
        raise PropertyViolation(f"{where}: reduce_scatter returned {got['reduce_scatter']}, expected {want}: "
                                f"chunk {position} summed over {list(group)}")
    if dim == "pp":
        previous = group[(position - 1) % len(group)]
        if got["received"] != [previous] * k:
            raise PropertyViolation(f"{where}: received {got['received']} from the previous stage, expected rank "
                                    f"{previous}'s id")


def _check_coordinates(case: MeshCase, results: list[dict]) -> None:
    for rank, res in enumerate(results):
        want = {d: case.layout.coordinate(rank)[d] for d in case.layout.mesh_dims}
        if res["coordinate"] != want:
            raise PropertyViolation(f"{case.layout.describe()}: rank {rank} sits at {res['coordinate']} of the "
                                    f"DeviceMesh, the layout puts it at {want}")


def check_group_sums(case: MeshCase, results: list[dict]) -> None:
    """Every rank's coordinate, and every group of every dimension, against the layout (see module docstring)."""
    _check_coordinates(case, results)
    for rank, res in enumerate(results):
        for dim, got in res["dims"].items():
            if "stopped" in got:
                raise PropertyViolation(f"{case.layout.describe()}: rank {rank}'s order guard stopped its {dim} "
                                        f"group: {got['stopped']['message']}")
            _check_dimension(case, rank, dim, got)
    for rank, res in enumerate(results):
        missing = [d for d in case.layout.mesh_dims if case.layout.degrees()[d] > 1 and d not in res["dims"]]
        if missing:
            raise PropertyViolation(f"{case.layout.describe()}: rank {rank} returned nothing for {missing}")


def check_reorder_reported(case: MeshCase, results: list[dict]) -> None:
    """The reordering rank's group along its dimension reports the mismatch at that call, on every rank of
    it, naming the two calls; every rank that did not stop returns correct data; none returns mixed data."""
    _check_coordinates(case, results)
    dim, culprit = case.reorder_dim, case.reorder_rank
    group = case.layout.group_of(culprit, dim)
    for rank, res in enumerate(results):
        got = res["dims"].get(dim)
        if got is None:
            raise PropertyViolation(f"{describe(case)}: rank {rank} never reached its {dim} collectives")
        if rank in group:
            if "stopped" not in got:
                raise PropertyViolation(f"{describe(case)}: rank {rank} of the {dim} group {list(group)} was not "
                                        f"stopped; it returned all_reduce A = {_explain_sum(got['all_reduce A'][0])}, "
                                        f"B = {_explain_sum(got['all_reduce B'][0])}")
            calls = {int(r): tuple(c) for r, c in got["stopped"]["calls"].items()}
            if sorted(calls) != sorted(group) or calls[culprit][1] != f"{dim} all_reduce B":
                raise PropertyViolation(f"{describe(case)}: rank {rank}'s guard reported {calls}, expected every rank "
                                        f"of {list(group)} with rank {culprit} about to issue '{dim} all_reduce B'")
            if any(name in got for name in ("all_reduce A", "all_reduce B")):
                raise PropertyViolation(f"{describe(case)}: rank {rank} moved data before its guard stopped it")
        for other, other_got in res["dims"].items():
            if "stopped" not in other_got:
                _check_dimension(case, rank, other, other_got)
            elif rank not in group or other != dim:
                raise PropertyViolation(f"{describe(case)}: rank {rank}'s {other} group was stopped: "
                                        f"{other_got['stopped']['message']}")


def run_group_sums(pools, case: MeshCase) -> None:
    check_group_sums(case, pools.run(case.world_size, TARGET, case))


def run_reorder(pools, case: MeshCase) -> None:
    check_reorder_reported(case, pools.run(case.world_size, TARGET, case))
