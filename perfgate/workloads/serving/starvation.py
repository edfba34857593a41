"""Starved clients: runs that say nothing about serving speed, and what to do with them.

On 2 shared vCPUs the load generator's process is now and then starved of CPU for a whole
run: it then reads every token of an answer in one piece (median TPOT ~0, TTFT = E2EL), for
our generator and `vllm bench serve` alike (docs/serving.md). No vLLM step takes under
STARVED_MS, so a median TPOT or ITL below it is starvation, not speed. The serving tests
ask here whether a run was starved and re-run starved runs through :func:`unstarved_runs`,
so the rule is written once; a measurement whose every run was starved raises :class:`AllStarved`.
"""
from __future__ import annotations

from typing import Callable, TypeVar

T = TypeVar("T")

STARVED_MS = 0.1  # no vLLM step is this short: a median TPOT/ITL below it is a starved client


def starved(*median_ms: float) -> bool:
    """Whether any of these per-run medians (TPOT, ITL, ms) is too short to be a real step."""
    return min(median_ms) <= STARVED_MS


def unstarved_runs(run: Callable[[int], T], is_starved: Callable[[T], bool], *, wanted: int,
                   extra: int) -> tuple[list[T], list[T]]:
    """Call ``run(i)`` for i = 0, 1, ... until ``wanted`` runs were not starved or ``extra``
    starved runs were spent; returns (the unstarved runs, every run in order)."""
    kept: list[T] = []
    every: list[T] = []
    while len(kept) < wanted and len(every) < wanted + extra:
        result = run(len(every))
        every.append(result)
        if not is_starved(result):
            kept.append(result)
    return kept, every


class AllStarved(Exception):
    """Every repetition had a client starved of CPU: the machine measured nothing now. Not a failure of
    the system under test: the perf test skips with this reason (perf/serving/conftest.py)."""


def skip_reason(runs: int, what: str) -> str:
    """The one sentence a test skips with when every run was starved."""
    return (f"all {runs} run(s) had a client starved of CPU ({what}): no serving speed to measure "
            "on this machine now")
