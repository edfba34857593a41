"""NCCL tuner crossover: is NCCL's own choice as good as the best forced setting, at every size?

The seed report (§16.3) found that the best algorithm/protocol changes with message size and
that at 256 MiB two channels beat four or eight on its PCIe V100s. NCCL's tuner picks an
algorithm, protocol and channel count per call from a cost model; when the model is wrong for a
machine (or a version changes it), the default loses bandwidth at some sizes only. This area
measures, for each collective and size, the bus bandwidth under the default and under each
forced setting (``NCCL_ALGO``, ``NCCL_PROTO``, ``NCCL_MIN_NCHANNELS``/``NCCL_MAX_NCHANNELS``),
every setting in its own launched process group (NCCL reads them at communicator creation),
with the collectives engine's timing loop and correctness check (perfgate.workloads.collectives.ops),
and ``NCCL_NVLS_ENABLE=0`` always (NVLink SHARP would be a further algorithm, and multicast is
left off on shared machines). The gated number is ``default_over_best_busbw``: the default's
busbw per sample over the best forced setting's median, higher is better; a default that falls
behind the best setting at a size by more than the tolerance is a regression.

A forced setting that NCCL refuses on this machine (``NCCL_ALGO=Tree`` for a collective with no
tree, LL128 where the platform disables it) is recorded as unavailable, with the error's last
line; the default must always run.

Test-only knob: the registered mutation ``nccl_bad_default`` (perfgate.mutations) launches the
"default" with ``NCCL_PROTO=Simple`` and one channel: the planted bad default the gate must fail.
Needs at least 2 GPUs; the cases carry ``2gpu``/``4gpu``/``8gpu`` markers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from perfgate import mutations
from perfgate.judge.metrics import summarize
from perfgate.runcache import RunCache
from perfgate.workloads import collectives
from perfgate.workloads.area import Area, Attached, Case, CheckFailed, Measured, Record, check
from perfgate.workloads.collectives import CollectiveCase, CollectiveSpec, size_label

KiB, MiB = 1 << 10, 1 << 20
DEFAULT = "default"
ALWAYS = {"NCCL_NVLS_ENABLE": "0"}
PLANTED_BAD_DEFAULT = {"NCCL_PROTO": "Simple", "NCCL_MIN_NCHANNELS": "1", "NCCL_MAX_NCHANNELS": "1"}


def _channels(n: int) -> dict[str, str]:
    return {"NCCL_MIN_NCHANNELS": str(n), "NCCL_MAX_NCHANNELS": str(n)}


# Forced settings per collective. Tree exists for all_reduce only; the others' only ring-like
# algorithm is NCCL's default for them, so they sweep protocols and channels.
PROTOCOLS = {f"proto-{p.lower()}": {"NCCL_PROTO": p} for p in ("LL", "LL128", "Simple")}
CHANNELS = {f"channels-{n}": _channels(n) for n in (1, 2, 4, 8)}
ALGORITHMS = {"algo-ring": {"NCCL_ALGO": "Ring"}, "algo-tree": {"NCCL_ALGO": "Tree"}}
FORCED: dict[str, dict[str, dict[str, str]]] = {
    "all_reduce": {**ALGORITHMS, **PROTOCOLS, **CHANNELS},
    "all_gather": {**PROTOCOLS, **CHANNELS},
    "reduce_scatter": {**PROTOCOLS, **CHANNELS},
}


@dataclass(frozen=True)
class Profile:
    name: str
    worlds: tuple[int, ...]
    sizes: tuple[int, ...]
    ops: tuple[str, ...] = tuple(FORCED)


# 1 KiB .. 256 MiB in x16 steps: latency-bound, the crossover region, and the seed's 256 MiB.
GPU = Profile("gpu", worlds=(2, 4, 8), sizes=tuple(KiB * 16**i for i in range(5)) + (256 * MiB,))
PROFILES = {"gpu": GPU}


@dataclass(frozen=True)
class TunerCase:
    op: str
    world: int
    size: int
    sizes: tuple[int, ...]   # the sweep one launch per setting measures

    @property
    def settings(self) -> tuple[str, ...]:
        return (DEFAULT, *FORCED[self.op])


def launch_env(setting: str, op: str) -> dict[str, str]:
    """The environment of one setting's launch (the planted bad default while the knob is on)."""
    if setting == DEFAULT:
        forced = PLANTED_BAD_DEFAULT if mutations.active("nccl_bad_default") else {}
    else:
        forced = FORCED[op][setting]
    return {**ALWAYS, **forced}


def cases(profile: Profile) -> list[Case]:
    sizes = tuple(profile.sizes)
    return [Case(f"nccl-{world}gpu-{op}-{size_label(size)}", TunerCase(op, world, size, sizes), (f"{world}gpu",),
                 f"nccl-tuner-{world}gpu")
            for op in profile.ops for world in profile.worlds for size in sizes]


def measure(runs, case: Case) -> dict[str, Any]:
    """Per setting: every rank's raw samples at ``case``'s size, or ``{"unavailable": reason}``. One
    launch per setting measures every size of the sweep not cached yet."""
    from perfgate.launch.jobs import WorkerFailure, launch

    c: TunerCase = case.values

    def key(setting, size):
        return ("nccl_tuner", c.op, c.world, setting, size)

    def produce(missing) -> dict:
        sizes = sorted({k[-1] for k in missing})
        spec = CollectiveSpec(op=c.op, sizes=tuple(sizes))
        out = {}
        for setting in c.settings:
            try:
                per_rank = launch(collectives.TARGET, spec, world_size=c.world, backend="nccl",
                                  timeout_s=120 + 30 * len(sizes), env=launch_env(setting, c.op))
            except WorkerFailure as exc:
                if setting == DEFAULT:
                    raise
                reason = (str(exc).strip().splitlines() or ["failed"])[-1]
                out.update({key(setting, size): {"unavailable": reason} for size in sizes})
                continue
            out.update({key(setting, size): [rank[i] for rank in per_rank] for i, size in enumerate(sizes)})
        return out
    keys = [key(s, c.size) for s in c.settings]
    got = runs.get_many(keys, produce, batch=[key(s, size) for size in c.sizes for s in c.settings])
    return dict(zip(c.settings, got))


def _median(values) -> float:
    return summarize(values).median


def reduce(case: Case, raw: Mapping[str, Any]) -> list[Record]:
    """Each setting's busbw (the collectives reduce: slowest rank per sample, wrong elements must be
    0), then the default's per sample over the best forced setting's median."""
    c: TunerCase = case.values
    check(DEFAULT in raw and "unavailable" not in raw[DEFAULT], f"{case.id}: the default setting was not measured")
    as_collective = Case(case.id, CollectiveCase(c.op, "nccl", c.world, None, c.size, c.sizes), case.marks)
    busbw: dict[str, list[float]] = {}
    unavailable: dict[str, str] = {}
    for setting, per_rank in raw.items():
        if isinstance(per_rank, dict):
            unavailable[setting] = per_rank["unavailable"]
            continue
        try:
            records = collectives.reduce(as_collective, per_rank)
        except CheckFailed as exc:
            raise CheckFailed(f"{case.id} under {setting} ({launch_env(setting, c.op)}): {exc}") from None
        busbw[setting] = next(r.samples for r in records if isinstance(r, Measured) and r.name == "busbw_gbps")
    forced = {s: _median(v) for s, v in busbw.items() if s != DEFAULT}
    check(bool(forced), f"{case.id}: no forced setting ran ({unavailable}): nothing to compare the default with")
    best = max(forced, key=forced.get)
    out = [Measured("default_over_best_busbw", [b / forced[best] for b in busbw[DEFAULT]], "x", "higher")]
    out += [Measured(f"busbw_gbps_{s.replace('-', '_')}", v, "GB/s", "higher") for s, v in busbw.items()]
    out.append(Attached("tuner", {"best_forced": best, "median_busbw_gbps": {s: _median(v) for s, v in busbw.items()},
                                  "unavailable": unavailable, "env": {s: launch_env(s, c.op) for s in raw}}))
    return out


AREA: Area[Profile, RunCache, dict] = Area("nccl_tuner", PROFILES, cases, measure, reduce)
