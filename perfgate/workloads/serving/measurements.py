"""Each serving measurement as one row: the workload it runs (workload.ServingWorkload, built from the
profile) and the reduce that turns what ran (workload.ServingRuns) into its metrics and checks.

Why rows: as nccl-tests' one struct per collective, adding a serving measurement is adding a row here
and a five-line test; the driver (workload.drive) and the repeated-runs-to-metrics path
(:func:`latency_records`) are written once. The test docstrings in perf/serving/ say what each
measurement shows and why its figures are gated or recorded; this module says how.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from perfgate.judge.metrics import DEPENDS_DEVICE, paired_ratio
from perfgate.machine import gpu_busy
from perfgate.workloads.area import Attached, Case, Measured, Record, Row, check, cpu_ratio_depends
from perfgate.workloads.serving.profiles import ParallelServing, ServingProfile
from perfgate.workloads.serving.serving_metrics import ServingSummary, Slo, highest_rate_meeting_slo, summarize_run
from perfgate.workloads.serving.starvation import AllStarved, skip_reason, starved
from perfgate.workloads.serving.workload import (DEFAULT_SERVER, FractionOf, Phase, Prompts, ServerConfig,
                                                 ServingRuns, ServingWorkload, SpreadOver, drive)

CONCURRENCY_LEVELS = (1, 2, 4, 8, 16, 32)  # test ids of the sweep; a profile runs those in its ``concurrency``
DECODE_ATTEMPTS = 3   # single-stream decode: runs until one streamed (a starved client reads answers whole)
BENCH_EXTRA_ROUNDS = 3  # cross-check: re-runs allowed for rounds with a starved client


@dataclass(frozen=True)
class ServingCase:
    """A serving case's values: the profile, the workload its row built, and the row's own parameter."""

    profile: ServingProfile
    workload: ServingWorkload
    concurrency: int | None = None          # the concurrency sweep's level
    layout: ParallelServing | None = None   # the parallel-serving layout


# ---- the one path from repeated runs to latency metrics -----------------------------------------

def busy_records(summaries: Sequence[ServingSummary], prefix: str = "") -> tuple[list[Record], float | None]:
    """On a GPU: the busy share of each run as a metric of its own, and the ``device_busy`` of the
    run's timings (their median share; None without one): a serving timing the server kept the device busy
    for (>= 0.9) is a device figure (perfgate.judge), below it the host held the device back.
    Runs shorter than a few NVML periods have no share of their own: the samples of all of them,
    pooled, give one share for the phase."""
    busy = [s.gpu_busy for s in summaries if s.gpu_busy is not None]
    if not busy:  # runs too short for a share each (a GPU sweep's C=16: 0.2 s): their samples pooled
        pooled = gpu_busy.pooled_share(p for s in summaries for p in s.gpu_busy_samples)
        busy = [] if pooled is None else [pooled]
    if not busy:
        return [], None
    return [Measured(f"{prefix}gpu_busy_fraction", busy, "fraction", "higher")], statistics.median(busy)


def latency_records(summaries: Sequence[ServingSummary], prefix: str = "", *, itl: str = "p99",
                    e2el: bool = True) -> list[Record]:
    """Per-request TTFT/TPOT(/E2EL) pooled over the runs, each run's mean engine prefill time where every
    run read the engine's clocks (loadgen.run_load: the prefill step as the engine core timed it, beside
    the client's TTFT), each run's ``itl`` percentile of inter-chunk latency, and on a GPU each run's busy
    share (beside the timings as their ``device_busy``). Single-stream decode reads the median ITL and no
    E2EL (its answers are all one length: E2EL is TTFT plus TPOT there)."""
    busy, share = busy_records(summaries, prefix)
    out: list[Record] = [Measured(f"{prefix}ttft_ms", [v for s in summaries for v in s.ttft_ms_values],
                                  "ms", "lower", device_busy=share)]
    if summaries and all(s.engine is not None for s in summaries):
        out.append(Measured(f"{prefix}engine_prefill_ms", [s.engine.prefill_ms for s in summaries], "ms",
                            "lower", device_busy=share))
    tpot = [v for s in summaries for v in s.tpot_ms_values]
    if tpot:
        out.append(Measured(f"{prefix}tpot_ms", tpot, "ms", "lower", device_busy=share))
    if e2el:
        out.append(Measured(f"{prefix}e2el_ms", [v for s in summaries for v in s.e2el_ms_values], "ms", "lower",
                            device_busy=share))
    itl_values = [s.itl_ms.percentiles[itl] for s in summaries if s.itl_ms.n]
    if itl_values:
        out.append(Measured(f"{prefix}itl_{itl}_ms", itl_values, "ms", "lower", device_busy=share))
    # on a GPU: each run's joules per output token (every visible GPU, first send to last end;
    # loadgen.LoadResult.energy_j), beside the timings with their busy share
    energy = [s.energy_j_per_output_token for s in summaries]
    if energy and all(e is not None for e in energy):
        out.append(Measured(f"{prefix}energy_j_per_token", energy, "J/tok", "lower", device_busy=share))
    return out + busy


def _closed(p: ServingProfile, concurrency: int) -> Prompts:
    """The sweep's requests at ``concurrency``: ``requests_per_slot`` per slot, at least ``min_requests``."""
    return Prompts(max(p.min_requests, p.requests_per_slot * concurrency), p.input_len, p.output_len)


# ---- continuous batching: closed loop at C against C=1 -------------------------------------------

def concurrency_workload(p: ServingProfile, c: int) -> ServingWorkload:
    ref = (Phase("ref", "dense", _closed(p, 1), seed=1000, concurrency=1),) if c > 1 else ()
    at_c = Phase("at_c", "dense", _closed(p, c), seed=2000, concurrency=c, counters=("steps",))
    return ServingWorkload({"dense": DEFAULT_SERVER}, (*ref, at_c), reps=p.reps, extra_reps=p.reps,
                           starved_when="median_tpot")


def concurrency_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    c: ServingCase = case.values
    p = c.profile
    if not runs.kept:
        raise AllStarved(skip_reason(len(runs.every), "median TPOT ~0"))
    at_c = [r.summary for r in runs.kept_phase("at_c")]
    at_1 = [r.phases["ref"].summary for r in runs.kept if "ref" in r.phases]
    out: list[Record] = [
        Measured("output_tok_s", [s.output_throughput_tok_s for s in at_c], "tok/s", "higher"),
        Measured("request_rps", [s.request_throughput_rps for s in at_c], "req/s", "higher"),
        Measured("total_tok_s", [s.total_token_throughput_tok_s for s in at_c], "tok/s", "higher"),
        *latency_records(at_c)]
    if at_1:
        # The server's own batch: generated tokens per engine step over the phase at C (1.0 at C=1 by
        # construction, so recorded only above it); a server that stops batching reads 1.0. Machine drift
        # does not move it; a starved client does (test_concurrency_sweep's docstring): those are not here.
        mix = cpu_ratio_depends(case)
        out += [Measured("generated_tokens_per_step", [r.counters["tokens_per_step"] for r in runs.kept_phase("at_c")],
                         "x", "higher"),
                Measured("output_tok_s_vs_c1", paired_ratio([s.output_throughput_tok_s for s in at_c],
                                                            [s.output_throughput_tok_s for s in at_1]),
                         "x", "higher", depends=mix),
                Measured("tpot_vs_c1", paired_ratio([s.tpot_ms.median for s in at_c], [s.tpot_ms.median for s in at_1]),
                         "x", "lower", depends=mix)]
    raw = [{"rep": r.index, "starved": r.starved, "tokens_per_step": r.phases["at_c"].counters["tokens_per_step"],
            "summary": r.phases["at_c"].summary.to_dict(),
            "records": [rec.to_dict() for rec in r.phases["at_c"].result.records]} for r in runs.every]
    return out + [Attached("starved_reps", len(runs.every) - len(runs.kept)), Attached("requests", raw),
                  Attached("workload", {"input_len": p.input_len, "output_len": p.output_len, "concurrency": c.concurrency,
                                        "reps": p.reps,
                                        "median_ttft_ms": statistics.median(v for s in at_c for v in s.ttft_ms_values)})]


# ---- single-stream decode ------------------------------------------------------------------------

def decode_workload(p: ServingProfile, model_kind: str) -> ServingWorkload:
    prompts = Prompts(p.decode_requests, p.decode_input_len, p.decode_output_len)
    return ServingWorkload({model_kind: ServerConfig(kind=model_kind)},
                           (Phase("decode", model_kind, prompts, seed=8000, seed_step=0, concurrency=1),),
                           reps=1, extra_reps=DECODE_ATTEMPTS - 1, starved_when="every_answer_at_once")


def decode_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    if not runs.kept:
        raise AllStarved(skip_reason(len(runs.every), "every answer arrived in one read"))
    run = runs.kept[0].phases["decode"]
    s = run.summary
    _, share = busy_records([s])  # on a GPU: was the decode step the device's or the host's?
    facts = next(iter(runs.servers.values()))
    return [Measured("decode_tok_s", s.decode_tok_s_values, "tok/s", "higher", device_busy=share),
            *latency_records([s], itl="p50", e2el=False),
            Attached("requests", [r.to_dict() for r in run.result.records]),
            Attached("workload", {"model": facts.model, "input_len": p.decode_input_len,
                                  "output_len": p.decode_output_len, "requests": p.decode_requests})]


# ---- long-prefill interference -------------------------------------------------------------------

def long_prefill_workload(p: ServingProfile) -> ServingWorkload:
    decode = Prompts(2 * p.decode_streams, p.input_len, p.decode_stream_output_len, tag="decode")
    # fresh prompts (the prefix cache is on) of the same shape; the long prompts spread evenly (burstiness
    # 100 ~ a metronome) over 0.6 of the decode phase's measured length
    longs = Phase("long_prefill", "dense", Prompts(p.long_prefill_requests, p.long_prefill_len, 1, shape="long_prefill"),
                  seed=6000, rate=SpreadOver("alone", 0.6), burstiness=100.0, load_seed=0)
    return ServingWorkload({"dense": DEFAULT_SERVER}, (
        Phase("alone", "dense", decode, seed=5000, concurrency=p.decode_streams, load_seed=0),
        Phase("mixed", "dense", decode, seed=5500, concurrency=p.decode_streams, load_seed=0, alongside=longs)),
        reps=p.reps)


def long_prefill_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    alone = [r.summary for r in runs.kept_phase("alone")]
    mixed = [r.summary for r in runs.kept_phase("mixed")]
    prefill = [r.alongside.summary for r in runs.kept_phase("mixed")]
    mix = cpu_ratio_depends(case)
    out: list[Record] = [Measured("decode_e2el_with_vs_without_prefill",
                                  paired_ratio([m.e2el_ms.median for m in mixed], [a.e2el_ms.median for a in alone]),
                                  "x", "lower", depends=mix)]
    # TPOT and chunk gaps are 0 when a whole answer arrives in one read: on 2 cores the API server and the
    # client share one core with the engine's scheduler and are sometimes not run for ~100 ms. Such
    # repetitions say nothing about interference and are left out of these two; E2EL above does not
    # depend on chunking and always has every repetition.
    streamed = [(m, a) for m, a in zip(mixed, alone) if not starved(a.tpot_ms.median)]
    tpot = paired_ratio([m.tpot_ms.median for m, _ in streamed], [a.tpot_ms.median for _, a in streamed])
    chunked = [(m, a) for m, a in zip(mixed, alone) if not starved(a.itl_ms.percentiles["p99"])]
    itl = paired_ratio([m.itl_ms.percentiles["p99"] for m, _ in chunked],
                       [a.itl_ms.percentiles["p99"] for _, a in chunked])
    out.append(Attached("burst_repetitions", {"tpot_ratio_left_out": len(alone) - len(tpot),
                                              "itl_ratio_left_out": len(alone) - len(itl)}))
    if tpot:
        out.append(Measured("decode_tpot_with_vs_without_prefill", tpot, "x", "lower", depends=mix))
    if itl:
        out.append(Measured("decode_itl_p99_with_vs_without_prefill", itl, "x", "lower", depends=mix))
    raw = [{"rep": r.index, "alone": [x.to_dict() for x in r.phases["alone"].result.records],
            "mixed": [x.to_dict() for x in r.phases["mixed"].result.records],
            "long_prefill": [x.to_dict() for x in r.phases["mixed"].alongside.result.records],
            "prefill_rate_rps": r.phases["mixed"].alongside.offered_rps} for r in runs.every]
    return out + [
        *latency_records(alone, "decode_alone_"), *latency_records(mixed, "decode_with_prefill_"),
        Measured("long_prefill_ttft_ms", [v for s in prefill for v in s.ttft_ms_values], "ms", "lower"),
        Attached("workload", {"decode_streams": p.decode_streams, "decode_requests": 2 * p.decode_streams,
                              "decode_input_len": p.input_len, "decode_output_len": p.decode_stream_output_len,
                              "long_prefill_len": p.long_prefill_len, "long_prefill_requests": p.long_prefill_requests}),
        Attached("requests", raw)]


# ---- open-loop rate sweep and SLO goodput --------------------------------------------------------

def _rate_phase_name(fraction: float) -> str:
    return f"{fraction:g}x"


def poisson_workload(p: ServingProfile) -> ServingWorkload:
    top = max(p.concurrency)
    setup = (Phase("unloaded", "dense", Prompts(2 * p.min_requests, p.input_len, p.output_len), seed=3000,
                   concurrency=1),
             *(Phase("capacity", "dense", Prompts(p.capacity_requests or p.rate_requests, p.input_len, p.output_len),
                     seed=3001 + i, concurrency=top) for i in range(p.capacity_reps)))
    rates = tuple(Phase(_rate_phase_name(f), "dense", Prompts(p.rate_requests, p.input_len, p.output_len),
                        seed=4000 + int(f * 100), seed_step=100, rate=FractionOf("capacity", f), burstiness=1.0,
                        concurrency=p.rate_max_concurrency) for f in p.rate_fractions)
    return ServingWorkload({"dense": DEFAULT_SERVER}, rates, reps=p.rate_reps, setup=setup)


def poisson_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    unloaded = runs.setup["unloaded"][0].summary
    capacities = [r.summary for r in runs.setup["capacity"]]
    capacity_rps = statistics.median(c.request_throughput_rps for c in capacities)
    # a request whose tokens all arrived in one read (starved client) has TPOT 0: not a reference
    unloaded_tpot = statistics.median([v for v in unloaded.tpot_ms_values if v > 0] or [0.0])
    slo = p.slo or Slo(ttft_ms=max(10.0, p.slo_ttft_x * unloaded.ttft_ms.median),
                       tpot_ms=max(1.0, p.slo_tpot_x * unloaded_tpot))
    by_frac: dict[float, list[ServingSummary]] = {f: [] for f in p.rate_fractions}
    best_frac, raw = [], []
    for rep in runs.kept:
        attainment = {}
        for f in p.rate_fractions:
            run = rep.phases[_rate_phase_name(f)]
            s = summarize_run(run.result, slo=slo)
            by_frac[f].append(s)
            attainment[f] = s.slo_attainment
            raw.append({"rep": rep.index, "fraction": f, "offered_rps": run.offered_rps, "summary": s.to_dict(),
                        "records": [r.to_dict() for r in run.result.records]})
        best_frac.append(highest_rate_meeting_slo(attainment, p.min_attainment))
    out: list[Record] = [Measured("capacity_rps", [c.request_throughput_rps for c in capacities], "req/s", "higher")]
    for f, sums in by_frac.items():
        tag = f"@{f:g}x"
        out += [Measured(f"completed_rps{tag}", [s.request_throughput_rps for s in sums], "req/s", "higher"),
                Measured(f"goodput_rps{tag}", [s.goodput_rps for s in sums], "req/s", "higher"),
                # Attainment is a fraction of this run's own requests; past capacity its tolerance is wider
                # (pyproject.toml), and on the shared CPU VMs it is record-only (baselines/cpu-*/tolerances.toml).
                Measured(f"slo_attainment{tag}", [s.slo_attainment for s in sums], "fraction", "higher"),
                *latency_records(sums, f"{f:g}x_")]
    return out + [
        Measured("max_rate_meeting_slo_rps", [b * capacity_rps for b in best_frac], "req/s", "higher"),
        # Moves in whole steps of the rate fractions: its tolerance (pyproject.toml) allows for that.
        Measured("max_rate_meeting_slo_vs_capacity", best_frac, "x", "higher"),
        Attached("slo", {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "min_attainment": p.min_attainment,
                         "relative": p.slo is None, "unloaded": unloaded.to_dict(),
                         "capacity": [c.to_dict() for c in capacities], "capacity_rps": capacity_rps,
                         "capacity_concurrency": max(p.concurrency),
                         "median_best_fraction": statistics.median(best_frac)}),
        Attached("requests", raw)]


# ---- the server memory budget fires --------------------------------------------------------------

def rss_workload(p: ServingProfile) -> ServingWorkload:
    return ServingWorkload({"dense": DEFAULT_SERVER},
                           (Phase("load", "dense", Prompts(8, p.input_len, p.output_len), seed=31, concurrency=4),),
                           reps=1, watch_memory=True)


def rss_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    """Checks of the budget rule on the real server, nothing to record: a budget at the peak passes,
    one MiB under it fails naming the peak and the phase."""
    from perfgate.workloads.area import CheckFailed
    from perfgate.workloads.serving.server_memory import check_budget

    run = runs.kept[0].phases["load"]
    peaks = {run.label: runs.memory[run.label]}
    peak = peaks[run.label].rss
    # the API server, the engine core and its worker: a tree, not the leader alone
    check(peak.processes >= 2, f"the watch saw {peak.processes} process(es) of the server's tree")
    check(peak.mib > 100, f"peak RSS {peak.mib:.0f} MiB is not a vLLM server's")
    check_budget(peaks, peak.mib, "at the peak")  # not over: passes
    try:
        check_budget(peaks, peak.mib - 1, "one MiB under the peak")
        message = None
    except CheckFailed as failed:
        message = str(failed)
    check(message is not None, f"a budget one MiB under the peak ({peak.mib:.0f} MiB) did not fail")
    check(f"peak RSS {peak.mib:.0f} MiB" in message and "exceeds the budget" in message,
          f"the budget's failure does not name the peak: {message}")
    check(peak.phase in message and peak.phase in (run.described, "between loads"),
          f"the budget's failure names no phase of the load ({run.described!r}): {message}")
    return []


# ---- `vllm bench serve` side by side -------------------------------------------------------------

def bench_workload(p: ServingProfile) -> ServingWorkload:
    ours = Phase("ours", "dense", Prompts(p.bench_requests, p.input_len, p.output_len), seed=9000,
                 concurrency=p.bench_concurrency, load_seed=0, bench=True)
    return ServingWorkload({"dense": DEFAULT_SERVER}, (ours,), reps=p.bench_rounds, extra_reps=BENCH_EXTRA_ROUNDS,
                           starved_when="median_tpot")


def bench_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    """The gaps to `vllm bench serve` are recorded; where the profile has bench_bounds (the GPU), the
    agreement is checked on the median over rounds. Either way the file the real tool wrote must import
    (`perfgate import vllm-bench`) with its numbers unchanged."""
    p = case.values.profile
    rounds = [r.phases["ours"] for r in runs.every]
    raw = [{"round": r.index, "valid": not r.starved, "ours": x.summary.to_dict(),
            "ours_records": [rec.to_dict() for rec in x.result.records],
            "bench": {k: v for k, v in x.bench.items() if not isinstance(v, list)},
            "bench_ttfts_ms": [t * 1e3 for t in x.bench.get("ttfts", [])]} for r, x in zip(runs.every, rounds)]
    if not runs.kept:
        raise AllStarved(skip_reason(len(runs.every), "median TPOT ~0"))
    kept = runs.kept_phase("ours")
    ours_ttft = [x.summary.ttft_ms.median for x in kept]
    ours_tpot = [x.summary.tpot_ms.median for x in kept]
    bench_ttft = [x.bench["median_ttft_ms"] for x in kept]
    bench_tpot = [x.bench["median_tpot_ms"] for x in kept]
    e2el_ratio = paired_ratio([x.summary.e2el_ms.median for x in kept], [x.bench["median_e2el_ms"] for x in kept])
    # Rounds whose tokens came in pairs (median ITL ~0, TPOT fine) compare everything but ITL.
    itl = [x for x in kept if not starved(x.summary.itl_ms.median, x.bench["median_itl_ms"])]
    itl_ratio = paired_ratio([x.summary.itl_ms.median for x in itl], [x.bench["median_itl_ms"] for x in itl])
    ttft_ratio, tpot_ratio = paired_ratio(ours_ttft, bench_ttft), paired_ratio(ours_tpot, bench_tpot)
    ratios = {"ttft_median": ttft_ratio, "tpot_median": tpot_ratio, "e2el_median": e2el_ratio, "itl_median": itl_ratio}
    med = {k: statistics.median(v) for k, v in ratios.items() if v}
    summary = (f"median TTFT ours {statistics.median(ours_ttft):.2f} ms vs bench {statistics.median(bench_ttft):.2f} ms; "
               f"median TPOT ours {statistics.median(ours_tpot):.3f} ms vs bench {statistics.median(bench_tpot):.3f} ms; "
               "ours/bench per metric (median over rounds): " + ", ".join(f"{k} {v:.3f}" for k, v in med.items()))
    _check_import(rounds[0], p)
    if p.bench_bounds is not None:
        b = p.bench_bounds
        for key, bound in (("e2el_median", b.e2el), ("itl_median", b.itl), ("tpot_median", b.tpot),
                           ("ttft_median", b.ttft)):
            if bound is not None and key in med:  # itl_median is absent when every round had tokens in pairs
                check(abs(med[key] - 1) <= bound,
                      f"{key.split('_')[0].upper()} disagrees by more than {bound:.0%}: {summary}")
    out: list[Record] = [
        Measured("ttft_median_ours_ms", ours_ttft, "ms", "lower"),
        Measured("ttft_median_bench_ms", bench_ttft, "ms", "lower"),
        Measured("tpot_median_ours_ms", ours_tpot, "ms", "lower"),
        Measured("tpot_median_bench_ms", bench_tpot, "ms", "lower"),
        # The gap |ours/bench - 1| per round: 0 is perfect agreement; growth is a regression of either tool.
        Measured("ttft_median_gap_vs_bench", [abs(r - 1) for r in ttft_ratio], "fraction", "lower"),
        Measured("tpot_median_gap_vs_bench", [abs(r - 1) for r in tpot_ratio], "fraction", "lower"),
        Measured("e2el_median_gap_vs_bench", [abs(r - 1) for r in e2el_ratio], "fraction", "lower")]
    if itl_ratio:  # else every round had tokens in pairs (median ITL ~0): ITL says nothing this run
        out.append(Measured("itl_median_gap_vs_bench", [abs(r - 1) for r in itl_ratio], "fraction", "lower"))
    return out + [Attached("rounds", raw), Attached("ratios_ours_over_bench", ratios),
                  Attached("starved_rounds", len(runs.every) - len(runs.kept)), Attached("summary", summary)]


def _check_import(run, profile: ServingProfile) -> None:
    """`perfgate import vllm-bench` on the file the real tool just wrote: this test's C, its numbers unchanged."""
    from perfgate.importers import vllm_bench as bench_import

    bench = run.bench
    got = bench_import.read([run.bench_file], "cpu-crosscheck" if profile.name == "cpu" else None)
    ids = {n.test_id for n in got.numbers}
    expected = f"{bench_import.SWEEP}[{profile.name}-C={profile.bench_concurrency}]"
    check(ids == {expected}, f"the import of {run.bench_file} names {sorted(ids)}, not {expected}")
    samples = {n.metric: n.samples for n in got.numbers}
    for metric, want in (("output_tok_s", (bench["output_throughput"],)), ("tpot_ms", (bench["median_tpot_ms"],)),
                         ("ttft_ms", tuple(x * 1e3 for x in bench["ttfts"]))):  # --save-detailed: one per request
        check(samples.get(metric) == want, f"the import of {run.bench_file} changed {metric}: "
                                           f"{samples.get(metric)} for the file's {want}")


# ---- two servers, one flag apart: small KV, compiled/eager, prefix cache ----------------------------

def _pair(p: ServingProfile, servers: dict[str, ServerConfig], phases: tuple[Phase, ...], *, reps: int,
          retry_starved: bool) -> ServingWorkload:
    """Two servers measured alike: side by side alternating every repetition (the profile's
    ``side_by_side``), else one at a time."""
    return ServingWorkload(servers, phases, reps=reps, extra_reps=reps if retry_starved else 0,
                           starved_when="median_tpot" if retry_starved else None, alternate=True,
                           side_by_side=p.side_by_side)


KV_SERVERS = ("default", "small")


def kv_workload(p: ServingProfile) -> ServingWorkload:
    small = ServerConfig(variant="small-kv", extra_args=("--num-gpu-blocks-override", str(p.kv_small_blocks)))
    prompts = Prompts(p.kv_requests, p.input_len, p.output_len)
    return _pair(p, {"default": DEFAULT_SERVER, "small": small},
                 tuple(Phase(n, n, prompts, seed=12000, concurrency=p.kv_concurrency, load_seed=0,
                             counters=("preemptions",)) for n in KV_SERVERS), reps=p.kv_reps or p.reps,
                 retry_starved=True)


def kv_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    preempted = {n: sum(r.phases[n].counters["preemptions"] for r in runs.every if n in r.phases) for n in KV_SERVERS}
    kv_tokens = {n: f.kv_cache_tokens for n, f in runs.servers.items()}
    check(preempted["default"] == 0, f"the default server ({kv_tokens['default']} KV tokens) preempted "
                                     f"{preempted['default']:.0f} requests: its capacity is short too, so the "
                                     f"comparison says nothing")
    check(preempted["small"] > 0, f"the server with {p.kv_small_blocks} KV blocks preempted nothing at "
                                  f"C={p.kv_concurrency}: the load did not outgrow its cache")
    attached = [Attached("runs", [{"rep": r.index, "order": list(r.order), "starved": r.starved,
                                   "phases": {n: {"summary": x.summary.to_dict(), "preemptions": x.counters["preemptions"]}
                                              for n, x in r.phases.items()}} for r in runs.every]),
                Attached("kv_cache_tokens", kv_tokens), Attached("quiet_waits", runs.quiet_waits)]
    if not runs.kept:
        raise AllStarved(skip_reason(len(runs.every), "median TPOT ~0"))

    def per_rep(name: str, figure: Callable[[ServingSummary], float]) -> list[float]:
        return [figure(x.summary) for x in runs.kept_phase(name)]

    tok_s = {n: per_rep(n, lambda s: s.output_throughput_tok_s) for n in KV_SERVERS}
    ttft = {n: per_rep(n, lambda s: s.ttft_ms.median) for n in KV_SERVERS}
    tpot = {n: per_rep(n, lambda s: s.tpot_ms.median) for n in KV_SERVERS}
    mix = cpu_ratio_depends(case)
    out: list[Record] = [
        Measured("output_tok_s_small_vs_default", paired_ratio(tok_s["small"], tok_s["default"]), "x", "higher",
                 depends=mix),
        Measured("ttft_small_vs_default", paired_ratio(ttft["small"], ttft["default"]), "x", "lower", depends=mix),
        Measured("tpot_small_vs_default", paired_ratio(tpot["small"], tpot["default"]), "x", "lower", depends=mix)]
    for n in KV_SERVERS:
        out += [Measured(f"output_tok_s_{n}", tok_s[n], "tok/s", "higher"),
                Measured(f"ttft_ms_{n}", ttft[n], "ms", "lower"), Measured(f"tpot_ms_{n}", tpot[n], "ms", "lower")]
    out.append(Measured("small_preemptions_per_request",
                        [x.counters["preemptions"] / p.kv_requests for x in runs.kept_phase("small")], "x", "lower"))
    return out + attached


EAGER_SERVERS = ("compiled", "eager")


def _eager_phase(server: str, c: int) -> str:
    return f"{server}-C={c}"


def eager_workload(p: ServingProfile) -> ServingWorkload:
    eager = ServerConfig(variant="eager", extra_args=("--enforce-eager",))
    return _pair(p, {"compiled": DEFAULT_SERVER, "eager": eager},
                 tuple(Phase(_eager_phase(n, c), n, _closed(p, c), seed=9000 + c, seed_step=10, concurrency=c, step=c)
                       for c in p.eager_concurrency for n in EAGER_SERVERS), reps=p.eager_reps or p.reps,
                 retry_starved=True)


def eager_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    levels = p.eager_concurrency
    for r in runs.every:
        for x in r.phases.values():
            e = x.summary.engine
            check(e is not None and e.tpot_ms > 0,
                  f"{x.label} C={x.phase.concurrency}: the engine counted no decode time ({e})")
    attached = [Attached("runs", [{"rep": r.index, "order": list(r.order), "starved": r.starved,
                                   "summaries": {n: {**x.summary.to_dict(), "engine_tpot_ms": x.summary.engine.tpot_ms}
                                                 for n, x in r.phases.items()}} for r in runs.every])]
    if not runs.kept:
        raise AllStarved(skip_reason(len(runs.every), "median TPOT ~0"))

    def per_rep(name: str, c: int, figure: Callable[[ServingSummary], float]) -> list[float]:
        return [figure(x.summary) for x in runs.kept_phase(_eager_phase(name, c))]

    mix = cpu_ratio_depends(case)
    out: list[Record] = []
    gains = {}  # C -> output tok/s compiled / eager, per kept repetition
    for c in levels:
        tok_s = {n: per_rep(n, c, lambda s: s.output_throughput_tok_s) for n in EAGER_SERVERS}
        gains[c] = paired_ratio(tok_s["compiled"], tok_s["eager"])
        tpot = {n: per_rep(n, c, lambda s: s.tpot_ms.median) for n in EAGER_SERVERS}
        decode = {n: per_rep(n, c, lambda s: 1e3 / s.engine.tpot_ms) for n in EAGER_SERVERS}  # per stream
        out += [Measured(f"c{c}_output_tok_s_compiled_vs_eager", gains[c], "x", "higher", depends=mix),
                Measured(f"c{c}_engine_decode_tok_s_compiled_vs_eager",
                         paired_ratio(decode["compiled"], decode["eager"]), "x", "higher", depends=mix),
                Measured(f"c{c}_tpot_compiled_vs_eager", paired_ratio(tpot["compiled"], tpot["eager"]), "x", "lower",
                         depends=mix)]
        for n in EAGER_SERVERS:
            out += [Measured(f"c{c}_output_tok_s_{n}", tok_s[n], "tok/s", "higher"),
                    Measured(f"c{c}_engine_decode_tok_s_{n}", decode[n], "tok/s", "higher"),
                    Measured(f"c{c}_tpot_ms_{n}", tpot[n], "ms", "lower")]
    # the trend: the gain at the lowest C over the gain at the highest, per repetition; above 1 while the
    # gain shrinks as C grows (the seed: 1.19 / 1.02 = 1.17)
    lo, hi = levels[0], levels[-1]
    out.append(Measured(f"output_gain_c{lo}_over_c{hi}", paired_ratio(gains[lo], gains[hi]), "x", "higher",
                        depends=mix))
    facts = runs.servers
    kv = {n: f.kv_cache_tokens for n, f in facts.items()}
    for n, f in facts.items():
        out.append(Measured(f"startup_s_{n}", [f.startup_s], "s", "lower"))  # to /health
        if f.engine_init_s is not None:  # the engine's own share (compilation, graph capture)
            out.append(Measured(f"engine_init_s_{n}", [f.engine_init_s], "s", "lower"))
    if None not in kv.values():
        check(kv["eager"] >= kv["compiled"], f"the eager server has fewer KV tokens ({kv['eager']}) than the "
                                             f"compiled one ({kv['compiled']}): eager has no graph pool to pay for")
        out += [Measured(f"kv_tokens_{n}", [kv[n]], "count", "higher", depends=DEPENDS_DEVICE)
                for n in EAGER_SERVERS]
        out.append(Measured("kv_tokens_compiled_vs_eager", [kv["compiled"] / kv["eager"]], "x", "higher"))
    return out + attached + [
        Attached("servers", {n: {"startup_s": f.startup_s, "engine_init_s": f.engine_init_s,
                                 "kv_cache_tokens": f.kv_cache_tokens, "argv": list(f.argv)} for n, f in facts.items()}),
        Attached("workload", {"input_len": p.input_len, "output_len": p.output_len, "concurrency": list(levels),
                              "reps": runs.workload.reps, "side_by_side": p.side_by_side}),
        Attached("quiet_waits", runs.quiet_waits)]  # before each switch of server


PREFIX_SERVERS = ("on", "off")
PREFIX_PHASES = ("cold", "warm")


def prefix_workload(p: ServingProfile) -> ServingWorkload:
    """Each repetition makes fresh shared prefixes (so the cold phase is really cold for them), then runs
    the same requests twice on each server: cold, then warm."""
    prompts = Prompts(p.prefix_requests, p.prefix_len, p.prefix_output_len, shape="shared_prefix",
                      num_prefixes=p.num_prefixes, suffix_len=p.suffix_len)
    return _pair(p, {"on": DEFAULT_SERVER, "off": ServerConfig(prefix_caching=False)},
                 tuple(Phase(f"{n}-{ph}", n, prompts, seed=7000, concurrency=p.prefix_concurrency, load_seed=0,
                             counters=("prefix_cache",)) for n in PREFIX_SERVERS for ph in PREFIX_PHASES),
                 reps=p.reps, retry_starved=False)


def prefix_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    p = case.values.profile
    for r in runs.kept:
        for ph in PREFIX_PHASES:
            off_hits = r.phases[f"off-{ph}"].counters["prefix_hit_tokens"]
            check(off_hits == 0, f"prefix caching is off but the server counted {off_hits:.0f} hit tokens ({ph})")
    hit = {ph: [x.counters["prefix_hit_rate"] for x in runs.kept_phase(f"on-{ph}")] for ph in PREFIX_PHASES}
    check(all(math.isfinite(h) for h in hit["cold"] + hit["warm"]), "prefix cache counters did not move on the 'on' server")

    def per_rep(server: str, phase: str, figure: Callable[[ServingSummary], float]) -> list[float]:
        return [figure(x.summary) for x in runs.kept_phase(f"{server}-{phase}")]

    def rps(s):
        return s.request_throughput_rps

    def ttft(s):
        return s.ttft_ms.mean

    ratios = {f"{ph}_rps_on_vs_off": paired_ratio(per_rep("on", ph, rps), per_rep("off", ph, rps)) for ph in ("warm", "cold")}
    ratios.update({f"{ph}_ttft_on_vs_off": paired_ratio(per_rep("on", ph, ttft), per_rep("off", ph, ttft))
                   for ph in ("warm", "cold")})
    ratios.update({f"{n}_warm_vs_cold_rps": paired_ratio(per_rep(n, "warm", rps), per_rep(n, "cold", rps))
                   for n in PREFIX_SERVERS})
    # Without a cache, a repeat is no faster than the first pass (seed: 2.99 vs 2.98 req/s): a change in
    # off_warm_vs_cold_rps means the "on" gains are partly engine warm-up.
    mix = cpu_ratio_depends(case)
    out: list[Record] = [Measured(name, ratios[name], "x", better, depends=mix) for name, better in (
        ("warm_rps_on_vs_off", "higher"), ("warm_ttft_on_vs_off", "lower"), ("cold_rps_on_vs_off", "higher"),
        ("cold_ttft_on_vs_off", "lower"), ("on_warm_vs_cold_rps", "higher"), ("off_warm_vs_cold_rps", "lower"))]
    out += [Measured("server_hit_rate_warm", hit["warm"], "fraction", "higher"),
            Measured("server_hit_rate_cold", hit["cold"], "fraction", "higher")]
    for n in PREFIX_SERVERS:
        for ph in PREFIX_PHASES:
            sums = [x.summary for x in runs.kept_phase(f"{n}-{ph}")]
            out += [Measured(f"{n}_{ph}_rps", [s.request_throughput_rps for s in sums], "req/s", "higher"),
                    Measured(f"{n}_{ph}_total_tok_s", [s.total_token_throughput_tok_s for s in sums], "tok/s", "higher"),
                    *latency_records(sums, f"{n}_{ph}_")]
    raw = [{"rep": r.index, "side_by_side": p.side_by_side,
            "phases": {name: {"summary": x.summary.to_dict(), "server_hit_tokens": x.counters["prefix_hit_tokens"],
                              "records": [rec.to_dict() for rec in x.result.records]}
                       for name, x in r.phases.items()}} for r in runs.kept]
    return out + [
        Attached("workload", {"prefix_len": p.prefix_len, "suffix_len": p.suffix_len, "output_len": p.prefix_output_len,
                              "requests": p.prefix_requests, "prefixes": p.num_prefixes,
                              "request_reuse": 1 - p.num_prefixes / p.prefix_requests,
                              "concurrency": p.prefix_concurrency}),
        Attached("requests", raw), Attached("quiet_waits", runs.quiet_waits)]


# ---- tensor and data parallel against one GPU ----------------------------------------------------

def parallel_workload(layout: ParallelServing) -> ServingWorkload:
    p = layout.profile
    servers = {"one_gpu": DEFAULT_SERVER,
               layout.name: ServerConfig(variant=layout.name, extra_args=layout.engine_args)}
    phases = tuple(Phase(f"{n}-C={c}", n, _closed(p, c), seed=11000 + c, seed_step=10, concurrency=c, load_seed=0)
                   for n in servers for c in layout.concurrency)
    return ServingWorkload(servers, phases, reps=p.reps, side_by_side=False, identify=layout.name)


def parallel_reduce(case: Case, runs: ServingRuns) -> list[Record]:
    layout: ParallelServing = case.values.layout
    out: list[Record] = []
    tok_s = {}
    for n in ("one_gpu", layout.name):
        for c in layout.concurrency:
            tok_s[n, c] = [x.summary.output_throughput_tok_s for x in runs.kept_phase(f"{n}-C={c}")]
            out.append(Measured(f"c{c}_output_tok_s_{n}", tok_s[n, c], "tok/s", "higher"))
    for c in layout.concurrency:
        out.append(Measured(f"c{c}_output_tok_s_{layout.name}_vs_one_gpu",
                            [statistics.median(tok_s[layout.name, c]) / statistics.median(tok_s["one_gpu", c])],
                            "x", "higher"))
    kv_one, kv_par = runs.servers["one_gpu"].kv_cache_tokens, runs.servers[layout.name].kv_cache_tokens
    if kv_one and kv_par:
        if layout.tensor_parallel > 1:
            check(kv_par > kv_one, f"TP={layout.tensor_parallel} has {kv_par} KV tokens, not more than one GPU's {kv_one}")
        out.append(Measured(f"kv_tokens_{layout.name}_vs_one_gpu", [kv_par / kv_one], "x", "higher"))
    return out + [Attached("kv_cache_tokens", {"one_gpu": kv_one, layout.name: kv_par})]


# ---- decode tokens/s of external commands --------------------------------------------------------

def external_measure(source: Any, case: Case):
    """Run the configured command with its placeholders: this interpreter, the suite's tiny models
    (built only when the command names them: tokenizers, transformers)."""
    import sys

    from perfgate.workloads.serving.decode_command import run_decode_command
    from perfgate.workloads.serving.profiles import CPU_PROFILE

    command = case.values
    argv = " ".join(command.argv)
    placeholders = {"python": sys.executable}
    for kind in ("dense", "moe"):
        if f"{{{kind}_model_dir}}" in argv:
            placeholders[f"{kind}_model_dir"] = str(source.model_dir(CPU_PROFILE, kind))
    return run_decode_command(command, placeholders, cwd=source.work_dir)


def external_reduce(case: Case, result) -> list[Record]:
    check(all(x > 0 for x in result.tok_s), f"non-positive tokens/s from {result.argv}: {result.tok_s}")
    return [Measured("decode_tok_s", result.tok_s, "tok/s", "higher"),
            Attached("command", {"argv": result.argv, "wall_s": result.wall_s, "tok_s": result.tok_s,
                                 "stdout_tail": result.stdout_tail})]


# ---- the table -----------------------------------------------------------------------------------

def drive_case(source: Any, case: Case) -> ServingRuns:
    """The driver over the case's workload (every row but the external commands)."""
    return drive(source, case.values.profile, case.values.workload)


ROWS: dict[str, Row] = {
    "concurrency": Row(drive_case, concurrency_reduce),
    "decode": Row(drive_case, decode_reduce),
    "long_prefill": Row(drive_case, long_prefill_reduce),
    "poisson": Row(drive_case, poisson_reduce),
    "rss": Row(drive_case, rss_reduce),
    "bench": Row(drive_case, bench_reduce),
    "kv": Row(drive_case, kv_reduce),
    "eager": Row(drive_case, eager_reduce),
    "prefix": Row(drive_case, prefix_reduce),
    "parallel": Row(drive_case, parallel_reduce),
    "external_decode": Row(external_measure, external_reduce),
}
