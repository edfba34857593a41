"""A serving workload as data, and the one driver that runs it against real `vllm serve` servers.

Why: as in vLLM's `bench serve`, every serving measurement is the same engine (start or reuse the
servers, send load phases, keep every request's raw timings, re-run repetitions a starved client
spoiled) over a small declarative spec. A :class:`ServingWorkload` says which servers a case
needs (:class:`ServerConfig`: model kind, prefix caching, a variant's flags), which load phases
one repetition runs on them (:class:`Phase`: the prompts, closed loop at C or an offered rate, the
/metrics counters to read around it, a second load at the same time, `vllm bench serve` side by
side), how many repetitions, and whether the servers run side by side (alternating, both up) or
one at a time (a GPU that holds one). :func:`drive` runs it and returns :class:`ServingRuns`: every
repetition's raw load results and per-run summaries, the servers' start-up facts, the waits for
quiet between servers. Turning those into metrics is the area's ``reduce``; this module records
nothing and knows no test.

Invariants every phase must hold are checked here, as the load returns: no failed request and,
with ``ignore_eos``, exactly the asked-for tokens per request (a server that stops early measures
a shorter answer, not a faster one).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Hashable, Mapping, Protocol, Sequence

from perfgate.workloads.area import check
from perfgate.workloads.serving.identity import served_workload
from perfgate.workloads.serving.loadgen import (LoadResult, LoadSpec, RequestSpec, long_prefill_requests,
                                                random_requests, run_load, run_loads_concurrently,
                                                shared_prefix_requests)
from perfgate.workloads.serving.prometheus_counters import PrefixCacheCounters, StepCounters, preemptions
from perfgate.workloads.serving.quiesce import wait_until_quiet
from perfgate.workloads.serving.serving_metrics import ServingSummary, summarize_run
from perfgate.workloads.serving.server_memory import MemoryWatch, ServerPeaks
from perfgate.workloads.serving.starvation import starved, unstarved_runs

if TYPE_CHECKING:
    from perfgate.workloads.serving import ServingProfile


# ---- what runs ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class ServerConfig:
    """One `vllm serve` configuration of a profile's model: a ``variant`` (``eager``, ``small-kv``,
    ``tp2``) is the default server plus ``extra_args``, a configuration (and a server) of its own."""

    kind: str = "dense"                  # the profile's "dense" or "moe" model
    prefix_caching: bool = True          # vLLM's default; False: --no-enable-prefix-caching
    variant: str = ""
    extra_args: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.kind not in ("dense", "moe"):
            raise ValueError(f"ServerConfig.kind must be 'dense' or 'moe', got {self.kind!r}")
        if bool(self.variant) != bool(self.extra_args):
            raise ValueError(f"a server variant names its flags and flags name their variant: variant "
                             f"{self.variant!r}, extra_args {self.extra_args!r}")

    @property
    def name(self) -> str:
        """``dense``, ``dense-no-prefix-cache``, ``dense-eager``, ``moe``: the configuration without its profile."""
        return self.kind + ("" if self.prefix_caching else "-no-prefix-cache") + (f"-{self.variant}" if self.variant else "")


DEFAULT_SERVER = ServerConfig()


@dataclass(frozen=True)
class Prompts:
    """The requests of one phase, built from the server's pool of ordinary token ids with a seed
    (loadgen's builders), so every prompt has an exact length on any tokenizer."""

    n: int
    input_len: int
    output_len: int
    shape: str = "random"           # "random" | "shared_prefix" (num_prefixes, suffix_len) | "long_prefill"
    tag: str = "random"
    num_prefixes: int = 0
    suffix_len: int = 0

    def __post_init__(self) -> None:
        if self.shape not in ("random", "shared_prefix", "long_prefill"):
            raise ValueError(f"Prompts.shape must be random, shared_prefix or long_prefill, got {self.shape!r}")
        if self.n < 1 or self.input_len < 1 or self.output_len < 1:
            raise ValueError(f"Prompts need n, input_len and output_len >= 1, got {self.n}, {self.input_len}, "
                             f"{self.output_len}")
        if self.shape == "shared_prefix" and not 1 <= self.num_prefixes <= self.n:
            raise ValueError(f"shared-prefix prompts need 1 <= num_prefixes <= n = {self.n}, got {self.num_prefixes}")

    def build(self, pool: Sequence[int], seed: int) -> tuple[RequestSpec, ...]:
        if self.shape == "shared_prefix":  # input_len is the shared prefix's length
            return shared_prefix_requests(pool, self.n, self.num_prefixes, self.input_len, self.suffix_len,
                                          self.output_len, seed=seed)
        if self.shape == "long_prefill":
            return long_prefill_requests(pool, self.n, self.input_len, self.output_len, seed=seed)
        return random_requests(pool, self.n, self.input_len, self.output_len, seed=seed, tag=self.tag)


@dataclass(frozen=True)
class FractionOf:
    """An offered rate: ``fraction`` x the median request throughput of the setup phases named ``setup``
    (the capacity measured in this run, so a sweep means the same on any hardware)."""

    setup: str
    fraction: float

    def rps(self, phase: "Phase", setup: Mapping[str, Sequence["PhaseRun"]],
            repetition: Mapping[str, "PhaseRun"]) -> float:
        return self.fraction * statistics.median(r.summary.request_throughput_rps for r in setup[self.setup])


@dataclass(frozen=True)
class SpreadOver:
    """An offered rate that spreads the phase's requests over ``share`` of the duration of the phase
    ``phase`` of the same repetition (long prompts arriving while decodes of that length run)."""

    phase: str
    share: float

    def rps(self, phase: "Phase", setup: Mapping[str, Sequence["PhaseRun"]],
            repetition: Mapping[str, "PhaseRun"]) -> float:
        return phase.prompts.n / max(0.05, self.share * repetition[self.phase].result.duration_s)


COUNTERS = ("steps", "prefix_cache", "preemptions")  # /metrics counters a phase can read before and after


@dataclass(frozen=True)
class Phase:
    """One load run against one server of the workload."""

    name: str                        # unique within a repetition ("at_c", "on-cold", "eager-C=4")
    server: str                      # a key of ServingWorkload.servers
    prompts: Prompts
    seed: int                        # the prompts' seed at repetition 0 ...
    seed_step: int = 1               # ... plus this per repetition (0: the same prompts every repetition)
    concurrency: int | None = None   # requests in flight at most (closed loop without a rate)
    rate: FractionOf | SpreadOver | None = None  # offered rate (open loop): gamma gaps, shape ``burstiness``
    burstiness: float = 1.0
    load_seed: int | None = None     # the arrival process's seed at repetition 0, +1 a repetition; None: the prompts'
    counters: tuple[str, ...] = ()   # COUNTERS to read around the run
    alongside: Phase | None = None   # a second load at the same time (its own prompts and rate), same server
    bench: bool = False              # `vllm bench serve` with the same shape side by side (its seed: the load's)
    step: Hashable = None            # phases of one step (on several servers) swap servers on odd repetitions

    def __post_init__(self) -> None:
        unknown = set(self.counters) - set(COUNTERS)
        if unknown:
            raise ValueError(f"phase {self.name!r}: unknown counters {sorted(unknown)}; known: {COUNTERS}")
        if self.concurrency is None and self.rate is None:
            raise ValueError(f"phase {self.name!r}: give a concurrency (closed loop) or a rate")

    def seeds(self, rep: int) -> tuple[int, int]:
        """(prompts seed, arrival seed) at repetition ``rep``."""
        prompts = self.seed + self.seed_step * rep
        return prompts, (prompts if self.load_seed is None else self.load_seed + rep)


STARVATION_RULES = {
    # any phase's median TPOT (or `vllm bench serve`'s beside it) too short to be a step: a starved client
    "median_tpot": lambda runs: starved(*(m for r in runs for m in r.tpot_medians())),
    # every answer of the run arrived in one read: no decode speed to compute
    "every_answer_at_once": lambda runs: any(not r.summary.decode_tok_s_values for r in runs),
}


@dataclass(frozen=True)
class ServingWorkload:
    """Servers, the phases of one repetition, and how repetitions run; validated before any server starts."""

    servers: Mapping[str, ServerConfig]   # name -> configuration; the first is the session's default
    phases: tuple[Phase, ...]             # one repetition, in order
    reps: int
    extra_reps: int = 0                   # re-runs allowed for repetitions with a starved client
    starved_when: str | None = None       # a key of STARVATION_RULES; None: every repetition is kept
    setup: tuple[Phase, ...] = ()         # run once, before the repetitions (the unloaded latency, the capacity)
    alternate: bool = False               # swap the servers' order within each step on odd repetitions
    side_by_side: bool = True             # False: one server at a time, its repetitions, then the next one's
    identify: str | None = None           # the server whose model and flags the results name (None: the first)
    watch_memory: bool = False            # sample the servers' memory while the phases run (ServingRuns.memory)

    def __post_init__(self) -> None:
        if not self.servers:
            raise ValueError("a serving workload needs at least one server")
        names = [p.name for p in self.phases]
        if not self.phases or len(set(names)) != len(names):
            raise ValueError(f"a repetition needs phases with unique names, got {names}")
        for p in (*self.setup, *self.phases, *(q.alongside for q in self.phases if q.alongside)):
            if p.server not in self.servers:
                raise ValueError(f"phase {p.name!r} runs on server {p.server!r}, not one of {list(self.servers)}")
        for p in self.phases:
            if isinstance(p.rate, SpreadOver) and p.rate.phase not in names[:names.index(p.name)]:
                raise ValueError(f"phase {p.name!r} spreads over phase {p.rate.phase!r}, which must run before it")
            if p.alongside is not None and isinstance(p.alongside.rate, SpreadOver) \
                    and p.alongside.rate.phase not in names[:names.index(p.name)]:
                raise ValueError(f"phase {p.name!r}: its second load spreads over {p.alongside.rate.phase!r}, "
                                 "which must run before it")
        setup_names = {p.name for p in self.setup}
        for p in (*self.phases, *(q.alongside for q in self.phases if q.alongside)):
            if isinstance(p.rate, FractionOf) and p.rate.setup not in setup_names:
                raise ValueError(f"phase {p.name!r} offers a fraction of setup phase {p.rate.setup!r}, not one of "
                                 f"{sorted(setup_names)}")
        if self.reps < 1 or self.extra_reps < 0:
            raise ValueError(f"reps must be >= 1 and extra_reps >= 0, got {self.reps}, {self.extra_reps}")
        if self.starved_when is not None and self.starved_when not in STARVATION_RULES:
            raise ValueError(f"starved_when must be one of {sorted(STARVATION_RULES)} or None, got {self.starved_when!r}")
        if self.identify is not None and self.identify not in self.servers:
            raise ValueError(f"identify names server {self.identify!r}, not one of {list(self.servers)}")

    @property
    def identified(self) -> str:
        return self.identify or next(iter(self.servers))

    def order(self, rep: int, names: Sequence[str] | None = None) -> list[Phase]:
        """The phases of repetition ``rep`` on the servers ``names`` (all), in the order they run: per
        step, each server's phases together, the servers in reverse on odd repetitions if ``alternate``."""
        servers = [s for s in self.servers if names is None or s in names]
        if self.alternate and rep % 2:
            servers.reverse()
        steps: dict[Hashable, list[Phase]] = {}
        for p in self.phases:
            if p.server in servers:
                steps.setdefault(p.step, []).append(p)
        return [p for group in steps.values() for s in servers for p in group if p.server == s]


# ---- what it needs: the servers -----------------------------------------------------------------

class Target(Protocol):
    """A running server as the driver loads it (fixtures/serving.py ServingTarget)."""

    server: Any          # VllmServer or attached.AttachedServer
    token_pool: list[int]
    label: str

    @property
    def base_url(self) -> str: ...
    @property
    def model(self) -> str: ...
    def load(self, requests, **kw) -> LoadSpec: ...


class ServerSource(Protocol):
    """Where the driver gets its servers: started or reused, at most ``keep_alive(n)`` up at once."""

    work_dir: Path       # files of this measurement (`vllm bench serve` results)

    def target(self, profile: ServingProfile, config: ServerConfig) -> Target: ...
    def keep_alive(self, n: int) -> None: ...


def start_servers(source: ServerSource, profile: ServingProfile, workload: ServingWorkload) -> None:
    """Start (or reuse) the servers the workload measures first, before it measures: side by side all of
    them, the session's default first (so the pool keeps it and stops another); one at a time the first.

    Why before: a server stopped while a test measures orphans its engine process (SIGTERM reaches the
    group, the engine outlives the API server and init reaps it), whose CPU time then leaves our process
    tree and reads as a foreign job's (test_compiled_vs_eager[cpu] was tainted so in two of two CI runs).
    The pytest fixture calls this in the test's setup; :func:`drive` calls it again (then a no-op)."""
    source.keep_alive(len(workload.servers) if workload.side_by_side else 1)
    for name in _first_servers(workload):
        source.target(profile, workload.servers[name])


def _first_servers(workload: ServingWorkload) -> list[str]:
    names = list(workload.servers)
    return names if workload.side_by_side else names[:1]


# ---- what it returns ----------------------------------------------------------------------------

@dataclass
class PhaseRun:
    """One phase as it ran: the raw load result, its summary, what the counters moved, the rate offered."""

    phase: Phase
    label: str                        # the server's configuration label (pool key)
    described: str                    # LoadSpec.describe(): the phase in messages and memory peaks
    result: LoadResult
    summary: ServingSummary
    counters: dict[str, float] = field(default_factory=dict)  # tokens_per_step, prefix_hit_tokens/_rate, preemptions
    offered_rps: float | None = None
    alongside: PhaseRun | None = None  # the second load of the same time (Phase.alongside), as it ran
    bench: dict | None = None         # `vllm bench serve`'s result JSON
    bench_file: Path | None = None

    def tpot_medians(self) -> list[float]:
        return [self.summary.tpot_ms.median] + ([self.bench["median_tpot_ms"]] if self.bench else [])


@dataclass
class Repetition:
    index: int
    order: tuple[str, ...]            # the servers in the order this repetition loaded them
    phases: dict[str, PhaseRun]
    starved: bool = False


@dataclass(frozen=True)
class ServerFacts:
    """A server as first used by the measurement: its start-up, the engine's own init and KV capacity."""

    label: str
    model: str
    startup_s: float
    engine_init_s: float | None
    kv_cache_tokens: int | None
    argv: tuple[str, ...]


@dataclass
class ServingRuns:
    """Everything one run of a workload measured (the area's ``reduce`` turns it into metrics)."""

    workload: ServingWorkload
    setup: dict[str, list[PhaseRun]]
    every: list[Repetition]           # in the order they ran, starved ones included
    kept: list[Repetition]            # the unstarved ones (merged per index when servers ran one at a time)
    servers: dict[str, ServerFacts]   # workload server name -> facts
    identity: dict[str, str]          # what the results name beyond the test id (perf.identify)
    quiet_waits: list[dict]
    memory: dict[str, ServerPeaks] = field(default_factory=dict)

    def kept_phase(self, name: str) -> list[PhaseRun]:
        return [r.phases[name] for r in self.kept]


# ---- the driver ---------------------------------------------------------------------------------

class _Driver:
    def __init__(self, source: ServerSource, profile: ServingProfile, workload: ServingWorkload):
        self.source, self.profile, self.w = source, profile, workload
        self.targets: dict[str, Target] = {}
        self.facts: dict[str, ServerFacts] = {}
        self.last: str | None = None
        self.waits: list[dict] = []

    def target(self, name: str) -> Target:
        """The server ``name``; side by side, turning to it first waits until the others have stopped
        spinning (quiesce.py: ~1 s of one core after a server's last request, which landed in the other
        server's phase on 2 cores)."""
        t = self.source.target(self.profile, self.w.servers[name])
        self.targets[name] = t
        if name not in self.facts:
            s = t.server
            self.facts[name] = ServerFacts(t.label, str(s.spec.model), s.startup_s, s.engine_init_s(),
                                           s.kv_cache_tokens(), tuple(s.argv[3:]))
        if self.w.side_by_side and len(self.w.servers) > 1 and self.last != name:
            for other, ot in list(self.targets.items()):
                if other != name and ot.server.proc.pid is not None:
                    self.waits.append(wait_until_quiet(ot.server.proc.pid).to_dict())
        self.last = name
        return t

    def load(self, t: Target, phase: Phase, rep: int, done: Mapping[str, PhaseRun],
             setup: Mapping[str, Sequence[PhaseRun]]) -> tuple[LoadSpec, float | None]:
        seed, arrival_seed = phase.seeds(rep)
        rate = None if phase.rate is None else phase.rate.rps(phase, setup, done)
        spec = t.load(phase.prompts.build(t.token_pool, seed), max_concurrency=phase.concurrency, rate_rps=rate,
                      burstiness=phase.burstiness, seed=arrival_seed)
        return spec, rate

    def run_phase(self, phase: Phase, rep: int, done: Mapping[str, PhaseRun],
                  setup: Mapping[str, Sequence[PhaseRun]]) -> PhaseRun:
        t = self.target(phase.server)
        spec, rate = self.load(t, phase, rep, done, setup)
        beside = None if phase.alongside is None else self.load(t, phase.alongside, rep, done, setup)
        before = _read_counters(t.base_url, phase.counters)
        bench = bench_run = None
        if phase.bench:
            bench_run = _start_bench(t, spec, self.source.work_dir / f"round{rep}")
        try:
            if beside is not None:
                result, other = run_loads_concurrently([spec, beside[0]])
            else:
                result, other = run_load(spec), None
            if bench_run is not None:
                bench = bench_run.result()
        finally:
            if bench_run is not None:
                bench_run.stop()
        counters = _counters_since(t.base_url, phase.counters, before)
        _check_load(result, spec, t.label, phase.name)
        second = None
        if beside is not None:
            _check_load(other, beside[0], t.label, f"{phase.name}, {phase.alongside.name} beside it")
            second = PhaseRun(phase.alongside, t.label, beside[0].describe(), other, summarize_run(other),
                              offered_rps=beside[1])
        if bench is not None:
            _check_bench(bench, spec)
        return PhaseRun(phase, t.label, spec.describe(), result, summarize_run(result), counters, rate, second, bench,
                        None if bench_run is None else bench_run.work / bench_run.result_name)

    def repetition(self, rep: int, setup, names: Sequence[str] | None = None) -> Repetition:
        phases = self.w.order(rep, names)
        done: dict[str, PhaseRun] = {}
        for p in phases:
            done[p.name] = self.run_phase(p, rep, done, setup)
        is_starved = self.w.starved_when is not None and STARVATION_RULES[self.w.starved_when](list(done.values()))
        return Repetition(rep, tuple(dict.fromkeys(p.server for p in phases)), done, is_starved)

    def run(self) -> ServingRuns:
        self.source.keep_alive(len(self.w.servers) if self.w.side_by_side else 1)
        for name in _first_servers(self.w):  # as start_servers; side by side, the last started is left to go quiet
            self.target(name)
        setup: dict[str, list[PhaseRun]] = {}
        for p in self.w.setup:
            setup.setdefault(p.name, []).append(self.run_phase(p, 0, {}, setup))

        def reps(names=None):
            return unstarved_runs(lambda i: self.repetition(i, setup, names), lambda r: r.starved,
                                  wanted=self.w.reps, extra=self.w.extra_reps if self.w.starved_when else 0)
        if self.w.side_by_side:
            kept, every = reps()
        else:  # one server at a time: every repetition on the first, then on the next (each re-runs its own)
            by_server = [reps((name,)) for name in self.w.servers]
            every = [r for _, runs in by_server for r in runs]
            kept = [Repetition(i, tuple(r.order[0] for r in rs), {k: v for r in rs for k, v in r.phases.items()})
                    for i, rs in enumerate(zip(*(k for k, _ in by_server)))]
        named = self.targets[self.w.identified].server.spec
        identity = served_workload(named.model, named.engine_args)
        return ServingRuns(self.w, setup, every, kept, dict(self.facts), identity, self.waits)


def drive(source: ServerSource, profile: ServingProfile, workload: ServingWorkload) -> ServingRuns:
    """Run ``workload`` on ``profile``'s servers from ``source``: the setup phases once, then the
    repetitions (starved ones re-run up to ``extra_reps`` times), side by side or one server at a time."""
    driver = _Driver(source, profile, workload)
    if not workload.watch_memory:
        return driver.run()
    watch = MemoryWatch(lambda: {t.label: t.server.proc.pid for t in driver.targets.values()
                                 if t.server.proc.pid is not None}).start()
    try:
        runs = driver.run()
    finally:
        peaks = watch.stop()
    runs.memory = peaks
    return runs


def _check_load(result: LoadResult, spec: LoadSpec, label: str, what: str) -> None:
    check(result.failed == 0, f"{label} {what}: {result.failed} failed requests: {result.errors()}")
    if spec.ignore_eos:
        got = [r.output_tokens for r in result.records]
        check(got == [q.max_tokens for q in spec.requests],
              f"{label} {what}: ignore_eos not honoured: output tokens {got}, asked for "
              f"{sorted(set(q.max_tokens for q in spec.requests))} each")


def _read_counters(base_url: str, names: Sequence[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if "steps" in names:
        out["steps"] = StepCounters.read(base_url)
    if "prefix_cache" in names:
        out["prefix_cache"] = PrefixCacheCounters.read(base_url)
    if "preemptions" in names:
        out["preemptions"] = preemptions(base_url)
    return out


def _counters_since(base_url: str, names: Sequence[str], before: Mapping[str, Any]) -> dict[str, float]:
    now = _read_counters(base_url, names)
    out: dict[str, float] = {}
    if "steps" in now:
        out["tokens_per_step"] = now["steps"].tokens_per_step_since(before["steps"])
    if "prefix_cache" in now:
        out["prefix_hit_tokens"] = now["prefix_cache"].hits - before["prefix_cache"].hits
        out["prefix_hit_rate"] = now["prefix_cache"].hit_rate_since(before["prefix_cache"])
    if "preemptions" in now:
        out["preemptions"] = now["preemptions"] - before["preemptions"]
    return out


def _start_bench(t: Target, spec: LoadSpec, work_dir: Path):
    """`vllm bench serve` with ``spec``'s shape on ``t``, started and in its timed run (after its vLLM
    import and test prompt), so ours runs beside it: back to back on a shared machine, the two drift
    apart by more than the tools differ."""
    from perfgate.workloads.serving.vllm_bench import BenchServeRun, BenchServeSpec

    first = spec.requests[0]
    bench = BenchServeRun(BenchServeSpec(base_url=t.base_url, model=t.model, tokenizer=str(t.server.spec.model),
                                         work_dir=work_dir, input_len=len(first.prompt), output_len=first.max_tokens,
                                         num_prompts=len(spec.requests), max_concurrency=spec.max_concurrency,
                                         seed=spec.seed)).start()
    try:
        bench.wait_main_run()
    except BaseException:
        bench.stop()
        raise
    return bench


def _check_bench(bench: dict, spec: LoadSpec) -> None:
    expected = sum(r.max_tokens for r in spec.requests)
    check(bench["failed"] == 0, f"vllm bench serve: {bench['failed']} failed requests")
    check(bench["total_output_tokens"] == expected,
          f"vllm bench serve generated {bench['total_output_tokens']} tokens, expected {expected}")
