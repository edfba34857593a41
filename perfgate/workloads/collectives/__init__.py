"""The collectives area: all_reduce, all_gather, ... timed nccl-tests style (see ``ops``).

Profiles: CPU, gloo with 2 and 4 processes, 1 KiB .. 4 MiB; GPU, NCCL on 2/4/8 GPUs,
1 KiB .. 1 GiB (x4 steps), and on machines with more than one link class one pair per class.
One launch measures every size of an (op, backend, world, placement) sweep: starting ranks
costs more than timing a size. :func:`measure` returns every rank's raw samples of one size;
:func:`reduce` turns them into the metrics a test records.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.machine import hardware
from perfgate.runcache import RunCache
from perfgate.workloads.area import Area, Attached, Case, Measured, PerRank, Record, check
from perfgate.workloads.collectives.ops import OP_DEFS, OPS, CollectiveSpec, run  # noqa: F401

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TARGET = "perfgate.workloads.collectives.ops:run"


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str
    worlds: tuple[int, ...]
    sizes: tuple[int, ...]
    pairs: bool = False  # also one 2-GPU pair per link class, where the machine has several
    ops: tuple[str, ...] = OPS
    nnodes: int = 1      # > 1: each world is spread over this many nodes (perfgate.launch.multinode)
    launcher: str | None = None  # multi-node: "local" (torchrun agents on this machine) or srun


CPU = Profile("cpu", "gloo", worlds=(2, 4), sizes=tuple(KiB * 4**i for i in range(7)))  # 1 KiB .. 4 MiB
GPU = Profile("gpu", "nccl", worlds=(2, 4, 8), sizes=tuple(KiB * 4**i for i in range(10)) + (GiB,), pairs=True)
# The multi-node path on one machine: two torchrun agents ("nodes", one gloo rank each) that meet
# by c10d rendezvous on loopback; what a cluster run does, minus the network. One small size:
# this checks the path end to end in CI (docs/multinode.md), it is not a bandwidth figure.
LOOPBACK_2NODE = Profile("cpu-2node-loopback", "gloo", worlds=(2,), sizes=(KiB,), ops=("all_reduce",), nnodes=2,
                         launcher="local")
PROFILES = {"cpu": CPU, "gpu": GPU, "cpu-2node-loopback": LOOPBACK_2NODE}


def size_label(n: int) -> str:
    for unit, div in (("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n}B"


@dataclass(frozen=True)
class CollectiveCase:
    """One message size of one op's sweep: what a collectives test measures."""

    op: str
    backend: str
    world: int
    pair: tuple[int, ...] | None   # the two GPUs of one link class, or None: the first ``world`` devices
    size: int
    sizes: tuple[int, ...]         # the sweep one launch measures (every size of the profile)
    nnodes: int = 1
    launcher: str | None = None


def cases(profile: Profile) -> list[Case]:
    """One case per (op, world or GPU pair, size); ``kind`` is the op, so each op's test gets the
    same ids (``gloo-2rank-1KiB``), marks and launch groups. Multi-node profiles' kinds are
    ``<op>_multinode`` and their ids name the nodes (``gloo-2node-1KiB``)."""
    sizes = tuple(profile.sizes)
    cpu = profile.backend == "gloo"
    configs = []  # (id prefix, world, pair, marks)
    for world in profile.worlds:
        if profile.nnodes > 1:
            key = f"{profile.backend}-{profile.nnodes}node" + ("" if world == profile.nnodes else f"-{world}rank")
        else:
            key = f"{profile.backend}-{world}rank" if cpu else f"nccl-{world}gpu"
        configs.append((key, world, None, ("cpu",) if cpu else (f"{world // profile.nnodes}gpu",)))
    if profile.pairs:
        for link, pair in sorted(hardware.pair_placements().items()):
            configs.append((f"nccl-2gpu-{link}", 2, tuple(pair), ("2gpu", "nvlink" if link.startswith("NV") else "pcie")))
    suffix = "_multinode" if profile.nnodes > 1 else ""
    return [Case(f"{key}-{size_label(size)}", CollectiveCase(op, profile.backend, world, pair, size, sizes,
                                                             profile.nnodes, profile.launcher), marks,
                 key, kind=op + suffix)
            for op in profile.ops for key, world, pair, marks in configs for size in sizes]


def measure(runs, case: Case) -> PerRank[dict]:
    """Every rank's result at ``case``'s size, from the session's sweep of its op over all sizes (one
    launch measures every size not cached yet: starting ranks costs more than timing a size)."""
    from perfgate.launch.jobs import launch
    from perfgate.launch.multinode import launch_multinode

    c: CollectiveCase = case.values

    def key(size):
        return ("collectives", c.op, c.backend, c.nnodes, c.world, c.pair or (), size)

    def produce(missing) -> dict:
        sizes = sorted(k[-1] for k in missing)
        spec = CollectiveSpec(op=c.op, sizes=tuple(sizes))
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, c.pair))} if c.pair else {}
        timeout = 120 + 30 * len(sizes) * (2 if c.backend == "gloo" else 1)
        if c.nnodes > 1:  # the same worker, started by one torchrun agent per node
            per_rank = launch_multinode(TARGET, spec, nnodes=c.nnodes, nproc_per_node=c.world // c.nnodes,
                                        backend=c.backend, launcher=c.launcher, timeout_s=timeout, env=env)
        else:
            per_rank = launch(TARGET, spec, world_size=c.world, backend=c.backend, timeout_s=timeout, env=env)
        return {key(size): [rank[i] for rank in per_rank] for i, size in enumerate(sizes)}
    return runs.get_many([key(c.size)], produce, batch=[key(s) for s in c.sizes])[0]


def reduce(case: Case, per_rank: PerRank[dict]) -> list[Record]:
    """The slowest rank's time per sample, bandwidths from it, wrong elements summed (must be 0)."""
    c: CollectiveCase = case.values
    r0 = per_rank[0]
    if len({r["size_bytes"] for r in per_rank}) != 1 or len({len(r["time_us"]) for r in per_rank}) != 1:
        raise ValueError(f"ranks disagree on {case.id}: {[(r['size_bytes'], len(r['time_us'])) for r in per_rank]}")
    wrong_by_rank = [r["wrong"] for r in per_rank]
    check(sum(wrong_by_rank) == 0, f"{c.op} returned {sum(wrong_by_rank)} wrong elements at {size_label(c.size)} "
                                   f"on {c.world} ranks (per rank: {wrong_by_rank})")
    time_us = [max(col) for col in zip(*(r["time_us"] for r in per_rank))]
    call_us = [max(col) for col in zip(*(r["call_us"] for r in per_rank))]  # the slowest rank's median call
    ref_us = [max(col) for col in zip(*(r["ref_us"] for r in per_rank))]
    algbw = [r0["size_bytes"] / (t / 1e6) / 1e9 for t in time_us]
    return [
        Measured("time_us", time_us, "us", "lower"),
        Measured("busbw_gbps", [a * r0["bus_factor"] for a in algbw], "GB/s", "higher"),
        # Gated on every machine: the collective's median call over that of one ring send/recv of the
        # same bytes, timed right after each call by the same ranks, so a loaded machine moves both alike.
        Measured("time_over_p2p", [t / r for t, r in zip(call_us, ref_us)], "x", "lower"),
        Attached("sample", {"size_bytes": r0["size_bytes"], "count": r0["count"], "iters": r0["iters"],
                            "graph": r0["graph"], "algbw_gbps": algbw}),
    ]


AREA: Area[Profile, RunCache, PerRank[dict]] = Area("collectives", PROFILES, cases, measure, reduce)
