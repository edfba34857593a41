"""Read vLLM's Prometheus /metrics counters (the server's own view, beside the client's).

Used for the prefix-cache hit rate, the server's batch, its preemptions and the engine's own clock
(EngineTimes: prefill, queue and decode time per request, beside the client's TTFT and TPOT). vLLM counts prompt tokens looked up in the prefix
cache (``vllm:prefix_cache_queries``) and those found (``vllm:prefix_cache_hits``); the hit
rate of a phase is the ratio of the two counters' increments over that phase. It counts
tokens in cached blocks, not requests, so it differs from the request reuse rate of a
workload (seed §12.1: 93.7 % token hit rate for 91.7 % request reuse).
"""
from __future__ import annotations

import re
import urllib.request
from dataclasses import dataclass

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def counter_totals(text: str) -> dict[str, float]:
    """Metric name -> sum over label sets, for every sample line of a Prometheus text page."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            try:
                out[m["name"]] = out.get(m["name"], 0.0) + float(m["value"])
            except ValueError:
                continue
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url.rstrip('/')}/metrics", timeout=timeout_s) as resp:
        return counter_totals(resp.read().decode())


def read_counters(base_url: str, *wanted: tuple[str, ...], why: str) -> list[float]:
    """One scrape of ``base_url``/metrics: for each wanted counter, the value of the first of its names
    the page has (vLLM renamed some, ``_total`` or not). A counter the page lacks is a KeyError that
    names every wanted counter and ``why`` it may be missing."""
    c = scrape(base_url)
    values = [next((c[n] for n in names if n in c), None) for names in wanted]
    if any(v is None for v in values):
        raise KeyError(f"{base_url}/metrics has no {' / '.join(names[0] for names in wanted)} counter(s) ({why})")
    return values


@dataclass(frozen=True)
class PrefixCacheCounters:
    queries: float  # prompt tokens looked up
    hits: float     # of those, found in the cache

    @classmethod
    def read(cls, base_url: str) -> "PrefixCacheCounters":
        q, h = read_counters(base_url, ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_queries"),
                             ("vllm:prefix_cache_hits_total", "vllm:prefix_cache_hits"),
                             why="vLLM too old for prefix-cache metrics?")
        return cls(queries=q, hits=h)

    def hit_rate_since(self, before: "PrefixCacheCounters") -> float:
        """Token hit rate over the interval; NaN when nothing was looked up."""
        dq = self.queries - before.queries
        return (self.hits - before.hits) / dq if dq > 0 else float("nan")


@dataclass(frozen=True)
class StepCounters:
    """Tokens generated and engine steps taken: their increments over a phase give the mean
    decode batch (generated tokens per step). A server that batches C concurrent requests reads
    close to C; one that serves requests one at a time reads 1.0, whatever the machine's speed
    and however late the client reads its stream."""

    generation_tokens: float
    steps: float

    @classmethod
    def read(cls, base_url: str) -> "StepCounters":
        gen, steps = read_counters(base_url, ("vllm:generation_tokens_total",),
                                   ("vllm:iteration_tokens_total_count",), why="vLLM without V1 metrics?")
        return cls(generation_tokens=gen, steps=steps)

    def tokens_per_step_since(self, before: "StepCounters") -> float:
        """Generated tokens per engine step over the interval; NaN when no step ran."""
        ds = self.steps - before.steps
        return (self.generation_tokens - before.generation_tokens) / ds if ds > 0 else float("nan")


def requests_finished(base_url: str) -> float:
    """Requests the server has finished since it started, whatever their finish reason
    (``vllm:request_success``)."""
    (n,) = read_counters(base_url, ("vllm:request_success_total", "vllm:request_success"),
                         why="vLLM without V1 metrics?")
    return n


def preemptions(base_url: str) -> float:
    """Requests the scheduler preempted so far (``vllm:num_preemptions``: it ran out of KV blocks
    and evicted a running request, to recompute it later)."""
    (n,) = read_counters(base_url, ("vllm:num_preemptions_total", "vllm:num_preemptions"),
                         why="vLLM without V1 metrics?")
    return n


@dataclass(frozen=True)
class EngineTimes:
    """The engine core's own clock over one load phase: means over the requests that finished in it.

    vLLM stamps a request's first scheduling, first token and last token in the engine core and, when
    it finishes, observes per-request histograms of (first token - first scheduled) ``prefill``, (first
    scheduled - queued) ``queue`` and the request's mean time per output token. A histogram's sum and
    count over a phase give the means. Unlike the client's TTFT (tokenization, HTTP, the client's
    event loop, which step the prefill lands in: a host figure on the 1-GPU H200, +17 to +59 % between
    sittings), ``prefill_ms`` is the engine's time for the prefill step itself; a client starved of CPU
    moves neither it nor ``tpot_ms``."""

    requests: int
    prefill_ms: float
    queue_ms: float
    tpot_ms: float

    def to_dict(self) -> dict:
        return {"requests": self.requests, "prefill_ms": self.prefill_ms, "queue_ms": self.queue_ms,
                "tpot_ms": self.tpot_ms}


@dataclass(frozen=True)
class EngineCounters:
    """The sums and count of vLLM's per-request engine histograms at one moment (see EngineTimes)."""

    requests: float
    prefill_s: float
    queue_s: float
    tpot_s: float

    @classmethod
    def read(cls, base_url: str) -> "EngineCounters":
        n, prefill, queue, tpot = read_counters(
            base_url, ("vllm:request_prefill_time_seconds_count",), ("vllm:request_prefill_time_seconds_sum",),
            ("vllm:request_queue_time_seconds_sum",), ("vllm:request_time_per_output_token_seconds_sum",),
            why="vLLM without V1 metrics?")
        return cls(requests=n, prefill_s=prefill, queue_s=queue, tpot_s=tpot)

    def since(self, before: "EngineCounters") -> EngineTimes | None:
        """The means over the requests finished between ``before`` and now; None when none did."""
        n = self.requests - before.requests
        if not n > 0:
            return None
        return EngineTimes(requests=int(round(n)), prefill_ms=(self.prefill_s - before.prefill_s) / n * 1e3,
                           queue_ms=(self.queue_s - before.queue_s) / n * 1e3,
                           tpot_ms=(self.tpot_s - before.tpot_s) / n * 1e3)
