"""Per-rank raw pipeline timings -> per-M series the tests record. Pure arithmetic.

Both pipeline workers (torch_pp, megatron_pp) return, per rank, ``runs``: one record per M
with equal-length per-iteration lists ``busy_s``, ``sched_s``, ``step_s`` (and on rank 0,
when a PP=1 reference ran, ``ref_step_s``). Everything a test records is derived here, once,
so a number in a report can be re-derived from the attached raw data.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from perfgate.workloads.pipeline.bubble import imbalance, per_iteration, ratio, theoretical_bubble


@dataclass
class MSeries:
    """One M of one run; every list has one entry per measured iteration."""

    m: int
    pp: int
    virtual_stages: int
    theory: float
    bubble: list[float]
    bubble_vs_theory: list[float]
    tokens_per_s: list[float]
    speedup_vs_pp1: list[float]
    busy_imbalance: list[float]
    wall_s: list[float]
    step_s: list[float]
    ref_step_s: list[float]
    busy_s_by_rank: list[list[float]]
    chunk_calls_by_rank: list[list[int]]
    loss: list[float] = field(default_factory=list)

    def median(self, name: str) -> float:
        values = sorted(getattr(self, name))
        n = len(values)
        if not n:
            raise ValueError(f"M={self.m}: no samples of {name}")
        return values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def series_by_m(rank_results: Sequence[dict], *, pp: int, virtual_stages: int,
                tokens_per_microbatch: int) -> dict[int, MSeries]:
    """Combine all ranks' ``runs`` into one :class:`MSeries` per M."""
    if not rank_results:
        raise ValueError("no rank results")
    out: dict[int, MSeries] = {}
    for k, run0 in enumerate(rank_results[0]["runs"]):
        m = run0["m"]
        records = []
        for r, res in enumerate(rank_results):
            rec = res["runs"][k]
            if rec["m"] != m:
                raise ValueError(f"rank {r} run {k} is M={rec['m']}, rank 0's is M={m}")
            records.append(rec)
        it = per_iteration(records)
        theory = theoretical_bubble(pp, m, virtual_stages)
        tokens = m * tokens_per_microbatch
        ref = next((rec["ref_step_s"] for rec in records if rec.get("ref_step_s")), [])
        if ref and len(ref) != len(it["step_s"]):
            raise ValueError(f"M={m}: {len(ref)} reference steps for {len(it['step_s'])} pipeline steps")
        loss = next((rec["loss"] for rec in records if rec.get("loss")), [])
        out[m] = MSeries(
            m=m, pp=pp, virtual_stages=virtual_stages, theory=theory,
            bubble=it["bubble"],
            bubble_vs_theory=[ratio(b, theory) for b in it["bubble"]] if theory > 0 else [],
            tokens_per_s=[tokens / s for s in it["step_s"]],
            speedup_vs_pp1=[ratio(r_s, p_s) for r_s, p_s in zip(ref, it["step_s"])],
            busy_imbalance=it["busy_imbalance"],
            wall_s=it["wall_s"], step_s=it["step_s"], ref_step_s=list(ref),
            busy_s_by_rank=[list(rec["busy_s"]) for rec in records],
            chunk_calls_by_rank=[list(rec.get("chunk_calls", [])) for rec in records],
            loss=list(loss),
        )
    return out


def stage_params(rank_results: Sequence[dict]) -> list[int]:
    """Parameters held per rank (all its chunks), in rank order."""
    return [sum(res["chunk_params"].values()) for res in rank_results]


def param_imbalance(rank_results: Sequence[dict]) -> float:
    """max/min parameters per rank: the seed's 2.76x at PP=8 comes from embedding and head."""
    return imbalance(stage_params(rank_results))


@dataclass
class Trend:
    """How the bubble moved from the smallest to the largest M of one run."""

    m_lo: int
    m_hi: int
    theory_lo: float
    theory_hi: float
    medians: dict[int, float]            # measured bubble median per M, in M order
    minima: dict[int, float]             # least-disturbed iteration per M (load only adds idle time)
    theory: dict[int, float]
    lo_over_hi: list[float]              # per iteration: bubble(M_lo) / bubble(M_hi)
    drop: list[float]                    # per iteration: bubble(M_lo) - bubble(M_hi)
    drop_vs_theory: list[float]          # drop / (theory_lo - theory_hi)

    @property
    def theory_lo_over_hi(self) -> float:
        return ratio(self.theory_lo, self.theory_hi)

    def monotonic(self) -> bool:
        """Measured medians strictly fall as M grows (what theory says for any PP > 1)."""
        values = list(self.medians.values())
        return all(a > b for a, b in zip(values, values[1:]))

    def falls(self, *, min_fraction_of_theory: float, rise_slack: float) -> bool:
        """The bubble falls from M_lo to M_hi by at least ``min_fraction_of_theory`` of the
        theoretical drop, and never rises by more than ``rise_slack`` from one M to the next.

        Judged on each M's least-disturbed iteration (its minimum): other jobs on a shared
        machine only ever add idle time, so the minimum is the best estimate of what the
        schedule itself does (the reasoning behind timeit's min). A schedule that stops
        overlapping stages, or brackets that see no work, fail it on every iteration.
        """
        values = list(self.minima.values())
        dropped = values[0] - values[-1] >= min_fraction_of_theory * (self.theory_lo - self.theory_hi)
        return dropped and all(b - a <= rise_slack for a, b in zip(values, values[1:]))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["theory_lo_over_hi"] = self.theory_lo_over_hi
        return d


def trend(series: dict[int, MSeries]) -> Trend:
    """Relation between the bubble at the smallest and the largest M, iteration by iteration.

    Iteration i at M_lo is paired with iteration i at M_hi (same launch, same ranks); the
    pairing carries no meaning beyond giving one sample per iteration.
    """
    ms = sorted(series)
    if len(ms) < 2:
        raise ValueError(f"a trend needs at least two values of M, got {ms}")
    lo, hi = series[ms[0]], series[ms[-1]]
    n = min(len(lo.bubble), len(hi.bubble))
    theory_drop = lo.theory - hi.theory
    if theory_drop <= 0:
        raise ValueError(f"theory predicts no drop from M={lo.m} to M={hi.m} (pp={lo.pp})")
    drop = [lo.bubble[i] - hi.bubble[i] for i in range(n)]
    return Trend(
        m_lo=lo.m, m_hi=hi.m, theory_lo=lo.theory, theory_hi=hi.theory,
        medians={m: series[m].median("bubble") for m in ms},
        minima={m: min(series[m].bubble) for m in ms},
        theory={m: series[m].theory for m in ms},
        lo_over_hi=[ratio(lo.bubble[i], hi.bubble[i]) for i in range(n)],
        drop=drop,
        drop_vs_theory=[d / theory_drop for d in drop],
    )
