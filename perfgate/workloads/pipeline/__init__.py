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
on CUDA only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from perfgate.workloads.area import Area, Case
from perfgate.judge.metrics import paired_ratio
from perfgate.workloads.pipeline.layout import ParallelLayout

MS = (1, 4, 16)
# Trend invariant, on each M's least-disturbed iteration (series.Trend.falls): the bubble must
# fall from the smallest to the largest M by at least this share of the theoretical drop (a
# serialised schedule, or brackets that see no work, measure ~0 drop), and may not rise by more
# than RISE_SLACK between neighbouring M (noise of a loaded 2-core machine; theory only falls).
MIN_DROP_FRACTION = 0.20
RISE_SLACK = 0.05
# On CPU the trend is held to MIN_DROP_FRACTION only where theory's drop is large enough for the
# bubble's absolute noise there (+-0.05..0.1) to stay a fraction of it: GPipe and interleaved
# (M 1 -> 16), not 1F1B (M 4 -> 16: a drop of 0.14 at PP=2). Below it only the direction is
# asserted: the bubble must not grow with M (seen there: a 0.025 drop).
CPU_MIN_THEORY_DROP = 0.3
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


def cases(profile: Profile, level: str = "m") -> list[Case]:
    """Test arguments per M (``level="m"``: backend?, schedule, pp, m), per run (``"run"``) or per
    run with at least two M (``"trend"``). Torch cases start with the backend; Megatron's do not."""
    out = []
    for schedule, pp in profile.runs():
        ms = profile.valid_ms(schedule, pp)
        head = (profile.backend, schedule, pp) if profile.engine == "torch" else (schedule, pp)
        ident, marks, group = profile.run_id(schedule, pp), profile.marks(pp), profile.group(pp)
        if level == "m":
            out += [Case(f"{ident}-m{m}", (*head, m), marks, group) for m in ms]
        elif level == "run" or (level == "trend" and len(ms) >= 2):
            out.append(Case(ident, head, marks, group))
    return out


@dataclass
class PipelineRun:
    """One schedule at one PP degree, reduced: what the tests record, plus the raw per-rank results
    (for correctness checks and attachments)."""

    spec: Any
    per_rank: list[dict]
    series: dict           # {M: series.MSeries}: every rank's busy and step times combined per iteration
    stage_params: list[int]
    param_imbalance: float

    def by_rank(self, m: int, key: str) -> list:
        """``key`` of M's record on every rank, in rank order (diagnostics, not a combined figure)."""
        k = list(self.series).index(m)
        return [r["runs"][k][key] for r in self.per_rank]


def reduce(per_rank, specs) -> list[PipelineRun]:
    """One launch of several specs (per rank: one result per spec) -> one PipelineRun per spec."""
    from perfgate.workloads.pipeline import series as series_mod

    out = []
    for i, spec in enumerate(specs):
        results = [rank_results[i] for rank_results in per_rank]
        series = series_mod.series_by_m(results, pp=spec.pp, virtual_stages=spec.virtual_stages,
                                     tokens_per_microbatch=spec.tokens_per_microbatch)
        out.append(PipelineRun(spec, results, series, series_mod.stage_params(results),
                                   series_mod.param_imbalance(results)))
    return out


def reduce_tp(per_rank, spec) -> dict[str, dict]:
    """Megatron TP/recompute launch -> per case: the slowest rank's step time, the largest rank's
    peak memory, tokens/s from the slowest step; losses as rank 0 saw them."""
    out = {}
    for i, case in enumerate(spec.cases):
        rows = [r["cases"][i] for r in per_rank]
        rec = dict(rows[0])
        rec["step_s"] = [max(col) for col in zip(*(r["step_s"] for r in rows))]
        rec["peak_alloc_gib"] = [max(col) for col in zip(*(r["peak_alloc_gib"] for r in rows))]
        rec["tokens_per_s"] = [spec.tokens_per_step / s for s in rec["step_s"]]
        out[case.name] = rec
    return out


AREA = Area("pipeline", PROFILES, cases, reduce)


def measure(runs, profile: Profile, schedule: str, pp: int) -> PipelineRun:
    """One schedule at one PP. Every schedule of that PP runs
    in one launch (rank start-up costs seconds); a re-measurement launches only its own schedule."""
    from perfgate.launch.jobs import launch

    def key(s):
        return ("pipeline", profile.name, s, pp)

    def produce(missing):
        # In the profile's order, whichever was asked first; validated before any rank starts.
        specs = tuple(profile.spec(s, pp) for s in profile.schedules if key(s) in missing)
        env = {"OMP_NUM_THREADS": "1"} if profile.backend == "gloo" else None
        per_rank = launch(TARGETS[profile.engine], specs, world_size=pp, backend=profile.backend, timeout_s=900,
                          env=env)
        return {key(run.spec.schedule): run for run in reduce(per_rank, specs)}
    schedules = [s for s in profile.schedules if profile.valid_ms(s, pp)]
    return runs.get_many([key(schedule)], produce, batch=[key(s) for s in schedules])[0]


def measure_pp1(runs):
    """Megatron at PP=1 on one GPU (no-pipelining schedule): the speedup reference, ``{M: MSeries}``."""
    from perfgate.launch.jobs import launch
    from perfgate.workloads.pipeline.megatron_pp import MegatronPipelineSpec

    def produce():
        spec = MegatronPipelineSpec(pp=1, schedule="1f1b", microbatches=MS)
        return reduce(launch(TARGETS["megatron"], (spec,), world_size=1, backend="nccl", timeout_s=900),
                      (spec,))[0].series
    return runs.get(("pipeline", "megatron-pp1"), produce)


def measure_tp(runs, spec) -> dict[str, dict]:
    """Every case of a Megatron TP/recompute spec, from one launch."""
    from perfgate.launch.jobs import launch

    return runs.get(("pipeline", "megatron-tp", spec), lambda: reduce_tp(
        launch(TP_TARGET, spec, world_size=spec.world_size, backend="nccl", timeout_s=900), spec))


def min_drop_fraction(profile: Profile, trend) -> float:
    """The share of theory's drop from M_lo to M_hi the measured bubble must show (Trend.falls)."""
    small = profile.backend == "gloo" and trend.theory_lo - trend.theory_hi < CPU_MIN_THEORY_DROP
    return 0.0 if small else MIN_DROP_FRACTION


def speedup_vs_pp1(series, ref) -> list[float]:
    """Pipeline tokens/s over PP=1 tokens/s, step by step (the shorter run sets the count)."""
    return paired_ratio(series.tokens_per_s, ref.tokens_per_s, truncate=True)


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
