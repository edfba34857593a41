"""Training-parallelism workloads: one GPT model, DDP and FSDP engines, validated specs.

The modules run inside :func:`perfgate.launch.jobs.launch` workers and never import pytest:
``model`` (the decoder and synthetic data), ``specs`` (validated job descriptions),
``engine`` (the shared warm-up / timed / memory-tracked step loop), ``ddp`` and ``fsdp``
(build the parallel wrapper for one case and hand its step to the engine), ``summary``
(pure arithmetic over the per-rank results), ``plans`` (which cases a session runs) and
``records`` (the area's reduce: per-rank results -> what each test records).

This file is the area: the cases of every DDP and FSDP test, and ``measure``: the raw per-rank
results of the job cases one test reads, from the session's run cache (one launch per
(engine, profile, world size) measures every case of that job).
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.runcache import RunCache
from perfgate.workloads.area import Area, Case, PerRank
from perfgate.workloads.training import memory_need, plans, records
from perfgate.workloads.training.records import TrainingRaw, world1
from perfgate.workloads.training.specs import BF16_HOOK_NEEDS_NCCL, ShardingMode

TARGETS = {"ddp": "perfgate.workloads.training.ddp:run", "fsdp": "perfgate.workloads.training.fsdp:run"}
PROFILES = {p.name: p for p in plans.PROFILES}


@dataclass(frozen=True)
class TrainingCase:
    """What one DDP or FSDP test reads: job case ``label`` of the (engine, profile, world) launch,
    the cases it is compared with (``reads``), and whether it is compared with itself at world 1."""

    engine: str                     # "ddp" | "fsdp"
    profile: plans.Profile
    world: int
    label: str
    reads: tuple[str, ...] = ()
    reference_world1: bool = False


def cases(profile: plans.Profile) -> list[Case]:
    """Every DDP and FSDP case of ``profile``; ``kind`` names the test (records.RECIPES)."""
    p = profile

    def case(kind: str, engine: str, world: int, label: str, *id_parts: str, reads: tuple[str, ...] = (),
             reference_world1: bool = False, skip: str | None = None, micro_batch: int | None = None,
             unsharded_copy: bool = False) -> Case:
        model = p.ddp_model if engine == "ddp" else p.fsdp_model
        ident = "-".join([f"{p.backend}-{world}rank-{model}", *id_parts])
        mb = micro_batch or (p.micro_batch if engine == "ddp" else p.fsdp_micro_batch)
        need = memory_need.need_gib(model, mb, unsharded_copy=unsharded_copy) if p.gpu else None
        return Case(ident, TrainingCase(engine, p, world, label, reads, reference_world1), (p.marker(world),),
                    f"training-{p.backend}", skip, kind, device_memory_gib=need)

    scaling = [w for w in p.worlds if w > 1]
    out = [case("strong", "ddp", w, "strong", reference_world1=True) for w in scaling]
    out += [case("weak", "ddp", w, "weak", reference_world1=True) for w in scaling]
    out += [case("microbatch", "ddp", w, f"mb{m}", f"mb{m}", reference_world1=w > 1, micro_batch=m)
            for w in p.microbatch_worlds for m in p.microbatches]
    reference = plans.bucket_label(p.bucket_reference_mb)
    out += [case("bucket", "ddp", w, plans.bucket_label(c), plans.bucket_label(c), reads=(reference,))
            for w in p.sweep_worlds for c in p.bucket_caps_mb]
    ga = f"ga{p.accum_steps}"
    out += [case("accumulation", "ddp", w, f"{ga}-{mode}", f"{ga}-{mode}", reads=(f"{ga}-no_sync", f"{ga}-sync_every_micro"))
            for w in p.sweep_worlds for mode in ("no_sync", "sync_every_micro")]
    out += [case("comm_hook", "ddp", w, f"hook-{dt}", dt, reads=("hook-fp32",),
                 skip=None if (dt != "bf16" or p.gpu) else BF16_HOOK_NEEDS_NCCL + "; gloo here")
            for w in p.sweep_worlds for dt in p.hook_reduce_dtypes]
    ddp_fp32 = ShardingMode("ddp", "fp32").label  # the fp16-hook DDP row's reference
    for w in p.fsdp_worlds:
        job = plans.fsdp_job(p, w)
        out += [case("fsdp_memory", "fsdp", w, m.label, m.kind, unsharded_copy=m.keeps_gathered_weights)
                for m in job.modes if job.tracks(m) and m.is_default_wrapping]
    for w in p.fsdp_worlds:
        out += [case("fsdp_throughput", "fsdp", w, m.label, m.label, reads=(ddp_fp32,),
                     unsharded_copy=m.keeps_gathered_weights)
                for m in plans.fsdp_job(p, w).modes if m.is_default_wrapping]
    for kind, differs in (("fsdp_wrap", lambda m: m.wrap != "block"), ("fsdp_prefetch", lambda m: not m.backward_prefetch)):
        for w in p.fsdp_worlds:  # the step anatomy: a default mode against its one changed setting
            out += [case(kind, "fsdp", w, ShardingMode(m.kind, m.reduce_dtype).label, m.kind, reads=(m.label,),
                         unsharded_copy=m.keeps_gathered_weights)
                    for m in plans.fsdp_job(p, w).modes if differs(m)]
    return out


def job(engine: str, profile: plans.Profile, world: int):
    """The validated job of one launch: every case ``profile`` measures at ``world`` ranks."""
    return plans.ddp_job(profile, world) if engine == "ddp" else plans.fsdp_job(profile, world)


def _labels(engine: str, j) -> list[str]:
    return [c.label for c in j.cases + j.reference_cases] if engine == "ddp" else [m.label for m in j.modes]


def launch_job(engine: str, profile: plans.Profile, j) -> dict[str, PerRank]:
    """One launch of job ``j``: {case label: every rank's CaseResult of it, in rank order}."""
    from perfgate.launch.jobs import launch

    # One thread per rank: ranks share the cores, and world 1 must not get more of them.
    env = {"OMP_NUM_THREADS": "1"} if profile.backend == "gloo" else {}
    return by_case(launch(TARGETS[engine], j, world_size=j.world_size, backend=profile.backend,
                          timeout_s=profile.launch_timeout_s, env=env))


def by_case(per_rank) -> dict[str, PerRank]:
    """launch() output (per rank, one CaseResult per case) -> {case label: every rank's result, in rank order}."""
    out: dict[str, PerRank] = {}
    for rank_results in per_rank:
        for res in rank_results:
            out.setdefault(res.label, []).append(res)
    return out


def _with_references(engine: str, j, labels) -> tuple[str, ...]:
    """FSDP modes come with the DDP mode they are compared with (same reduce dtype)."""
    if engine != "fsdp":
        return tuple(dict.fromkeys(labels))
    return tuple(dict.fromkeys(x for label in labels for x in (label, j.mode(label).reference.label)))


def launches_read(c: TrainingCase) -> list[tuple[int, tuple[str, ...]]]:
    """(world size, job case labels) of each launch whose results ``c`` reads, in the order
    :func:`measure` asks: its world-1 reference first when that is a launch of its own."""
    out = []
    if c.reference_world1 and not c.profile.reference_in_launch:
        out.append((1, (c.label,)))
    in_launch = (world1(c.label),) if c.reference_world1 and c.profile.reference_in_launch else ()
    out.append((c.world, tuple(dict.fromkeys((c.label, *c.reads, *in_launch)))))
    return out


def batch_labels(runs: RunCache, engine: str, profile: plans.Profile, world: int, j) -> list[str]:
    """What one launch of job ``j`` measures: the cases the session's selected tests read, in job
    order (every case when the selection is not known). A session of one selected case launches
    that case, not its whole job: on the GPU a 1.3 B job of four micro-batches takes ~90 s."""
    everything = _labels(engine, j)
    if runs.selected_cases is None:
        return everything
    wanted = {label for c in runs.selected_cases if isinstance(c, TrainingCase)
              and (c.engine, c.profile.name) == (engine, profile.name)
              for w, labels in launches_read(c) if w == world for label in labels}
    wanted = set(_with_references(engine, j, [x for x in everything if x in wanted]))
    return [x for x in everything if x in wanted]


def results(runs: RunCache, engine: str, profile: plans.Profile, world: int, *labels: str) -> dict[str, PerRank]:
    """The raw per-rank results of the cases ``labels`` of the (engine, profile, world) job.

    The first ask launches every case of the job the session's selected tests read at once
    (:func:`batch_labels`); after a re-measurement dropped some entries, only those cases are
    launched again. FSDP modes come with the DDP mode they are compared with (same reduce dtype).
    """
    j = job(engine, profile, world)  # validated here, before any rank starts
    labels = _with_references(engine, j, labels)

    def key(label):
        return ("training", engine, profile.name, world, label)

    def produce(missing):
        got = launch_job(engine, profile, j.only([k[-1] for k in missing]))
        return {key(label): per_rank for label, per_rank in got.items()}
    values = runs.get_many([key(label) for label in labels], produce,
                           batch=[key(x) for x in batch_labels(runs, engine, profile, world, j)])
    return dict(zip(labels, values))


def measure(runs: RunCache, case: Case) -> TrainingRaw:
    """Every rank's results of the cases ``case`` reads; its world-1 reference as ``world1-<label>``:
    run on rank 0 alone inside the world-N launch (``profile.reference_in_launch``), or a
    world-1 launch of its own."""
    c: TrainingCase = case.values
    got: dict[str, PerRank] = {}
    for world, labels in launches_read(c):
        if world != c.world:
            got[world1(c.label)] = results(runs, c.engine, c.profile, world, *labels)[c.label]
        else:
            got.update(results(runs, c.engine, c.profile, world, *labels))
    return got


AREA: Area[plans.Profile, RunCache, TrainingRaw] = Area("training", PROFILES, cases, measure, records.reduce)
