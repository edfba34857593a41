"""Each offload measurement as one row: what it reads (``measure``, on the open model file) and how the
raw reads become its metrics and checks (``reduce``).

Why rows: one way from raw reads to numbers for every offload test (the read comparisons, the decode
prediction, the device probe, the expert-cache simulation, the fio cross-check), so a test is a case
and a new measurement is a row. What ``measure`` is given (:class:`OffloadSource`) is the session's
model file, its layout, its open readers and its device probe (perf/offload/conftest.py); what each
measurement shows and why its figures are gated or recorded is in its test's docstring.
"""
from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

import numpy as np

from perfgate.judge.metrics import paired_ratio
from perfgate.workloads.area import Attached, Case, Measured, Record, Row, check
from perfgate.workloads.offload.profiles import GROUP, MARKS, SSD, Profile

if TYPE_CHECKING:
    from perfgate.workloads.offload.cache_sim import RouteTrace
    from perfgate.workloads.offload.device_probe import DeviceProbe
    from perfgate.workloads.offload.expert_reads import ExpertReader
    from perfgate.workloads.offload.gguf_layout import ExpertLayout


class OffloadSource(Protocol):
    """What the offload measurements read with: the model file under test and what is open on it."""

    file: dict               # {"path", "source": "user" | "fixture", "bytes", "write_s"}
    layout: ExpertLayout
    cache_drop: dict         # {"resident_after_drop", "drop_s"}: the session's check that dropping works
    probe: DeviceProbe

    def reader(self, io: str) -> ExpertReader: ...          # "buffered" | "direct" (O_DIRECT)
    def need_direct_io(self, purpose: str) -> None: ...      # skip where the file's folder refuses O_DIRECT


@dataclass(frozen=True)
class ReadComparison:
    """Two read strategies of the same experts, interleaved sample by sample (kind ``expert_read``,
    ``layer_read`` or ``split_read``); the gated figure is the paired ratio of their medians."""

    io: str                    # "buffered" | "direct" (O_DIRECT)
    threads: int = 0           # layer reads: threads of the parallel strategy
    split: int = 1             # split reads: chunks per segment


@dataclass(frozen=True)
class TraceFamily:
    """An expert-cache case: one family of synthetic routing traces (fixtures/route_traces.py), its
    ``seeds`` traces made by ``make(seed)``, analysed at the profile's capacities and policies."""

    label: str
    make: Callable[[int], RouteTrace]   # trace of the family for one seed index
    profile: Profile


def _profile(case: Case) -> Profile:
    """The profile a case is measured with: the one profile (SSD), or a trace family's own."""
    return getattr(case.values, "profile", SSD)


# ---- read comparisons: one expert, one layer, split segments --------------------------------------

@dataclass
class ReadRounds:
    """What a read comparison measured: per strategy, ``read_rounds`` rounds of samples (seconds),
    the reads in flight per round (median over the round's samples), and what was read."""

    samples_s: dict[str, list[list[float]]]
    in_flight: dict[str, list[float]]
    k: int
    threads: int
    nbytes: int                 # bytes one sample reads (k experts)


def read_specs(case: Case, k: int) -> dict:
    """The two strategies of ``case`` in the order they alternate, the ratio's denominator first
    (``k``: experts per token, from the file)."""
    from perfgate.workloads.offload.expert_reads import ReadSpec

    c: ReadComparison = case.values
    if case.kind == "expert_read":
        return {"sequential": ReadSpec("sequential"), "parallel": ReadSpec("parallel")}
    if case.kind == "layer_read":
        return {"sequential": ReadSpec("sequential", k=k, threads=k),
                "parallel": ReadSpec("parallel", k=k, threads=c.threads)}
    return {"whole": ReadSpec("parallel", k=k, threads=3 * k),
            "split": ReadSpec("parallel", k=k, threads=3 * k, split=c.split)}


_PER_ROUND = {"expert_read": 11, "layer_read": 7, "split_read": 7}


def read_measure(source: OffloadSource, case: Case) -> ReadRounds:
    """Interleaved rounds of the case's two strategies on the case's open reader (page cache dropped
    before every read), then a check that every strategy delivers exactly the file's bytes."""
    from perfgate.workloads.offload.expert_reads import read_expert_bytes

    reader = source.reader(case.values.io)
    p = _profile(case)
    k = reader.layout.expert_used_count or p.k  # a user's file may say otherwise
    specs = read_specs(case, k)
    samples: dict[str, list[list[float]]] = {name: [] for name in specs}
    depth_by_round: dict[str, list[float]] = {}
    reader.sample(next(iter(specs.values())))  # warm the pools and the arena
    for _ in range(p.read_rounds):
        depth: dict[str, list[float]] = {}
        got = reader.interleaved(specs, _PER_ROUND[case.kind], in_flight=depth if case.kind != "split_read" else None)
        for name in specs:
            samples[name].append(got[name])
            if name in depth:
                depth_by_round.setdefault(name, []).append(float(np.median(depth[name])))
    for name, spec in specs.items():  # hard invariant: the bytes of the file, whatever the strategy
        experts = reader.pick(spec.k)
        reader.sample(spec, experts)
        for ex, got in zip(experts, reader.delivered(experts, spec)):
            check(got == read_expert_bytes(reader.layout.path, ex),
                  f"{name} ({spec.label}) delivered wrong bytes for layer {ex.layer} expert {ex.expert}")
    return ReadRounds(samples, depth_by_round, k, case.values.threads, reader.bytes_of(list(specs.values())[-1]))


def read_reduce(case: Case, raw: ReadRounds) -> list[Record]:
    """Per round, the median of one strategy's samples over the other's (one gated sample per
    round), the mechanism behind it (reads in flight), and the absolute times beside them."""
    rounds_b, rounds_a = (raw.samples_s[name] for name in read_specs(case, raw.k))  # b: the denominator
    ratio = paired_ratio([statistics.median(r) for r in rounds_a], [statistics.median(r) for r in rounds_b])

    def ms(rounds):
        return [x * 1e3 for r in rounds for x in r]

    def mbps(rounds):
        return [raw.nbytes / x / 1e6 for r in rounds for x in r]
    if case.kind == "split_read":
        return [Measured("split_over_whole", ratio, "x", "lower"),
                Measured("layer_whole_ms", ms(rounds_b), "ms", "lower"),
                Measured("layer_split_ms", ms(rounds_a), "ms", "lower"),
                Attached("samples_s", {"whole": rounds_b, "split": rounds_a})]
    samples = Attached("samples_s", {"sequential": rounds_b, "parallel": rounds_a})
    if case.kind == "expert_read":
        return [Measured("parallel_over_sequential", ratio, "x", "lower"),
                # The mechanism the ratio depends on, measured in the same samples: how many of the three
                # segment reads the device had in flight at once (1.0 when they run as one chain).
                Measured("parallel_reads_in_flight", raw.in_flight["parallel"], "x", "higher"),
                Measured("expert_sequential_ms", ms(rounds_b), "ms", "lower"),
                Measured("expert_parallel_ms", ms(rounds_a), "ms", "lower"),
                Measured("expert_parallel_mbps", mbps(rounds_a), "MB/s", "higher"),
                samples, Attached("expert_bytes", raw.nbytes)]
    return [Measured("parallel_over_sequential", ratio, "x", "lower"),
            # Reads in flight of the parallel strategy over the sequential one (k chains of 3), same samples:
            # on a device where parallel reads gain no time (this VM's disk) this still shows whether the
            # 3k segments were issued independently.
            Measured("in_flight_parallel_over_sequential",
                     [p / q for p, q in zip(raw.in_flight["parallel"], raw.in_flight["sequential"])], "x", "higher"),
            Measured("layer_sequential_ms", ms(rounds_b), "ms", "lower"),
            Measured("layer_parallel_ms", ms(rounds_a), "ms", "lower"),
            Measured("layer_parallel_mbps", mbps(rounds_a), "MB/s", "higher"),
            samples, Attached("spec", {"k": raw.k, "threads": raw.threads, "io": case.values.io,
                                       "layer_bytes": raw.nbytes})]


# ---- predicted decode rate -----------------------------------------------------------------------

def decode_measure(source: OffloadSource, case: Case) -> dict:
    """Per round, the per-expert (t1) and per-layer (tk) cold-read latencies of both strategies,
    interleaved, each round fed to the decode model with the file's layer count and k (the seed's
    for the fixture file) and the seed's hit rate."""
    from perfgate.workloads.offload.decode_model import DecodeModel
    from perfgate.workloads.offload.expert_reads import ReadSpec

    p = _profile(case)
    user = source.file["source"] == "user"
    n_layers = len(source.layout.layers) if user else p.seed_layers
    k = (source.layout.expert_used_count or p.k) if user else p.k
    specs = {"t1_sequential": ReadSpec("sequential"), "t1_parallel": ReadSpec("parallel"),
             "tk_sequential": ReadSpec("sequential", k=k, threads=k),
             "tk_parallel": ReadSpec("parallel", k=k, threads=3 * k)}
    reader = source.reader("buffered")
    reader.sample(specs["tk_parallel"])  # warm pools
    models: dict[str, list] = {"sequential": [], "parallel": []}
    raw, in_flight = [], []  # per round: reads in flight of the parallel layer read over the sequential one
    for _ in range(p.decode_rounds):
        depth: dict[str, list[float]] = {}
        got = reader.interleaved(specs, 5, in_flight=depth)
        in_flight.append(float(np.median(depth["tk_parallel"])) / float(np.median(depth["tk_sequential"])))
        med = {name: float(np.median(v)) for name, v in got.items()}
        raw.append(got)
        for mode in models:
            models[mode].append(DecodeModel(n_layers=n_layers, k=k, hit_rate=p.seed_hit_rate,
                                            expert_miss_s=med[f"t1_{mode}"], layer_miss_s=med[f"tk_{mode}"]))
    return {"models": models, "in_flight": in_flight, "samples_s": raw}


def decode_reduce(case: Case, raw: dict) -> list[Record]:
    models = raw["models"]
    par = [m.tok_per_s() for m in models["parallel"]]
    seq = [m.tok_per_s() for m in models["sequential"]]
    return [Measured("predicted_tok_s_parallel", par, "tok/s", "higher"),
            Measured("predicted_tok_s_sequential", seq, "tok/s", "higher"),
            Measured("predicted_speedup_parallel_over_sequential", paired_ratio(par, seq), "x", "higher"),
            Measured("layer_io_ms_parallel", [m.expected_layer_io_s() * 1e3 for m in models["parallel"]], "ms", "lower"),
            # The speedup rests on the parallel layer read keeping more reads in flight; on a device where
            # that gains little time (this VM) the concurrency still shows a pager gone sequential.
            Measured("layer_in_flight_parallel_over_sequential", raw["in_flight"], "x", "higher"),
            Attached("models", {mode: [m.as_dict() for m in ms] for mode, ms in models.items()}),
            Attached("samples_s", raw["samples_s"])]


# ---- the page-cache drop reaches the device ------------------------------------------------------

DROP_READS = 9


def drop_measure(source: OffloadSource, case: Case) -> dict:
    """Gate segments of spread experts: dropped, resident share, one cold read, the same read again
    (from the cache), resident share again, dropped again."""
    from perfgate.workloads.offload.page_cache import drop_cache, open_for_reads, resident_fraction
    from perfgate.workloads.offload.read_pool import Arena, pread_exact

    layout, path = source.layout, source.file["path"]
    layers, n_experts = layout.layer_ids, layout.n_experts
    longest = max(lt.bytes_per_expert["gate"] for lt in layout.layers)  # quant types may vary by layer
    fd = open_for_reads(path)
    buf = Arena(longest).views([longest])[0]
    out: dict[str, list[float]] = {"cold_s": [], "cached_s": [], "resident": [], "resident_after": []}
    try:
        for i in range(DROP_READS):
            s = layout.expert(layers[i % len(layers)], (7 * i) % n_experts).gate
            view = buf[:s.length]
            drop_cache(fd, s.offset // 4096 * 4096, s.length + 8192)
            out["resident"].append(resident_fraction(path, s.offset, s.length))
            t0 = time.perf_counter()
            pread_exact(fd, s.offset, view)
            out["cold_s"].append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            pread_exact(fd, s.offset, view)
            out["cached_s"].append(time.perf_counter() - t0)
            out["resident_after"].append(resident_fraction(path, s.offset, s.length))
            drop_cache(fd, s.offset // 4096 * 4096, s.length + 8192)
    finally:
        os.close(fd)
    return {**out, "file": {"path": str(path), "source": source.file["source"], "bytes": source.file["bytes"],
                            "write_s": source.file["write_s"], "drop_s": source.cache_drop["drop_s"],
                            "segment_bytes": longest}}


def drop_reduce(case: Case, raw: dict) -> list[Record]:
    """The method's checks: mincore sees the pages gone after the drop and present after the read, and
    a dropped read is clearly slower than a cached one."""
    check(max(raw["resident"]) == 0.0, f"pages still cached after DONTNEED: {raw['resident']}")
    check(min(raw["resident_after"]) == 1.0,
          f"mincore does not see pages just read ({raw['resident_after']}): the check is blind")
    cold_med, cached_med = float(np.median(raw["cold_s"])), float(np.median(raw["cached_s"]))
    check(cold_med > 2 * cached_med,
          f"a read after dropping the cache ({cold_med * 1e3:.3f} ms) is not clearly slower than a cached "
          f"read ({cached_med * 1e3:.3f} ms): the drop does not reach the device here")
    return [Measured("cold_read_ms", [x * 1e3 for x in raw["cold_s"]], "ms", "lower"),
            Measured("cached_read_ms", [x * 1e3 for x in raw["cached_s"]], "ms", "lower"),
            Attached("file", raw["file"])]


# ---- the device probe: random reads vs threads ---------------------------------------------------

def _per_round(rounds, key: str) -> list[float]:
    from perfgate.workloads.offload.device_probe import summarize_rounds
    return [summarize_rounds([r])[key] for r in rounds]


def probe_measure(source: OffloadSource, case: Case) -> list:
    """``probe_rounds`` rounds at the case's thread count: one gate segment of the file's first MoE
    layer per read (device_probe), or 4 KiB reads (small_read_probe)."""
    p = _profile(case)
    threads = case.values
    if case.kind == "small_read_probe":
        return [source.probe.round(threads, 4096, 256) for _ in range(p.probe_rounds)]
    block = source.layout.segment_bytes[0]
    return [source.probe.round(threads, block, p.probe_reads_per_round) for _ in range(p.probe_rounds)]


def probe_reduce(case: Case, rounds: list) -> list[Record]:
    from perfgate.workloads.offload.device_probe import rounds_as_json, summarize_rounds

    threads = case.values
    out: list[Record] = []
    if threads > 1:  # one thread reads 1.0 by construction
        out.append(Measured("reads_in_flight", [r.in_flight for r in rounds], "x", "higher"))
    if case.kind == "small_read_probe":
        return out + [
            Measured("read_median_us", [x * 1e3 for x in _per_round(rounds, "median_ms")], "us", "lower"),
            Measured("read_p99_us", [x * 1e3 for x in _per_round(rounds, "p99_ms")], "us", "lower"),
            Measured("iops", _per_round(rounds, "iops"), "IOPS", "higher"),
            Attached("summary", summarize_rounds(rounds))]
    return out + [
        Measured("read_median_ms", _per_round(rounds, "median_ms"), "ms", "lower"),
        Measured("read_mean_ms", _per_round(rounds, "mean_ms"), "ms", "lower"),
        Measured("read_p90_ms", _per_round(rounds, "p90_ms"), "ms", "lower"),
        Measured("read_p99_ms", _per_round(rounds, "p99_ms"), "ms", "lower"),
        Measured("aggregate_mbps", _per_round(rounds, "aggregate_mbps"), "MB/s", "higher"),
        Attached("summary", summarize_rounds(rounds)), Attached("rounds", rounds_as_json(rounds))]


SCALING_ROUNDS = 9


def scaling_measure(source: OffloadSource, case: Case) -> dict:
    """Rounds at 1 and 16 threads, interleaved so drift hits both."""
    p = _profile(case)
    block = source.layout.segment_bytes[0]
    one, many = [], []
    for _ in range(SCALING_ROUNDS):
        one.append(source.probe.round(1, block, 2 * p.probe_reads_per_round))
        many.append(source.probe.round(16, block, 2 * p.probe_reads_per_round))
    return {"1": one, "16": many}


def scaling_reduce(case: Case, raw: dict) -> list[Record]:
    one, many = raw["1"], raw["16"]
    return [Measured("bw_16t_over_1t", paired_ratio([m.aggregate_mbps for m in many], [o.aggregate_mbps for o in one]),
                     "x", "higher"),
            # The concurrency the 16-thread rounds reached (1-thread rounds are 1.0 by construction): a probe
            # that stops using its threads reads ~1 here whatever the device does.
            Measured("reads_in_flight_16t", [m.in_flight for m in many], "x", "higher"),
            Measured("aggregate_mbps_1t", [r.aggregate_mbps for r in one], "MB/s", "higher"),
            Measured("aggregate_mbps_16t", [r.aggregate_mbps for r in many], "MB/s", "higher")]


# ---- expert-cache hit rates on routing traces ----------------------------------------------------

def trace_cases(families: Sequence[Any], make_trace: Callable[[Any], RouteTrace]) -> list[Case]:
    """One expert-cache case per trace family (fixtures/route_traces.py ``TraceSpec``s, given by the test:
    the families are data of fixtures/), at the profile's trace shape; ``make_trace(spec)`` draws one."""
    shape = dict(SSD.cache_shape)
    out = []
    for family in families:
        shaped = replace(family, **shape)
        out.append(Case(shaped.label, TraceFamily(shaped.label, lambda j, f=shaped: make_trace(
            replace(f, seed=f.seed * 100 + j)), SSD), MARKS, GROUP, kind="expert_cache"))
    return out


def cache_measure(source: Any, case: Case) -> list[dict]:
    """cache_sim.analyze of each seed's trace at the profile's capacities and at the trace's distinct keys."""
    from perfgate.workloads.offload.cache_sim import analyze

    fam: TraceFamily = case.values
    out = []
    for j in range(fam.profile.cache_seeds):
        trace = fam.make(j)
        result = analyze(trace, list(fam.profile.cache_capacities) + [trace.distinct], admit_n=2)
        out.append({**result, "distinct": trace.distinct})
    return out


def cache_reduce(case: Case, per_seed: list[dict]) -> list[Record]:
    """Checked on every trace: Belady >= LRU, pin and admit-after-2; the LRU simulation equals the LRU
    curve from stack distances; with capacity >= distinct keys both reach the first-touch bound. Then
    one sample per seed of each policy's hit rate per capacity, and the trace's character."""
    p: Profile = case.values.profile
    for result in per_seed:
        rows = {r["capacity"]: r for r in result["policies"]}
        for c, r in rows.items():
            for other in ("lru", "pin", "admit2"):
                check(r["belady"] >= r[other] - 1e-12, f"Belady {r['belady']} < {other} {r[other]} at {c} slots")
            check(abs(r["lru"] - r["lru_stack_check"]) < 1e-12, f"LRU simulation != stack-distance LRU at {c}")
        full, bound = rows[result["distinct"]], result["first_touch_bound"]
        check(abs(full["lru"] - bound) < 1e-12 and abs(full["belady"] - bound) < 1e-12,
              f"capacity {result['distinct']} >= distinct, yet LRU {full['lru']} / Belady {full['belady']} "
              f"!= bound {bound}")
    out: list[Record] = []
    for c in p.cache_capacities:
        for policy in p.cache_policies:
            samples = [next(r[policy] for r in res["policies"] if r["capacity"] == c) for res in per_seed]
            out.append(Measured(f"{policy}_hit_{c}slots", samples, "fraction", "higher"))
    out += [Measured("first_touch_bound", [r["first_touch_bound"] for r in per_seed], "fraction", "higher"),
            Measured("singleton_fraction", [r["singleton_fraction"] for r in per_seed], "fraction", "lower")]
    out += [Measured(f"U{k}_read_saving", [r["U"][k]["saving"] for r in per_seed], "fraction", "higher")
            for k in ("2", "4", "8")]
    return out + [Attached("analysis", [{k: v for k, v in r.items() if k != "distinct"} for r in per_seed])]


# ---- our O_DIRECT reads against fio --------------------------------------------------------------

FIO_TARGET = 0.10   # where we want ours/fio to be (reported)
FIO_SANITY = 0.25   # beyond this the test fails: our reads do not measure the device


def fio_measure(source: OffloadSource, case: Case) -> dict:
    """Short runs of ours and fio alternating (order flipped every pair), same block, queue depth,
    O_DIRECT and random aligned offsets."""
    from perfgate.workloads.offload.device_probe import stream
    from perfgate.workloads.offload.fio import fio_version, run_fio

    source.need_direct_io("the fio comparison runs both sides with O_DIRECT")
    p = _profile(case)
    threads = case.values
    path, block = source.file["path"], source.layout.segment_bytes[0]
    ours, fio = [], []
    for i in range(p.fio_pairs):
        for who in (("ours", "fio") if i % 2 == 0 else ("fio", "ours")):
            if who == "ours":
                ours.append(stream(path, block, threads, p.fio_run_s, direct=True, seed=i)["mbps"])
            else:
                fio.append(run_fio(path, block, threads, p.fio_run_s, direct=True)["mbps"])
    return {"ours": ours, "fio": fio, "threads": threads, "block": block, "run_s": p.fio_run_s,
            "version": fio_version()}


def fio_reduce(case: Case, raw: dict) -> list[Record]:
    ours, fio = raw["ours"], raw["fio"]
    ratios = paired_ratio(ours, fio)
    med = float(np.median(ratios))
    check(abs(med - 1.0) <= FIO_SANITY, (
        f"our O_DIRECT reads reach {med:.2f}x fio's bandwidth at {raw['threads']} thread(s) "
        f"(ours {np.median(ours):.0f} MB/s, fio {np.median(fio):.0f} MB/s): outside +-{FIO_SANITY:.0%}. "
        "Below 1 on a busy CPU usually means the Python loop is starved between reads; re-run on an idle machine."))
    return [Measured("ours_over_fio", ratios, "x", "higher"), Measured("ours_mbps", ours, "MB/s", "higher"),
            Measured("fio_mbps", fio, "MB/s", "higher"),
            Attached("fio", {"version": raw["version"], "block_bytes": raw["block"], "threads": raw["threads"],
                             "run_s": raw["run_s"]}),
            Attached("agreement", {"median_ratio": med, "within_target": abs(med - 1.0) <= FIO_TARGET,
                                   "target": FIO_TARGET})]


# ---- the table -----------------------------------------------------------------------------------

ROWS: dict[str, Row] = {
    "expert_read": Row(read_measure, read_reduce),
    "layer_read": Row(read_measure, read_reduce),
    "split_read": Row(read_measure, read_reduce),
    "decode_prediction": Row(decode_measure, decode_reduce),
    "page_cache_drop": Row(drop_measure, drop_reduce),
    "device_probe": Row(probe_measure, probe_reduce),
    "small_read_probe": Row(probe_measure, probe_reduce),
    "probe_scaling": Row(scaling_measure, scaling_reduce),
    "expert_cache": Row(cache_measure, cache_reduce),
    "fio_crosscheck": Row(fio_measure, fio_reduce),
}
