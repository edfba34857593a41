"""MoE expert offload: how fast can one missed expert come off the SSD, and how often does it miss?

The reference is the second seed report: a 35B-A3B MoE model streamed from SSD on an 8 GB machine.
Per token and per layer the router picks k experts; an expert not in RAM must be read from the GGUF
file as three separate tensor segments (gate, up, down) that lie far apart in the file. Decode speed
is then bounded by (a) how long the slowest missed expert of a layer takes to read and (b) how many
experts miss.

Modules, one job each:
  gguf_layout   GGUF file -> per-expert (offset, length) segments
  page_cache    drop a file's pages from the page cache; residency check; O_DIRECT buffers
  device_probe  the device: random reads of one block size at 1..16 threads; 4 KiB latency / IOPS
  expert_reads  the critical path: one expert (3 segments) and one layer (k experts) read cold
  cache_sim     routing traces -> hit rates of LRU / Belady / hot-set pin / admit-after-N, reuse, U(k)
  decode_model  measured miss latency + hit rate + layer count -> predicted decode tok/s

Nothing here imports pytest: tests in perf/offload/ and the CLIs in tools/ both call these.

This file is the area: one profile (the machine's own SSD, markers cpu + ssd) with the sizes
and counts of every offload test, the cases of its parametrized tests, and the read comparisons:
``measure`` (an open reader -> per-round raw read times of two strategies, interleaved) and
``reduce`` (-> one ratio of their medians per round, the gated figure, and the times beside it).
The reads run in this process (no ranks): what would be per rank elsewhere is per round here.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from perfgate.judge.metrics import paired_ratio
from perfgate.workloads.area import Area, Attached, Case, Measured, Record, check
from perfgate.workloads.offload.device_probe import DEFAULT_THREADS

if TYPE_CHECKING:
    from perfgate.workloads.offload.expert_reads import ExpertReader


@dataclass(frozen=True)
class Profile:
    name: str
    k: int                                  # experts per token in the seed model (Qwen3 35B-A3B)
    read_rounds: int                        # expert and layer reads: rounds of interleaved samples
    layer_cases: tuple[tuple[str, int], ...]  # (io, threads) of one layer's k expert reads
    split_chunks: tuple[int, ...]           # a segment read as this many chunks
    probe_rounds: int
    probe_reads_per_round: int
    probe_threads: tuple[int, ...]
    decode_rounds: int
    seed_hit_rate: float                    # the seed report's expert-cache hit rate and layer count
    seed_layers: int
    cache_seeds: int
    cache_capacities: tuple[int, ...]
    cache_shape: tuple[tuple[str, int], ...]
    cache_policies: tuple[str, ...]
    fio_pairs: int
    fio_run_s: float


SSD = Profile(
    name="ssd", k=8, read_rounds=9,
    layer_cases=tuple([("buffered", t) for t in (8, 16, 24, 32)] + [("direct", 24)]), split_chunks=(2, 4),
    probe_rounds=5, probe_reads_per_round=64, probe_threads=DEFAULT_THREADS,
    decode_rounds=7, seed_hit_rate=0.70, seed_layers=40,
    cache_seeds=5, cache_capacities=(64, 128, 256, 512),
    cache_shape=(("tokens", 128), ("layers", 8), ("experts", 128), ("k", 8)),
    cache_policies=("lru", "belady", "pin", "admit2"),
    fio_pairs=10, fio_run_s=0.5,
)
PROFILES = {"ssd": SSD}


MARKS = ("cpu", "ssd")     # the machine's own disk: every machine has one
GROUP = "offload-ssd"      # one worker: the tests share the model file, its readers and the disk


@dataclass(frozen=True)
class ReadComparison:
    """Two read strategies of the same experts, interleaved sample by sample (kind ``expert_read``,
    ``layer_read`` or ``split_read``); the gated figure is the paired ratio of their medians."""

    io: str                    # "buffered" | "direct" (O_DIRECT)
    threads: int = 0           # layer reads: threads of the parallel strategy
    split: int = 1             # split reads: chunks per segment


def _case(kind: str, ident: str, values) -> Case:
    return Case(ident, values, MARKS, GROUP, kind=kind)


def cases(profile: Profile) -> list[Case]:
    """Every parametrized offload test's cases: read comparisons, device probes, the fio check."""
    out = [_case("expert_read", io, ReadComparison(io)) for io in ("buffered", "direct")]
    out += [_case("layer_read", f"{io}-{t}threads", ReadComparison(io, threads=t)) for io, t in profile.layer_cases]
    out += [_case("split_read", f"{n}chunks", ReadComparison("buffered", split=n)) for n in profile.split_chunks]
    out += [_case("device_probe", f"segment-{t}threads", t) for t in profile.probe_threads]
    out += [_case("small_read_probe", f"4KiB-{t}thread" + ("s" if t > 1 else ""), t) for t in (1, 16)]
    out += [_case("fio_crosscheck", f"qd{t}", t) for t in (1, 8)]
    return out


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


def measure(reader: ExpertReader, case: Case) -> ReadRounds:
    """Interleaved rounds of the case's two strategies on an open ExpertReader (page cache dropped
    before every read), then a check that every strategy delivers exactly the file's bytes."""
    import numpy as np

    from perfgate.workloads.offload.expert_reads import read_expert_bytes

    k = reader.layout.expert_used_count or SSD.k  # a user's file may say otherwise
    specs = read_specs(case, k)
    samples: dict[str, list[list[float]]] = {name: [] for name in specs}
    depth_by_round: dict[str, list[float]] = {}
    reader.sample(next(iter(specs.values())))  # warm the pools and the arena
    for _ in range(SSD.read_rounds):
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


def reduce(case: Case, raw: ReadRounds) -> list[Record]:
    """Per round, the median of one strategy's samples over the other's (one gated sample per
    round), the mechanism behind it (reads in flight), and the absolute times beside them."""
    import statistics

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


AREA: Area[Profile, "ExpertReader", ReadRounds] = Area("offload", PROFILES, cases, measure, reduce)
