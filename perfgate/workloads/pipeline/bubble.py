"""Pipeline-bubble arithmetic: theory, measurement from busy time, imbalance. Pure functions.

Theory (balanced stages, forward and backward each take the same time on every stage):

* non-interleaved schedules (GPipe, 1F1B): the pipeline runs ``M + PP - 1`` slots of which
  each stage is busy in ``M``, so ``bubble = (PP - 1) / (M + PP - 1)``.
* interleaved 1F1B with ``v`` model chunks per rank (Narayanan et al. 2021): each slot is
  ``1/v`` as long, so ``bubble = (PP - 1) / (v * M + PP - 1)``. This holds for ``M >= PP``
  (full rounds of PP microbatches). With ``M < PP`` a microbatch never meets another on the
  same rank, the schedule degenerates to fill and drain over ``v * PP`` chunk slots, and
  ``bubble = 1 - v * M / (M + v * PP - 1)``; at ``M = 1`` that is ``(PP - 1) / PP`` as for
  any schedule. Both forms agree at ``M = PP``.

Measurement: each stage (rank) sums the time it spends inside its forward and backward
chunk computations (busy time) during one schedule step; the pipeline's wall time is the
longest any rank spent in that step. The measured bubble is the mean idle fraction over
stages, ``1 - mean(busy) / wall``; it equals the theory above when stages are balanced and
communication is free, and exceeds it when they are not (point-to-point transfers, the loss,
an embedding or LM head that makes an end stage slower all count as idle on the others).
"""
from __future__ import annotations

import math
from typing import Mapping, Sequence

_BUSY_SLACK = 1.01  # busy may exceed wall by clock granularity, not by more


def theoretical_bubble(pp: int, microbatches: int, virtual_stages: int = 1) -> float:
    """Idle fraction of a balanced pipeline (see the module docstring for the formulas)."""
    for name, value in (("pp", pp), ("microbatches", microbatches), ("virtual_stages", virtual_stages)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if virtual_stages == 1 or microbatches >= pp:
        return (pp - 1) / (virtual_stages * microbatches + pp - 1)
    return 1.0 - virtual_stages * microbatches / (microbatches + virtual_stages * pp - 1)


def measured_bubble(busy_s: Sequence[float], wall_s: float) -> float:
    """Mean idle fraction of the stages: ``1 - mean(busy) / wall``."""
    fractions = idle_fractions(busy_s, wall_s)
    return sum(fractions) / len(fractions)


def idle_fractions(busy_s: Sequence[float], wall_s: float) -> list[float]:
    """Per-stage idle fraction ``1 - busy_i / wall``; rejects impossible inputs loudly."""
    if not busy_s:
        raise ValueError("no stages: busy_s is empty")
    if not (wall_s > 0 and math.isfinite(wall_s)):
        raise ValueError(f"wall time must be positive and finite, got {wall_s!r}")
    out = []
    for stage, busy in enumerate(busy_s):
        if not (busy >= 0 and math.isfinite(busy)):
            raise ValueError(f"stage {stage}: busy time must be >= 0 and finite, got {busy!r}")
        if busy > wall_s * _BUSY_SLACK:
            raise ValueError(f"stage {stage}: busy {busy:.6f} s exceeds the step's wall time {wall_s:.6f} s; "
                             "the busy-time brackets or the wall clock are wrong")
        out.append(max(0.0, 1.0 - busy / wall_s))
    return out


def imbalance(values: Sequence[float]) -> float:
    """max/min of per-stage values (parameter counts, busy times); 1.0 is perfectly balanced."""
    if not values:
        raise ValueError("imbalance of an empty sequence")
    lo, hi = min(values), max(values)
    if lo <= 0:
        raise ValueError(f"imbalance needs positive values, got min {lo!r}")
    return hi / lo


def ratio(numerator: float, denominator: float) -> float:
    """numerator/denominator that refuses a zero denominator instead of returning inf."""
    if denominator == 0:
        raise ValueError(f"ratio with zero denominator (numerator {numerator!r})")
    return numerator / denominator


def per_iteration(rank_records: Sequence[Mapping[str, Sequence[float]]]) -> dict[str, list[float]]:
    """Combine the per-rank, per-iteration timings of one run into per-iteration series.

    ``rank_records[r]`` holds equal-length lists ``busy_s`` (time inside rank r's chunks),
    ``sched_s`` (rank r's time in the schedule step) and ``step_s`` (schedule step plus
    optimizer step). Iteration i of the pipeline took ``max_r sched_s[r][i]``: every rank
    starts the step together (after a barrier) and the step ends when the last one does.
    Returns ``bubble``, ``wall_s``, ``step_s``, ``busy_imbalance`` per iteration.
    """
    if not rank_records:
        raise ValueError("no ranks")
    n = len(rank_records[0]["busy_s"])
    for r, rec in enumerate(rank_records):
        for key in ("busy_s", "sched_s", "step_s"):
            if len(rec[key]) != n:
                raise ValueError(f"rank {r}: {key} has {len(rec[key])} iterations, rank 0 has {n}")
    if n == 0:
        raise ValueError("no iterations recorded")
    out: dict[str, list[float]] = {"bubble": [], "wall_s": [], "step_s": [], "busy_imbalance": []}
    for i in range(n):
        busy = [rec["busy_s"][i] for rec in rank_records]
        wall = max(rec["sched_s"][i] for rec in rank_records)
        out["bubble"].append(measured_bubble(busy, wall))
        out["wall_s"].append(wall)
        out["step_s"].append(max(rec["step_s"][i] for rec in rank_records))
        out["busy_imbalance"].append(imbalance(busy))
    return out
