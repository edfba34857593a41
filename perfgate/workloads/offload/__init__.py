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
and counts of every offload test, the layer-read cases, and ``reduce``: per-round raw read
times of two strategies -> one ratio of their medians per round (the gated figure).
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.workloads.area import Area, Case
from perfgate.workloads.offload.device_probe import DEFAULT_THREADS


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


def cases(profile: Profile) -> list[Case]:
    """One layer of k expert reads per (io, threads); the test module's marks select the machine."""
    return [Case(f"{io}-{t}threads", (io, t), ()) for io, t in profile.layer_cases]


def reduce(rounds_a, rounds_b) -> list[float]:
    """Per round, median of strategy a's samples over median of b's: one gated sample per round."""
    import statistics

    from perfgate.judge.metrics import paired_ratio

    return paired_ratio([statistics.median(a) for a in rounds_a], [statistics.median(b) for b in rounds_b])


AREA = Area("offload", PROFILES, cases, reduce)
