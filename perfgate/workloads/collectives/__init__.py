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
from perfgate.workloads.collectives.ops import OP_DEFS, OPS, SLOWDOWN_ENV, CollectiveSpec, run  # noqa: F401

KiB, MiB, GiB = 1 << 10, 1 << 20, 1 << 30
TARGET = "perfgate.workloads.collectives.ops:run"


@dataclass(frozen=True)
class Profile:
    name: str
    backend: str
    worlds: tuple[int, ...]
    sizes: tuple[int, ...]
    pairs: bool = False  # also one 2-GPU pair per link class, where the machine has several


CPU = Profile("cpu", "gloo", worlds=(2, 4), sizes=tuple(KiB * 4**i for i in range(7)))  # 1 KiB .. 4 MiB
GPU = Profile("gpu", "nccl", worlds=(2, 4, 8), sizes=tuple(KiB * 4**i for i in range(10)) + (GiB,), pairs=True)
PROFILES = {"cpu": CPU, "gpu": GPU}


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


def cases(profile: Profile) -> list[Case]:
    """One case per (op, world or GPU pair, size); ``kind`` is the op, so each op's test gets the
    same ids (``gloo-2rank-1KiB``), marks and launch groups."""
    sizes = tuple(profile.sizes)
    configs = []  # (id prefix, world, pair, marks)
    for world in profile.worlds:
        key = f"{profile.backend}-{world}rank" if profile.name == "cpu" else f"nccl-{world}gpu"
        configs.append((key, world, None, ("cpu",) if profile.name == "cpu" else (f"{world}gpu",)))
    if profile.pairs:
        for link, pair in sorted(hardware.pair_placements().items()):
            configs.append((f"nccl-2gpu-{link}", 2, tuple(pair), ("2gpu", "nvlink" if link.startswith("NV") else "pcie")))
    return [Case(f"{key}-{size_label(size)}", CollectiveCase(op, profile.backend, world, pair, size, sizes), marks,
                 key, kind=op)
            for op in OPS for key, world, pair, marks in configs for size in sizes]


def measure(runs, case: Case) -> PerRank[dict]:
    """Every rank's result at ``case``'s size, from the session's sweep of its op over all sizes (one
    launch measures every size not cached yet: starting ranks costs more than timing a size)."""
    from perfgate.launch.jobs import launch

    c: CollectiveCase = case.values

    def key(size):
        return ("collectives", c.op, c.backend, c.world, c.pair or (), size)

    def produce(missing) -> dict:
        sizes = sorted(k[-1] for k in missing)
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, c.pair))} if c.pair else {}
        timeout = 120 + 30 * len(sizes) * (2 if c.backend == "gloo" else 1)
        per_rank = launch(TARGET, CollectiveSpec(op=c.op, sizes=tuple(sizes)), world_size=c.world,
                          backend=c.backend, timeout_s=timeout, env=env)
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
    ref_us = [max(col) for col in zip(*(r["ref_us"] for r in per_rank))]
    algbw = [r0["size_bytes"] / (t / 1e6) / 1e9 for t in time_us]
    return [
        Measured("time_us", time_us, "us", "lower"),
        Measured("busbw_gbps", [a * r0["bus_factor"] for a in algbw], "GB/s", "higher"),
        # Gated on every machine: the collective's time over one ring send/recv of the same bytes,
        # timed right after each sample by the same ranks, so a loaded machine moves both alike.
        Measured("time_over_p2p", [t / r for t, r in zip(time_us, ref_us)], "x", "lower"),
        Attached("sample", {"size_bytes": r0["size_bytes"], "count": r0["count"], "iters": r0["iters"],
                            "graph": r0["graph"], "algbw_gbps": algbw}),
    ]


AREA: Area[Profile, RunCache, PerRank[dict]] = Area("collectives", PROFILES, cases, measure, reduce)
