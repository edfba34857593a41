"""Pipeline, tensor and sequence parallelism workloads (issue 9).

Modules, each with one job, none importing pytest:
``layout`` (the validated TP x PP x DP layout), ``bubble`` (bubble theory and the arithmetic
that turns busy times into a measured bubble), ``stages`` (the shared GPT cut into pipeline
chunks), ``chunk_timer`` (busy-time brackets around a stage's chunk computations),
``torch_pp`` (torch.distributed.pipelining worker, CPU/gloo and GPU/NCCL), ``series``
(per-rank raw timings -> per-M series and the M trend), ``megatron_common`` (Megatron-Core
set-up shared by the two Megatron workers), ``megatron_norm`` (a LayerNorm that lets the
local spec run sequence parallelism without Apex), ``megatron_pp`` (1F1B and interleaved
schedules) and ``megatron_tp`` (TP/DP, sequence parallelism, full recompute). Megatron runs
on CUDA only. This file is the area (profiles, cases, ``measure``: the raw per-rank results of
one launch from the run cache); ``records`` is its ``reduce``: raw results -> what tests record.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfgate.runcache import RunCache
from perfgate.workloads.area import Area, Case, PerRank
from perfgate.workloads.pipeline import records
from perfgate.workloads.pipeline.layout import ParallelLayout

MS = (1, 4, 16)
TARGETS = {"torch": "perfgate.workloads.pipeline.torch_pp:run_many",
           "megatron": "perfgate.workloads.pipeline.megatron_pp:run_many"}
TP_TARGET = "perfgate.workloads.pipeline.megatron_tp:run"


@dataclass(frozen=True)
class Profile:
    """One engine on one machine class: which schedules at which PP degrees, and the step sizes."""

    name: str
    engine: str                          # "torch" | "megatron"
    backend: str
    pps: tuple[int, ...]
    virtual: tuple[tuple[str, int], ...]  # schedule -> model chunks per rank, in test order
    micro_batch_size: int = 2
    dtype: str = "bfloat16"
    warmup_steps: int = 2
    measured_steps: int = 6

    @property
    def schedules(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.virtual)

    def virtual_stages(self, schedule: str) -> int:
        return dict(self.virtual)[schedule]

    def num_layers(self) -> int:
        if self.engine == "megatron":
            from perfgate.workloads.pipeline.megatron_common import PP_MODEL
            return PP_MODEL.num_layers
        return self.model().n_layer

    def model(self):
        from perfgate.workloads.pipeline.stages import CPU_CONFIG, GPU_CONFIG
        return CPU_CONFIG if self.backend == "gloo" else GPU_CONFIG

    def valid_ms(self, schedule: str, pp: int) -> tuple[int, ...]:
        """The M of ``MS`` that the engine's schedule accepts at this PP (1F1B refuses M < PP...)."""
        ok = []
        for m in MS:
            try:
                ParallelLayout(world_size=pp, pp=pp, microbatches=m, virtual_stages=self.virtual_stages(schedule),
                               schedule=schedule, engine=self.engine, num_layers=self.num_layers())
            except ValueError:
                continue
            ok.append(m)
        return tuple(ok)

    def spec(self, schedule: str, pp: int):
        """The validated spec of one (schedule, PP) run: fails here, before any rank starts."""
        v, ms = self.virtual_stages(schedule), self.valid_ms(schedule, pp)
        if self.engine == "megatron":
            from perfgate.workloads.pipeline.megatron_pp import MegatronPipelineSpec
            return MegatronPipelineSpec(pp=pp, schedule=schedule, microbatches=ms, virtual_stages=v)
        from perfgate.workloads.pipeline.torch_pp import TorchPipelineSpec
        return TorchPipelineSpec(pp=pp, schedule=schedule, model=self.model(), microbatches=ms, virtual_stages=v,
                                 micro_batch_size=self.micro_batch_size, dtype=self.dtype,
                                 warmup_steps=self.warmup_steps, measured_steps=self.measured_steps)

    def run_id(self, schedule: str, pp: int) -> str:
        v = self.virtual_stages(schedule)
        return f"{self.engine}-{schedule}-{self.backend}-pp{pp}" + (f"-v{v}" if v > 1 else "")

    def marks(self, pp: int) -> tuple[str, ...]:
        hw = "cpu" if self.backend == "gloo" else f"{pp}gpu"
        return ("megatron", hw) if self.engine == "megatron" else (hw,)

    def group(self, pp: int) -> str:  # one launch per group
        return f"megatron-pp{pp}" if self.engine == "megatron" else f"torch-pipeline-{self.backend}-pp{pp}"

    def runs(self) -> list[tuple[str, int]]:
        if self.engine == "megatron":
            return [(s, p) for s in self.schedules for p in self.pps if self.valid_ms(s, p)]
        return [(s, p) for s in self.schedules for p in self.pps]


_TORCH_VIRTUAL = (("gpipe", 1), ("1f1b", 1), ("interleaved-1f1b", 2))
# CPU: gloo, PP 2 and 4, one process per stage, the 8-layer CPU GPT in fp32; the correctness
# check step warms up. GPU: NCCL, PP 2/4/8, the seed report's 163M PP model in bf16.
TORCH_CPU = Profile("torch-cpu", "torch", "gloo", (2, 4), _TORCH_VIRTUAL, micro_batch_size=4, dtype="float32",
                    warmup_steps=0, measured_steps=5)
TORCH_GPU = Profile("torch-gpu", "torch", "nccl", (2, 4, 8), _TORCH_VIRTUAL)
MEGATRON_GPU = Profile("megatron-gpu", "megatron", "nccl", (2, 4, 8), (("1f1b", 1), ("interleaved-1f1b", 2)))
PROFILES = {p.name: p for p in (TORCH_CPU, TORCH_GPU, MEGATRON_GPU)}


@dataclass(frozen=True)
class PipelineCase:
    """One (schedule, PP) run of a profile; ``m`` set: one M of it (the per-M bubble tests)."""

    profile: Profile
    schedule: str
    pp: int
    m: int | None = None


@dataclass(frozen=True)
class TPLaunch:
    """Megatron TP/DP with SP on and off (``recompute=False``), or full recompute on and off at
    LONG_SEQ with TP=2 (``recompute=True``), on ``gpus`` GPUs: every case of it in one launch."""

    gpus: int
    recompute: bool

    def spec(self):
        from perfgate.workloads.pipeline.megatron_common import TP_MODEL
        from perfgate.workloads.pipeline.megatron_tp import MegatronTPSpec

        if self.recompute:
            return MegatronTPSpec(world_size=self.gpus, cases=recompute_cases(self.gpus),
                                  model=TP_MODEL.with_seq_len(LONG_SEQ))
        return MegatronTPSpec(world_size=self.gpus, cases=tp_cases(self.gpus), model=TP_MODEL)


LONG_SEQ = 4096  # the seed's recompute sequence length (seed §7.5)


def cases(profile: Profile) -> list[Case]:
    """Per (schedule, PP): one ``bubble`` case per M, a ``trend`` case where at least two M run, and
    (torch) a ``matches`` case, the single-process correctness check; Megatron's kinds are
    ``megatron_``-prefixed and its profile adds the TP/SP and recompute launches per GPU count."""
    prefix = "megatron_" if profile.engine == "megatron" else ""
    out = []
    for schedule, pp in profile.runs():
        ms = profile.valid_ms(schedule, pp)
        ident, marks, group = profile.run_id(schedule, pp), profile.marks(pp), profile.group(pp)
        out += [Case(f"{ident}-m{m}", PipelineCase(profile, schedule, pp, m), marks, group, kind=prefix + "bubble")
                for m in ms]
        if len(ms) >= 2:
            out.append(Case(ident, PipelineCase(profile, schedule, pp), marks, group, kind=prefix + "trend"))
        if profile.engine == "torch":
            out.append(Case(ident, PipelineCase(profile, schedule, pp), marks, group, kind="matches"))
    if profile.engine == "megatron":
        from perfgate.workloads.pipeline.megatron_common import TP_MODEL

        for g in profile.pps:
            out.append(Case(f"{g}gpu-seq{TP_MODEL.seq_len}", TPLaunch(g, recompute=False), ("megatron", f"{g}gpu"),
                            f"megatron-tp-{g}gpu", kind="megatron_tp_sp"))
            out.append(Case(f"{g}gpu-tp2-seq{LONG_SEQ}", TPLaunch(g, recompute=True), ("megatron", f"{g}gpu"),
                            f"megatron-rc-{g}gpu", kind="megatron_recompute"))
    return out


@dataclass
class LaunchRaw:
    """One spec's raw results as the ranks returned them, plus (Megatron bubble cases) the PP=1
    reference launch's: what :func:`perfgate.workloads.pipeline.records.reduce` combines."""

    spec: Any
    per_rank: PerRank[dict]
    reference: LaunchRaw | None = None


def _measure_run(runs, profile: Profile, schedule: str, pp: int) -> LaunchRaw:
    """One schedule at one PP. Every schedule of that PP runs in one launch (rank start-up costs
    seconds); a re-measurement launches only its own schedule."""
    from perfgate.launch.jobs import launch

    def key(s):
        return ("pipeline", profile.name, s, pp)

    def produce(missing):
        # In the profile's order, whichever was asked first; validated before any rank starts.
        specs = tuple(profile.spec(s, pp) for s in profile.schedules if key(s) in missing)
        env = {"OMP_NUM_THREADS": "1"} if profile.backend == "gloo" else None
        per_rank = launch(TARGETS[profile.engine], specs, world_size=pp, backend=profile.backend, timeout_s=900,
                          env=env)
        return {key(spec.schedule): LaunchRaw(spec, [rank[i] for rank in per_rank]) for i, spec in enumerate(specs)}
    schedules = [s for s in profile.schedules if profile.valid_ms(s, pp)]
    return runs.get_many([key(schedule)], produce, batch=[key(s) for s in schedules])[0]


def _measure_pp1(runs) -> LaunchRaw:
    """Megatron at PP=1 on one GPU (no-pipelining schedule): the speedup reference."""
    from perfgate.launch.jobs import launch
    from perfgate.workloads.pipeline.megatron_pp import MegatronPipelineSpec

    def produce():
        spec = MegatronPipelineSpec(pp=1, schedule="1f1b", microbatches=MS)
        per_rank = launch(TARGETS["megatron"], (spec,), world_size=1, backend="nccl", timeout_s=900)
        return LaunchRaw(spec, [rank[0] for rank in per_rank])
    return runs.get(("pipeline", "megatron-pp1"), produce)


def measure(runs, case: Case) -> LaunchRaw:
    """The raw results ``case`` reads, from the session's run cache (launching what is missing)."""
    from perfgate.launch.jobs import launch

    if isinstance(case.values, TPLaunch):
        spec = case.values.spec()
        return runs.get(("pipeline", "megatron-tp", spec), lambda: LaunchRaw(
            spec, launch(TP_TARGET, spec, world_size=spec.world_size, backend="nccl", timeout_s=900)))
    c: PipelineCase = case.values
    raw = _measure_run(runs, c.profile, c.schedule, c.pp)
    if case.kind == "megatron_bubble":
        return LaunchRaw(raw.spec, raw.per_rank, reference=_measure_pp1(runs))
    return raw


AREA: Area[Profile, RunCache, LaunchRaw] = Area("pipeline", PROFILES, cases, measure, records.reduce)


def tp_cases(gpus: int) -> tuple:
    """Every (TP, DP) with TP x DP = gpus; SP off and on for TP >= 2 (seed §7.1)."""
    from perfgate.workloads.pipeline.megatron_common import TP_MODEL
    from perfgate.workloads.pipeline.megatron_tp import TPCase

    cases_, tp = [], 1
    while tp <= gpus:
        if gpus % tp == 0 and TP_MODEL.num_attention_heads % tp == 0:
            cases_.append(TPCase(tp, gpus // tp, sequence_parallel=False))
            if tp >= 2:
                cases_.append(TPCase(tp, gpus // tp, sequence_parallel=True))
        tp *= 2
    return tuple(cases_)


def recompute_cases(gpus: int) -> tuple:
    """TP=2 (the seed's smallest TP), DP = gpus / 2: recompute off/on, with SP off and on (seed §7.5)."""
    from perfgate.workloads.pipeline.megatron_tp import TPCase

    return tuple(TPCase(2, gpus // 2, sequence_parallel=sp, recompute=rc)
                 for sp in (False, True) for rc in (False, True))
