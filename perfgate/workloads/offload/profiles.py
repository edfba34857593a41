"""The offload profile: sizes and counts of every offload test on the machine's own disk (data only)."""
from __future__ import annotations

from dataclasses import dataclass

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


MARKS = ("cpu", "ssd")     # the machine's own disk: every machine has one
GROUP = "offload-ssd"      # one worker: the tests share the model file, its readers and the disk

MARKS = ("cpu", "ssd")     # the machine's own disk: every machine has one
GROUP = "offload-ssd"      # one worker: the tests share the model file, its readers and the disk
