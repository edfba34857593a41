"""Where a mesh's dimensions land on the machine's links: the default placement and a deliberately bad one.

A placement here is the mesh's order: rank r runs on device r, so the order decides which devices
form each TP, PP and DP group. The default (TP innermost) puts TP on neighbouring devices; the bad
placement is the order whose TP groups cross the slowest link class of the machine, read from its
pairwise link matrix (``perfgate.machine.hardware.fingerprint()["links"]``, ``nvidia-smi topo -m``'s
classes). On the seed's 8x V100 (PIX pairs, PHB within a socket, SYS across) that is TP outermost:
TP pairs (0, 4), (1, 5)... over SYS, the mapping that made its TP phase 3.05x slower (§16.7).

Pure functions over the link matrix: no GPU needed to test them (the seed machine's matrix is
stored with its imported baselines).
"""
from __future__ import annotations

import itertools

from perfgate.workloads.mesh.layout import MeshLayout

# PCIe path classes from the closest to the farthest (nvidia-smi topo -m); NVLink (NV#) beats them all.
PCIE_CLASSES = ("PIX", "PXB", "PHB", "NODE", "SYS")


def link_slowness(link: str) -> float:
    """A sort key: larger is slower. NV<n> (n bonded NVLinks) is faster than any PCIe path and faster
    with more links; then PIX < PXB < PHB < NODE < SYS. An unknown class counts as the slowest."""
    if link.startswith("NV") and link[2:].isdigit():
        return -float(link[2:])
    if link in PCIE_CLASSES:
        return float(PCIE_CLASSES.index(link))
    return float(len(PCIE_CLASSES))


def slowest_link(group: tuple[int, ...], links: list[list[str]]) -> str | None:
    """The slowest link between two members of ``group`` (device = rank), or None for a single device."""
    pairs = [links[a][b] for a, b in itertools.combinations(group, 2)]
    return max(pairs, key=link_slowness) if pairs else None


def dim_links(layout: MeshLayout, links: list[list[str]] | None) -> dict[str, str | None]:
    """Per dimension of degree > 1, the slowest link any of its groups crosses (None without a link matrix)."""
    out: dict[str, str | None] = {}
    for dim in layout.mesh_dims:
        if getattr(layout, dim) < 2:
            continue
        if not links:
            out[dim] = None
            continue
        found = [slowest_link(g, links) for g in layout.groups(dim)]
        out[dim] = max((f for f in found if f is not None), key=link_slowness)
    return out


def _tp_cost(layout: MeshLayout, links: list[list[str]] | None) -> tuple[float, int]:
    """How bad an order is for TP: its slowest TP link, then how far apart TP's ranks are (its stride)."""
    link = dim_links(layout, links).get("tp")
    slowness = link_slowness(link) if link is not None else 0.0
    dims = layout.mesh_dims
    stride = 1
    for d in dims[dims.index("tp") + 1:]:
        stride *= getattr(layout, d)
    return slowness, stride


def tp_on_slowest_link(layout: MeshLayout, links: list[list[str]] | None) -> MeshLayout:
    """The order of ``layout``'s dimensions that puts TP across the slowest link of ``links``.

    Among orders whose TP groups cross equally slow links, the one with TP outermost (its ranks
    farthest apart) and the others in their default relative order: with no link matrix (CPU: every
    rank on one host's loopback) or one link class everywhere, that is the order that would be worst
    on a machine of two sockets, and its cost is what the machine shows (about none)."""
    if layout.tp < 2:
        raise ValueError(f"layout {layout.describe()} has no TP dimension to place: needs tp >= 2")
    if links is not None and len(links) < layout.world_size:
        raise ValueError(f"the link matrix covers {len(links)} devices, the mesh needs {layout.world_size}")
    rest = tuple(d for d in layout.mesh_dims if d != "tp")
    candidates = [layout.with_order(order) for order in itertools.permutations(layout.mesh_dims)]
    # max() keeps the first of equals: candidates with TP first come first among ties by stride order
    candidates.sort(key=lambda c: (c.mesh_dims.index("tp"), [rest.index(d) for d in c.mesh_dims if d != "tp"]))
    return max(candidates, key=lambda c: _tp_cost(c, links))


def one_link_class(links: list[list[str]] | None, world_size: int) -> str | None:
    """The machine's only link class among its first ``world_size`` devices, or None when it has several
    (or no link matrix): then no placement puts TP on a slower link than another."""
    if not links:
        return None
    classes = {links[i][j] for i in range(world_size) for j in range(world_size) if i != j}
    return classes.pop() if len(classes) == 1 else None
