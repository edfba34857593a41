"""One validated description of a process mesh: TP x PP x DP (x CP) degrees, their order, rank -> coordinate.

Why a class of its own: which ranks form a TP group, a PP group or a DP group is decided by the
order of the mesh's dimensions, and nothing at run time says when it is wrong. Two meshes with
the same degrees and another order run the same collectives with the same shapes: only the
members of each group differ (seed report §16.7: TP moved from a PIX pair onto SYS ran 3.05x
slower). So the description is checked once, here, in the parent, before any rank starts: degrees
that do not multiply to the world size and an order that names an unknown dimension, names one
twice or leaves one out are refused with a message naming the numbers. The ranks then build the
real ``torch.distributed.device_mesh.DeviceMesh`` from it (:meth:`MeshLayout.device_mesh`), and the
parent computes every group from the same description (:meth:`MeshLayout.groups`) to check them
against. Modelled on torchtitan's ``ParallelDims``: dimensions of degree 1 get no mesh axis.

Order: outermost first, so the last dimension varies fastest over consecutive ranks. The default
``("pp", "dp", "cp", "tp")`` is torchtitan's and Megatron-Core's (``tp-cp-ep-dp-pp``, fastest
first): TP, the dimension that communicates on every layer, on neighbouring ranks, which a node
joins by its fastest links. EP is not a dimension of its own here: both frameworks carve expert
parallelism out of the DP x CP ranks, a second mesh over the same ranks.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

DIMS = ("tp", "pp", "dp", "cp")           # every dimension a layout has, in the order labels name them
DEFAULT_ORDER = ("pp", "dp", "cp", "tp")  # outermost first: TP on neighbouring ranks


@dataclass(frozen=True)
class MeshLayout:
    """Degrees and order of one mesh; an invalid combination raises ValueError at construction.

    ``order`` names the dimensions outermost first; a dimension of degree 1 may be left out of it
    (it has no mesh axis and every rank's coordinate along it is 0)."""

    world_size: int
    tp: int = 1
    pp: int = 1
    dp: int = 1
    cp: int = 1
    order: tuple[str, ...] = DEFAULT_ORDER

    def __post_init__(self) -> None:
        object.__setattr__(self, "order", tuple(self.order))
        for name in ("world_size",) + DIMS:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        check_degrees(self.world_size, self.degrees())
        unknown = [d for d in self.order if d not in DIMS]
        if unknown:
            raise ValueError(f"order {self.order} names unknown dimension(s) {unknown}; known: {', '.join(DIMS)}")
        twice = sorted({d for d in self.order if self.order.count(d) > 1})
        if twice:
            raise ValueError(f"order {self.order} names {', '.join(twice)} more than once")
        left_out = [f"{d} (degree {getattr(self, d)})" for d in DIMS if getattr(self, d) > 1 and d not in self.order]
        if left_out:
            raise ValueError(f"order {self.order} leaves out {', '.join(left_out)}: every dimension of degree > 1 "
                             f"needs a place in the order")

    def degrees(self) -> dict[str, int]:
        """Every dimension's degree, degree 1 included, in :data:`DIMS` order."""
        return {d: getattr(self, d) for d in DIMS}

    @property
    def mesh_dims(self) -> tuple[str, ...]:
        """The mesh's axes, outermost first: the ordered dimensions of degree > 1 (one rank: the innermost)."""
        dims = tuple(d for d in self.order if getattr(self, d) > 1)
        return dims or (self.order[-1] if self.order else DEFAULT_ORDER[-1],)

    @property
    def mesh_shape(self) -> tuple[int, ...]:
        return tuple(getattr(self, d) for d in self.mesh_dims)

    def _strides(self) -> dict[str, int]:
        strides, step = {}, 1
        for d in reversed(self.mesh_dims):
            strides[d] = step
            step *= getattr(self, d)
        return strides

    def coordinate(self, rank: int) -> dict[str, int]:
        """Rank -> its coordinate along every dimension (row-major over :attr:`mesh_dims`, as DeviceMesh
        lays it out)."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} out of range 0..{self.world_size - 1}")
        strides = self._strides()
        return {d: (rank // strides[d]) % getattr(self, d) if d in strides else 0 for d in DIMS}

    def rank_at(self, coordinate: dict[str, int]) -> int:
        """Coordinate -> rank; the inverse of :meth:`coordinate`."""
        strides = self._strides()
        for d in DIMS:
            if not 0 <= coordinate.get(d, 0) < getattr(self, d):
                raise ValueError(f"coordinate {d}={coordinate.get(d, 0)} out of range 0..{getattr(self, d) - 1}")
        return sum(coordinate.get(d, 0) * stride for d, stride in strides.items())

    def group_of(self, rank: int, dim: str) -> tuple[int, ...]:
        """The ranks of ``rank``'s group along ``dim``, in the order of their coordinate along it."""
        if dim not in DIMS:
            raise ValueError(f"unknown dimension {dim!r}; known: {', '.join(DIMS)}")
        here = self.coordinate(rank)
        return tuple(self.rank_at({**here, dim: i}) for i in range(getattr(self, dim)))

    def groups(self, dim: str) -> tuple[tuple[int, ...], ...]:
        """Every group along ``dim``, each in coordinate order, sorted by their first rank."""
        return tuple(sorted({self.group_of(r, dim) for r in range(self.world_size)}))

    def with_order(self, order: tuple[str, ...]) -> "MeshLayout":
        return replace(self, order=tuple(order))

    def label(self) -> str:
        """Degrees for test ids, e.g. ``tp2-pp2-dp2`` (dimensions of degree 1 left out, unless all are)."""
        parts = [f"{d}{n}" for d, n in self.degrees().items() if n > 1]
        return "-".join(parts) or "tp1"

    def describe(self) -> str:
        """Degrees and order for messages, e.g. ``tp2-pp2-dp2 (order pp, dp, tp)``."""
        return f"{self.label()} (order {', '.join(self.mesh_dims)})"

    def device_mesh(self, device_type: str):
        """The real DeviceMesh of this layout (call on every rank, in the same order: it creates process
        groups). ``device_type``: ``"cpu"`` for gloo, ``"cuda"`` for NCCL."""
        from torch.distributed.device_mesh import init_device_mesh

        return init_device_mesh(device_type, self.mesh_shape, mesh_dim_names=self.mesh_dims)


def check_degrees(world_size: int, degrees: dict[str, int]) -> None:
    """Raise ValueError unless the degrees multiply to ``world_size``, naming each (degree-1 CP left out
    of the message: most layouts have none)."""
    product = math.prod(degrees.values())
    if product != world_size:
        named = " x ".join(f"{d} {n}" for d, n in degrees.items() if d != "cp" or n != 1)
        raise ValueError(f"{named} = {product} ranks, but world size is {world_size}")


def release_device_mesh(mesh) -> None:
    """Destroy the process groups a DeviceMesh created on this rank (never the default group, which a
    dimension spanning the whole world reuses). Why: every gloo group holds sockets and threads, and a
    long-lived rank that builds many meshes would otherwise keep them all."""
    import torch.distributed as dist

    world = dist.group.WORLD
    for dim in mesh.mesh_dim_names or ():
        group = mesh.get_group(dim)
        if group is not world and group.group_name != world.group_name:
            dist.destroy_process_group(group)
