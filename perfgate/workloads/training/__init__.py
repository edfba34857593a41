"""Training-parallelism workloads: one GPT model, DDP and FSDP engines, validated specs.

The modules run inside :func:`perfgate.launch.jobs.launch` workers and never import pytest:
``model`` (the decoder and synthetic data), ``specs`` (validated job descriptions),
``engine`` (the shared warm-up / timed / memory-tracked step loop), ``ddp`` and ``fsdp``
(build the parallel wrapper for one case and hand its step to the engine), ``summary``
(pure arithmetic over the per-rank results) and ``plans`` (which cases a session runs).
"""
from __future__ import annotations

from perfgate.workloads.area import Area, Case
from perfgate.workloads.training import plans
from perfgate.workloads.training.summary import CaseSummary, summarize_job

TARGETS = {"ddp": "perfgate.workloads.training.ddp:run", "fsdp": "perfgate.workloads.training.fsdp:run"}
PROFILES = {p.name: p for p in plans.PROFILES}


def cases(profile: plans.Profile) -> list[Case]:
    """Every DDP scaling case of ``profile`` (the other tests parametrize over plans' sweeps)."""
    return [Case(f"{profile.backend}-{w}rank-{profile.ddp_model}", (profile, w), (profile.marker(w),),
                 f"training-{profile.backend}") for w in profile.worlds if w > 1]


def reduce(per_rank) -> dict[str, CaseSummary]:
    """launch() output (per rank: one CaseResult per case) -> {label: CaseSummary}: slowest rank per
    step, largest memory per step, every rank's losses (perfgate.workloads.training.summary)."""
    return summarize_job(per_rank)


AREA = Area("training", PROFILES, cases, reduce)


def job(engine: str, profile: plans.Profile, world: int):
    """The validated job of one launch: every case ``profile`` measures at ``world`` ranks."""
    return plans.ddp_job(profile, world) if engine == "ddp" else plans.fsdp_job(profile, world)


def _labels(engine: str, j) -> list[str]:
    return [c.label for c in j.cases + j.reference_cases] if engine == "ddp" else [m.label for m in j.modes]


def launch_job(engine: str, profile: plans.Profile, j) -> dict[str, CaseSummary]:
    from perfgate.launch.jobs import launch

    # One thread per rank: ranks share the cores, and world 1 must not get more of them.
    env = {"OMP_NUM_THREADS": "1"} if profile.backend == "gloo" else {}
    return reduce(launch(TARGETS[engine], j, world_size=j.world_size, backend=profile.backend,
                         timeout_s=profile.launch_timeout_s, env=env))


def measure(runs, engine: str, profile: plans.Profile, world: int, *labels: str) -> dict[str, CaseSummary]:
    """The cases ``labels`` of the (engine, profile, world) job, from the session's run cache.

    The first ask launches every case of the job at once; after a re-measurement dropped some
    entries, only those cases are launched again. FSDP modes come with the DDP mode they are
    compared with (same reduce dtype).
    """
    j = job(engine, profile, world)  # validated here, before any rank starts
    if engine == "fsdp":
        labels = tuple(dict.fromkeys(x for label in labels for x in (label, j.mode(label).reference.label)))

    def key(label):
        return ("training", engine, profile.name, world, label)

    def produce(missing):
        got = launch_job(engine, profile, j.only([k[-1] for k in missing]))
        return {key(label): s for label, s in got.items()}
    values = runs.get_many([key(label) for label in labels], produce, batch=[key(x) for x in _labels(engine, j)])
    return dict(zip(labels, values))


def scaling_pair(runs, profile: plans.Profile, world: int, label: str) -> tuple[CaseSummary, CaseSummary]:
    """(world-1 reference, world-N case) for a DDP case ``label``, both from this session.

    With ``profile.reference_in_launch`` the reference ran on rank 0 alone inside the world-N
    launch (case ``world1-<label>``); otherwise it comes from a world-1 launch.
    """
    if profile.reference_in_launch:
        got = measure(runs, "ddp", profile, world, label, f"world1-{label}")
        return got[f"world1-{label}"], got[label]
    return measure(runs, "ddp", profile, 1, label)[label], measure(runs, "ddp", profile, world, label)[label]
