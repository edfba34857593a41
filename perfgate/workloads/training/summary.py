"""Pure arithmetic over per-rank case results: what the tests record.

No torch, no I/O: the parent process turns the ranks' raw lists into per-step samples.
- step time of the job = the slowest rank's time per timed step (ranks start each step
  after a barrier, so this is the time the job as a whole spent);
- tokens/s = tokens of one optimizer step across all ranks / that step time;
- ratios between two cases (speedup, FSDP vs DDP) pair their i-th timed steps, so the
  spread of the ratio carries the noise of both measurements.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

from perfgate.judge.metrics import paired_ratio

MIB = 2 ** 20
GIB = 2 ** 30


@dataclass
class CaseSummary:
    label: str
    world_size: int
    tokens_per_step: int
    step_s: list[float]  # slowest rank, per timed step
    tokens_per_s: list[float]
    losses_by_rank: list[list[float]]
    allreduce_calls: list[int]  # per timed step (rank 0; every rank reduces the same buckets)
    peak_alloc_gib: list[float]  # max over ranks, per timed step; empty off-GPU
    rss_mib: list[float]  # max over ranks, per timed step
    tracked_peak_mib: list[float]  # max over ranks, per tracked step
    categories_mib: dict[str, list[float]] = field(default_factory=dict)  # at the peak of the worst rank
    tracker_error: str | None = None
    extra_param_copy: bool = False
    info: dict = field(default_factory=dict)
    # per timed step, the largest share of a rank's step spent blocked inside the comm hook (DDP)
    comm_blocked_fraction: list[float] = field(default_factory=list)
    # per timed step, the slowest rank's communication that no compute hid (DDP on CPU), in seconds
    comm_exposed_s: list[float] = field(default_factory=list)
    # per logged warm-up step, rank 0's collectives in issue order (perfgate.workloads.training.anatomy)
    collective_ops: list[list[str]] = field(default_factory=list)
    # GPU, per profiled step: the device's busy time (slowest rank) and the busy share of the step
    # (least busy rank: the one the host held back); empty off-GPU (perfgate.workloads.device_time)
    device_ms: list[float] = field(default_factory=list)
    device_busy_fraction: list[float] = field(default_factory=list)
    # GPU, per timed step: the energy every rank's GPU used in it, summed (perfgate.workloads.device_energy);
    # empty off-GPU or where a rank's counter could not be read (``info["energy_unavailable"]`` says why)
    energy_j: list[float] = field(default_factory=list)

    @property
    def tokens_per_j(self) -> list[float]:
        """Tokens of the step over the joules all GPUs used in it, per timed step."""
        return [self.tokens_per_step / j for j in self.energy_j]

    @property
    def step_ms(self) -> list[float]:
        return [s * 1e3 for s in self.step_s]

    @property
    def exposed_comm_ms(self) -> list[float]:
        return [s * 1e3 for s in self.comm_exposed_s]

    @property
    def exposed_comm_fraction(self) -> list[float]:
        """Share of the (slowest rank's) step no compute hid communication for."""
        return [min(1.0, e / s) for e, s in zip(self.comm_exposed_s, self.step_s)]

    def global_losses(self) -> list[float]:
        """Per step, the loss over the whole global batch: the mean of the ranks' local losses
        (every rank holds the same number of sequences)."""
        return [sum(col) / len(col) for col in zip(*self.losses_by_rank)]

    def finite_losses(self) -> bool:
        return all(math.isfinite(x) for losses in self.losses_by_rank for x in losses)

    def raw(self) -> dict:
        """What a test attaches: every per-step number, so the metrics can be re-derived."""
        return {"label": self.label, "world_size": self.world_size, "tokens_per_step": self.tokens_per_step,
                "step_s": self.step_s, "losses_by_rank": self.losses_by_rank,
                "allreduce_calls": self.allreduce_calls, "peak_alloc_gib": self.peak_alloc_gib,
                "rss_mib": self.rss_mib, "tracked_peak_mib": self.tracked_peak_mib,
                "categories_mib": self.categories_mib, "tracker_error": self.tracker_error,
                "extra_param_copy": self.extra_param_copy, "info": self.info, "device_ms": self.device_ms,
                "device_busy_fraction": self.device_busy_fraction, "comm_exposed_s": self.comm_exposed_s,
                "collective_ops": self.collective_ops, "energy_j": self.energy_j}


def per_step_max(rows: Sequence[Sequence[float]]) -> list[float]:
    """Column-wise max over ranks; all ranks must report the same number of steps."""
    lengths = {len(r) for r in rows}
    if len(lengths) > 1:
        raise ValueError(f"ranks reported different step counts: {sorted(lengths)}")
    return [max(col) for col in zip(*rows)]


def summarize_case(per_rank: Sequence) -> CaseSummary:
    """Combine one case's CaseResult from every rank (rank order)."""
    if not per_rank:
        raise ValueError("no ranks")
    r0 = per_rank[0]
    labels = {r.label for r in per_rank}
    if len(labels) != 1:
        raise ValueError(f"ranks disagree on the case: {sorted(labels)}")
    tokens = int(r0.info["tokens_per_step"])
    step_s = per_step_max([r.step_s for r in per_rank])
    tracked = [r for r in per_rank if r.tracked_peak_bytes]
    peaks: list[float] = []
    cats: dict[str, list[float]] = {}
    if tracked and len({len(r.tracked_peak_bytes) for r in tracked}) == 1:
        for i in range(len(tracked[0].tracked_peak_bytes)):
            worst = max(tracked, key=lambda r: r.tracked_peak_bytes[i])
            peaks.append(worst.tracked_peak_bytes[i] / MIB)
            for name, nbytes in worst.tracked_categories[i].items():
                cats.setdefault(name, []).append(nbytes / MIB)
    errors = [f"rank {r.rank}: {r.tracker_error}" for r in per_rank if r.tracker_error]
    energies = [getattr(r, "step_energy_j", []) for r in per_rank]
    energy_j = ([sum(col) for col in zip(*energies)]
                if all(len(e) == len(step_s) for e in energies) and step_s else [])
    return CaseSummary(
        label=r0.label, world_size=r0.world_size, tokens_per_step=tokens, step_s=step_s,
        tokens_per_s=[tokens / s for s in step_s],
        losses_by_rank=[list(r.losses) for r in per_rank],
        allreduce_calls=list(r0.allreduce_calls),
        peak_alloc_gib=[b / GIB for b in per_step_max([r.peak_alloc_bytes for r in per_rank])]
        if r0.peak_alloc_bytes else [],
        rss_mib=[b / MIB for b in per_step_max([r.rss_bytes for r in per_rank])],
        tracked_peak_mib=peaks, categories_mib=cats,
        tracker_error="; ".join(errors) or None,
        extra_param_copy=any(r.extra_param_copy for r in per_rank), info=dict(r0.info),
        comm_blocked_fraction=per_step_max([[b / s for b, s in zip(r.comm_blocked_s, r.step_s)] for r in per_rank])
        if all(len(r.comm_blocked_s) == len(r.step_s) for r in per_rank) and r0.comm_blocked_s else [],
        comm_exposed_s=per_step_max([r.comm_exposed_s for r in per_rank]) if r0.comm_exposed_s else [],
        collective_ops=[list(ops) for ops in r0.collective_ops],
        device_ms=per_step_max([r.device_busy_ms for r in per_rank]) if r0.device_busy_ms else [],
        device_busy_fraction=[-x for x in per_step_max([[-min(1.0, b / s) if s > 0 else 0.0
                                                           for b, s in zip(r.device_busy_ms, r.device_span_ms)]
                                                          for r in per_rank])] if r0.device_busy_ms else [],
        energy_j=energy_j)


def speedup(tokens_per_s_n: Sequence[float], tokens_per_s_1: Sequence[float]) -> list[float]:
    """Throughput of world N over world 1, per step pair (strong and weak scaling alike)."""
    return paired_ratio(tokens_per_s_n, tokens_per_s_1)


def efficiency(speedups: Sequence[float], world_size: int) -> list[float]:
    """Scaling efficiency = speedup / world size (1.0 is linear)."""
    return [s / world_size for s in speedups]


def max_abs_diff(a: Sequence[float], b: Sequence[float]) -> float:
    if len(a) != len(b):
        raise ValueError(f"cannot compare {len(a)} losses with {len(b)}")
    return max((abs(x - y) for x, y in zip(a, b)), default=0.0)
