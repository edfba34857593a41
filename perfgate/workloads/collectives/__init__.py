"""The collectives area: all_reduce, all_gather, ... timed nccl-tests style (see ``ops``).

Profiles: CPU, gloo with 2 and 4 processes, 1 KiB .. 4 MiB; GPU, NCCL on 2/4/8 GPUs,
1 KiB .. 1 GiB (x4 steps), and on machines with more than one link class one pair per class.
One launch measures every size of an (op, backend, world, placement) sweep: starting ranks
costs more than timing a size. Workers return raw per-rank samples; :func:`reduce` combines them.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.machine import hardware
from perfgate.workloads.area import Area, Case
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


def cases(profile: Profile) -> list[Case]:
    """Test arguments ``(backend, world, pair, size, sizes)``, one case per size."""
    sizes = list(profile.sizes)
    out = []
    for world in profile.worlds:
        key = f"{profile.backend}-{world}rank" if profile.name == "cpu" else f"nccl-{world}gpu"
        marker = "cpu" if profile.name == "cpu" else f"{world}gpu"
        out += [Case(f"{key}-{size_label(size)}", (profile.backend, world, None, size, sizes), (marker,), key)
                for size in sizes]
    if profile.pairs:
        for link, pair in sorted(hardware.pair_placements().items()):
            key = f"nccl-2gpu-{link}"
            marks = ("2gpu", "nvlink" if link.startswith("NV") else "pcie")
            out += [Case(f"{key}-{size_label(size)}", ("nccl", 2, pair, size, sizes), marks, key) for size in sizes]
    return out


def reduce(per_rank: list[list[dict]]) -> list[dict]:
    """Per size: the slowest rank's time per sample, bandwidths from it, wrong elements summed."""
    out = []
    for i, r0 in enumerate(per_rank[0]):
        rows = [rank[i] for rank in per_rank]
        if len({r["size_bytes"] for r in rows}) != 1 or len({len(r["time_us"]) for r in rows}) != 1:
            raise ValueError(f"ranks disagree on size {i}: {[(r['size_bytes'], len(r['time_us'])) for r in rows]}")
        time_us = [max(col) for col in zip(*(r["time_us"] for r in rows))]
        ref_us = [max(col) for col in zip(*(r["ref_us"] for r in rows))]
        algbw = [r0["size_bytes"] / (t / 1e6) / 1e9 for t in time_us]
        out.append({"size_bytes": r0["size_bytes"], "count": r0["count"], "iters": r0["iters"], "graph": r0["graph"],
                    "time_us": time_us, "ref_us": ref_us,
                    "time_over_p2p": [t / c for t, c in zip(time_us, ref_us)], "algbw_gbps": algbw, "busbw_gbps": [a * r0["bus_factor"] for a in algbw],
                    "wrong": sum(r["wrong"] for r in rows), "wrong_by_rank": [r["wrong"] for r in rows]})
    return out


AREA = Area("collectives", PROFILES, cases, reduce)


def sweep(op: str, backend: str, world: int, sizes, devices=None) -> dict[int, dict]:
    """Launch one job that measures every size; ``{size: reduced result}``."""
    from perfgate.launch.jobs import launch

    sizes = sorted(sizes)
    env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))} if devices else {}
    timeout = 120 + 30 * len(sizes) * (2 if backend == "gloo" else 1)
    per_rank = launch(TARGET, CollectiveSpec(op=op, sizes=tuple(sizes)), world_size=world, backend=backend,
                      timeout_s=timeout, env=env)
    return dict(zip(sizes, reduce(per_rank)))


def measure(runs, op: str, backend: str, world: int, size: int, sizes, devices=None) -> dict:
    """One size's result from the session's sweep of ``sizes`` (one launch for all of them)."""
    def key(s):
        return ("collectives", op, backend, world, tuple(devices or ()), s)

    def produce(missing):
        return {key(s): r for s, r in sweep(op, backend, world, [k[-1] for k in missing], devices).items()}
    return runs.get_many([key(size)], produce, batch=[key(s) for s in sizes])[0]
