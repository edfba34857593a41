"""Serving measurements: a real `vllm serve`, our load generator, metrics from raw records.

Modules: profiles (workload sizes per machine class), workload (a serving workload as data and the
one driver that runs it against live servers), measurements (each test's workload and reduce, one
row each), loadgen (requests and raw timings), serving_metrics (records -> TTFT/TPOT/ITL/goodput),
server (start/stop vllm serve), prometheus_counters (its /metrics counters), vllm_bench (vLLM's own
benchmark, for the cross-check), tiny_model (model dirs with no download), decode_command and
hf_decode (decode tokens/s of external commands), starvation (runs in which a starved client read
whole answers at once). None imports vLLM.

This file is the area: the profiles' cases, one per test and level (``kind``: the test), whose
values hold the workload the test's row builds; ``measure`` runs it (workload.drive, given a
:class:`~perfgate.workloads.serving.workload.ServerSource`: fixtures/serving.py's pool of servers)
and ``reduce`` is the row's: records and hard invariants (CheckFailed), or AllStarved when every
repetition had a starved client.
"""
from __future__ import annotations

from typing import Any, Sequence

from perfgate.workloads.area import Area, Case, Identified, Record
from perfgate.workloads.serving.decode_command import DecodeCommand
from perfgate.workloads.serving.measurements import (CONCURRENCY_LEVELS, ROWS, ServingCase, bench_workload,
                                                     busy_records, concurrency_workload, decode_workload,
                                                     eager_workload, kv_workload, latency_records,
                                                     long_prefill_workload, parallel_workload,
                                                     poisson_workload, prefix_workload, rss_workload)
from perfgate.workloads.serving.workload import ServingRuns
from perfgate.workloads.serving.profiles import (CPU_PROFILE, GPU_PROFILE, PROFILES, BenchBounds, ParallelServing,
                                                 ServingProfile)

__all__ = ["AREA", "BenchBounds", "CPU_PROFILE", "GPU_PROFILE", "PROFILES", "ParallelServing", "ServingCase",
           "ServingProfile", "busy_records", "cases", "decode_command_cases", "latency_records"]

# one case per profile of each of these tests (kind -> the workload its row runs)
_ONE_PER_PROFILE = {"long_prefill": long_prefill_workload, "poisson": poisson_workload, "rss": rss_workload,
                    "bench": bench_workload, "kv": kv_workload, "eager": eager_workload, "prefix": prefix_workload}
PARALLEL_LAYOUTS = ((2, 1, (1, 32)), (1, 2, (32, 128)))  # (TP, DP, concurrency levels) on 2 GPUs


def cases(profile: ServingProfile) -> list[Case]:
    """Every vLLM test's cases on ``profile``: the concurrency sweep's levels (those outside the profile's
    sweep skip), single-stream decode of the dense and the MoE model, one case of each other test, and
    on the GPU profile the 2-GPU layouts (kind ``parallel``), which skip where there are fewer GPUs."""
    p = profile
    marks = ("cpu" if p.name == "cpu" else "1gpu", "vllm")

    def marks_of(key: str) -> tuple[str, ...]:
        return marks + ("slow",) if key in p.slow else marks
    out = [Case(f"{p.name}-C={c}", ServingCase(p, concurrency_workload(p, c), concurrency=c), marks,
                kind="concurrency", skip=None if c in p.concurrency else
                f"C={c} is not in the {p.name} profile's sweep {p.concurrency}") for c in CONCURRENCY_LEVELS]
    out += [Case(f"{p.name}-{m}", ServingCase(p, decode_workload(p, m)), marks_of(f"decode-{m}"), kind="decode")
            for m in ("dense", "moe")]
    out += [Case(p.name, ServingCase(p, build(p)), marks_of(kind), kind=kind)
            for kind, build in _ONE_PER_PROFILE.items()]
    if p.name == "gpu":
        for tp, dp, levels in PARALLEL_LAYOUTS:
            layout = ParallelServing(p, tp, dp, levels)
            out.append(Case(f"{p.name}-{layout.name}", ServingCase(p, parallel_workload(layout), layout=layout),
                            ("2gpu", "vllm"), kind="parallel"))
    return out


def decode_command_cases(commands: Sequence[DecodeCommand], config: str) -> list[Case]:
    """One case per external decode command configured in the file ``config``; its markers are the
    command's own, and a command this machine lacks (an executable, a variable) skips naming what."""
    out = []
    for cmd in commands:
        missing = cmd.missing()
        out.append(Case(cmd.name, cmd, tuple(cmd.markers), kind="external_decode",
                        skip=f"decode command {cmd.name!r} ({config}): {', '.join(missing)}" if missing else None))
    return out


def measure(source: Any, case: Case) -> Any:
    """What the case's row measures (workload.drive over the case's workload, or an external command)."""
    return ROWS[case.kind].measure(source, case)


def reduce(case: Case, raw: Any) -> list[Record]:
    """The case's row's reduce (metrics, attachments, the hard invariants of what ``measure`` returned),
    after what the results name beyond the test id: the measured server's model and flags."""
    records = ROWS[case.kind].reduce(case, raw)
    return ([Identified(raw.identity)] if isinstance(raw, ServingRuns) and raw.identity else []) + records


AREA: Area[ServingProfile, Any, Any] = Area("serving", PROFILES, cases, measure, reduce)
