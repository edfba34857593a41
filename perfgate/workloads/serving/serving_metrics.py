"""Serving metrics from raw request records: one pure function, no I/O, no clocks.

Definitions follow `vllm bench serve` (vllm/benchmarks/serve.py, calculate_metrics), so
our numbers and vLLM's own tool mean the same thing:

- TTFT  = first content chunk - send
- TPOT  = (E2EL - TTFT) / (output_tokens - 1), per request with >= 2 output tokens;
          output_tokens is the server's usage count (chunks are not tokens)
- ITL   = gaps between successive content chunks (a chunk may hold several tokens)
- E2EL  = last content chunk - send (the trailing usage chunk and [DONE] are not latency)
- throughputs divide by the run's duration (first send to last end)
- goodput = requests that meet every given SLO bound (value <= bound) per second;
  slo_attainment = those requests / all requests (a failed request meets no SLO)

Records may be `loadgen.RequestRecord` objects or their dicts (as saved in results JSON),
so saved raw data can be re-summarised later.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from perfgate.machine.gpu_busy import pooled_share
from perfgate.workloads.serving.prometheus_counters import EngineTimes

DEFAULT_PERCENTILES = (50.0, 90.0, 95.0, 99.0)


@dataclass(frozen=True)
class Slo:
    """Per-request service-level bounds in ms; None means 'not part of the SLO'."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2el_ms"):
            v = getattr(self, name)
            if v is not None and not v > 0:
                raise ValueError(f"Slo.{name} must be > 0 ms or None, got {v}")
        if self.ttft_ms is None and self.tpot_ms is None and self.e2el_ms is None:
            raise ValueError("an Slo needs at least one bound (ttft_ms, tpot_ms or e2el_ms)")


@dataclass(frozen=True)
class LatencyStats:
    """Mean, std and percentiles of one latency in ms; NaN when there are no values."""

    n: int
    mean: float
    std: float
    median: float
    percentiles: dict[str, float]  # "p90" -> ms

    def to_dict(self) -> dict:
        return {"n": self.n, "mean": self.mean, "std": self.std, "median": self.median, **self.percentiles}


@dataclass(frozen=True)
class ServingSummary:
    completed: int
    failed: int
    duration_s: float
    input_tokens: int
    output_tokens: int
    request_throughput_rps: float
    output_throughput_tok_s: float
    total_token_throughput_tok_s: float
    ttft_ms: LatencyStats
    tpot_ms: LatencyStats
    itl_ms: LatencyStats
    e2el_ms: LatencyStats
    goodput_rps: float | None          # None when no SLO was given
    slo_attainment: float | None       # fraction of all requests meeting the SLO
    # per-request values (completed requests, in record order) for perf.record samples
    ttft_ms_values: list[float] = field(repr=False, default_factory=list)
    tpot_ms_values: list[float] = field(repr=False, default_factory=list)
    e2el_ms_values: list[float] = field(repr=False, default_factory=list)
    decode_tok_s_values: list[float] = field(repr=False, default_factory=list)  # 1000 / TPOT per request
    # the busiest GPU's NVML samples (percent) during the run, even too few for a share (perfgate.machine.gpu_busy)
    gpu_busy_samples: tuple[int, ...] = field(repr=False, default=())
    # the engine core's own clocks over the run (loadgen.run_load; prometheus_counters.EngineTimes), or None
    engine: EngineTimes | None = field(repr=False, default=None)
    # every visible GPU's joules over the run (loadgen.LoadResult.energy_j), or None off-GPU
    energy_j: float | None = field(repr=False, default=None)

    @property
    def energy_j_per_output_token(self) -> float | None:
        """The GPUs' joules over the run per output token it served, or None (no energy or no tokens)."""
        if self.energy_j is None or not self.energy_j > 0 or self.output_tokens <= 0:
            return None
        return self.energy_j / self.output_tokens

    @property
    def gpu_busy(self) -> float | None:
        """The busiest GPU's busy share during the run, or None (off-GPU, or too few samples)."""
        return pooled_share(self.gpu_busy_samples)

    def to_dict(self) -> dict:
        out = {k: getattr(self, k) for k in (
            "completed", "failed", "duration_s", "input_tokens", "output_tokens", "request_throughput_rps",
            "output_throughput_tok_s", "total_token_throughput_tok_s", "goodput_rps", "slo_attainment", "gpu_busy")}
        for k in ("ttft_ms", "tpot_ms", "itl_ms", "e2el_ms"):
            out[k] = getattr(self, k).to_dict()
        out["engine"] = self.engine.to_dict() if self.engine else None
        return out


def _get(rec: Any, name: str):
    return rec[name] if isinstance(rec, Mapping) else getattr(rec, name)


def _stats(values: Sequence[float], percentiles: Iterable[float]) -> LatencyStats:
    if not len(values):
        nan = float("nan")
        return LatencyStats(0, nan, nan, nan, {f"p{p:g}": nan for p in percentiles})
    arr = np.asarray(values, dtype=float)
    return LatencyStats(
        n=int(arr.size), mean=float(arr.mean()), std=float(arr.std()), median=float(np.median(arr)),
        percentiles={f"p{p:g}": float(np.percentile(arr, p)) for p in percentiles})


def summarize(records: Sequence[Any], duration_s: float, slo: Slo | None = None,
              percentiles: Sequence[float] = DEFAULT_PERCENTILES, gpu_busy_samples: Sequence[int] = (),
              engine: EngineTimes | None = None, energy_j: float | None = None) -> ServingSummary:
    """Records (+ the run's duration, and the GPUs' utilization samples and the engine's own clocks while
    it ran, where measured) -> latency statistics, throughputs and goodput."""
    if not duration_s > 0 or not math.isfinite(duration_s):
        raise ValueError(f"duration_s must be a positive finite number of seconds, got {duration_s}")
    ttft, tpot, itl, e2el, decode = [], [], [], [], []
    completed = failed = good = in_tok = out_tok = 0
    for rec in records:
        if _get(rec, "error") is not None:
            failed += 1
            continue
        completed += 1
        chunks = _get(rec, "chunk_s")
        send, first, end = _get(rec, "send_s"), _get(rec, "first_chunk_s"), chunks[-1]
        n_out = int(_get(rec, "output_tokens") or 0)
        in_tok += int(_get(rec, "prompt_tokens") or 0)
        out_tok += n_out
        r_ttft, r_e2el = (first - send) * 1e3, (end - send) * 1e3
        ttft.append(r_ttft)
        e2el.append(r_e2el)
        itl.extend((b - a) * 1e3 for a, b in zip(chunks, chunks[1:]))
        r_tpot = None
        if n_out > 1:
            r_tpot = (r_e2el - r_ttft) / (n_out - 1)
            tpot.append(r_tpot)
            if r_tpot > 0:
                decode.append(1e3 / r_tpot)
        if slo is not None:
            ok = ((slo.ttft_ms is None or r_ttft <= slo.ttft_ms)
                  and (slo.tpot_ms is None or (r_tpot if r_tpot is not None else 0.0) <= slo.tpot_ms)
                  and (slo.e2el_ms is None or r_e2el <= slo.e2el_ms))
            good += ok
    total = completed + failed
    return ServingSummary(
        completed=completed, failed=failed, duration_s=duration_s, input_tokens=in_tok, output_tokens=out_tok,
        request_throughput_rps=completed / duration_s,
        output_throughput_tok_s=out_tok / duration_s,
        total_token_throughput_tok_s=(in_tok + out_tok) / duration_s,
        ttft_ms=_stats(ttft, percentiles), tpot_ms=_stats(tpot, percentiles),
        itl_ms=_stats(itl, percentiles), e2el_ms=_stats(e2el, percentiles),
        goodput_rps=None if slo is None else good / duration_s,
        slo_attainment=None if slo is None else (good / total if total else float("nan")),
        ttft_ms_values=ttft, tpot_ms_values=tpot, e2el_ms_values=e2el, decode_tok_s_values=decode,
        gpu_busy_samples=tuple(gpu_busy_samples), engine=engine, energy_j=energy_j)


def summarize_run(result: Any, slo: Slo | None = None) -> ServingSummary:
    """:func:`summarize` of one load run (loadgen.LoadResult): its records, duration, busy samples and
    the engine's clocks."""
    return summarize(result.records, result.duration_s, slo=slo, gpu_busy_samples=result.gpu_busy_samples,
                     engine=result.engine, energy_j=getattr(result, "energy_j", None))


def highest_rate_meeting_slo(attainment_by_rate: Mapping[float, float], min_attainment: float) -> float:
    """Highest offered rate whose SLO attainment is >= min_attainment, with every lower rate also
    meeting it (a sweep's capacity at that SLO); 0.0 if even the lowest rate misses it."""
    best = 0.0
    for rate in sorted(attainment_by_rate):
        if attainment_by_rate[rate] >= min_attainment:
            best = rate
        else:
            break
    return best
