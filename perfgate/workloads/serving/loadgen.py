"""Async load generator for any OpenAI-compatible completions endpoint; keeps raw timings.

What it does, and nothing else: send requests (closed loop at concurrency C, or open loop
at rate λ with Poisson or gamma-bursty arrivals, optionally capped at C in flight), read
the SSE stream, and keep one `RequestRecord` per request: when it was due, sent, every
chunk's arrival, the end, the server's token counts, any error. Turning records into
TTFT/TPOT/ITL/goodput is `serving_metrics.summarize`'s job, so a number can always be
re-derived from the raw records saved beside it.

Token counting: under load several tokens arrive in one SSE chunk, and random weights
emit tokens with empty text, so chunks are not tokens. Every request asks for
``stream_options: {include_usage: true}`` and the server's ``completion_tokens`` is the
token count; chunk arrival times are kept for ITL.

The engine's side: a run alone on its server also keeps the engine core's own clocks over the
run (prometheus_counters.EngineTimes from /metrics, read before and after): the mean prefill,
queue and decode time per request as the engine stamped them, the device-side view of a TTFT
that the client's clock mixes with HTTP and tokenization.

Workload builders (`random_requests`, `shared_prefix_requests`, `long_prefill_requests`)
make prompts as token-id lists from a pool of ordinary token ids, so input lengths are
exact for any tokenizer. All timestamps are `time.perf_counter()` seconds relative to the
start of the run.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from dataclasses import asdict, dataclass, field, replace
from typing import Sequence

import numpy as np

from perfgate.machine.gpu_busy import busy_window, pooled_share
from perfgate.workloads import device_energy
from perfgate.workloads.serving.prometheus_counters import EngineCounters, EngineTimes
from perfgate.workloads.serving.server_memory import memory_phase


@dataclass(frozen=True)
class RequestSpec:
    """One request: a prompt (token ids or text) and how many tokens to generate."""

    prompt: tuple[int, ...] | str
    max_tokens: int
    tag: str = ""            # workload label kept in the record, e.g. "prefix-3" or "long-prefill"
    cache_salt: str | None = None

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")

    @property
    def prompt_len(self) -> int | None:
        return len(self.prompt) if isinstance(self.prompt, tuple) else None


@dataclass(frozen=True)
class LoadSpec:
    """How to send a list of requests.

    rate_rps=None sends all at once (closed loop: with max_concurrency=C, exactly C in flight);
    a finite rate draws gaps from a gamma distribution with shape ``burstiness`` and mean
    1/rate (burstiness 1 = Poisson; < 1 burstier; > 1 more regular), as `vllm bench serve`.
    """

    base_url: str
    model: str
    requests: tuple[RequestSpec, ...]
    max_concurrency: int | None = None
    rate_rps: float | None = None
    burstiness: float = 1.0
    seed: int = 0
    ignore_eos: bool = True
    temperature: float = 0.0
    request_timeout_s: float = 300.0
    endpoint: str = "/v1/completions"

    def __post_init__(self) -> None:
        if not self.requests:
            raise ValueError("LoadSpec needs at least one request")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"max_concurrency must be >= 1 or None, got {self.max_concurrency}")
        if self.rate_rps is not None and not self.rate_rps > 0:
            raise ValueError(f"rate_rps must be > 0 or None (all at once), got {self.rate_rps}")
        if not self.burstiness > 0:
            raise ValueError(f"burstiness must be > 0, got {self.burstiness}")
        if self.rate_rps is None and self.max_concurrency is None and len(self.requests) > 256:
            raise ValueError(f"{len(self.requests)} requests all at once with no max_concurrency: "
                             "set max_concurrency or a rate")

    def describe(self) -> str:
        """``16 'random' requests at C=4`` / ``24 'random' requests at 2.5 req/s``: a phase's name in messages."""
        tags = "/".join(dict.fromkeys(r.tag for r in self.requests))
        how = [f"C={self.max_concurrency}"] if self.max_concurrency else []
        how += [f"{self.rate_rps:.3g} req/s"] if self.rate_rps else []
        return f"{len(self.requests)} {tags!r} requests at {', '.join(how) or 'once'}"


@dataclass
class RequestRecord:
    """Raw timings of one request (seconds from the start of the run)."""

    index: int
    tag: str
    due_s: float                      # when the arrival process wanted it sent
    send_s: float = float("nan")      # when the HTTP request was issued (after any concurrency wait)
    first_chunk_s: float | None = None
    chunk_s: list[float] = field(default_factory=list)  # every content chunk's arrival
    end_s: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict:
        d = asdict(self)
        d["chunk_s"] = [round(t, 6) for t in self.chunk_s]
        return d


@dataclass
class LoadResult:
    records: list[RequestRecord]
    duration_s: float                 # first send to last end (what throughputs divide by)
    spec_summary: dict
    gpu_busy_samples: tuple[int, ...] = ()  # the busiest GPU's NVML samples (percent) while it ran; () off-GPU
    engine: EngineTimes | None = None  # the engine's own clocks over the run (run_load); None: see there
    window_s: tuple[float, float] | None = None  # first send and last end, on time.perf_counter
    # the joules every visible GPU used from the first send to the last end (device_energy); None off-GPU,
    # where the counter cannot be read, or when the run shared its window with another load
    energy_j: float | None = None

    @property
    def gpu_busy(self) -> float | None:
        """Busy share of the busiest GPU while it ran, or None (off-GPU, or too few samples)."""
        return pooled_share(self.gpu_busy_samples)

    @property
    def completed(self) -> int:
        return sum(r.ok for r in self.records)

    @property
    def failed(self) -> int:
        return sum(not r.ok for r in self.records)

    def errors(self, limit: int = 3) -> list[str]:
        return [f"#{r.index}: {r.error}" for r in self.records if r.error][:limit]


def arrival_offsets_s(n: int, rate_rps: float | None, burstiness: float, seed: int) -> list[float]:
    """Send times (s from start) of n requests: all 0 for rate None, else cumulative gamma gaps."""
    if rate_rps is None:
        return [0.0] * n
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate_rps * burstiness), size=n)
    gaps[0] = 0.0  # the first request goes at t=0, like vllm bench serve
    return list(np.cumsum(gaps))


def _payload(spec: LoadSpec, req: RequestSpec) -> dict:
    body = {
        "model": spec.model,
        "prompt": list(req.prompt) if isinstance(req.prompt, tuple) else req.prompt,
        "max_tokens": req.max_tokens,
        "temperature": spec.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if spec.ignore_eos:
        body["ignore_eos"] = True
    if req.cache_salt is not None:
        body["cache_salt"] = req.cache_salt
    return body


async def _one(session, url: str, spec: LoadSpec, req: RequestSpec, rec: RequestRecord, t0: float) -> None:
    import aiohttp

    rec.send_s = time.perf_counter() - t0
    try:
        async with session.post(url, json=_payload(spec, req)) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                return
            buf = b""
            async for piece in resp.content.iter_any():
                now = time.perf_counter() - t0
                buf += piece
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    msg = json.loads(data)
                    if "error" in msg:
                        rec.error = f"stream error: {str(msg['error'])[:300]}"
                        return
                    if msg.get("choices"):
                        if rec.first_chunk_s is None:
                            rec.first_chunk_s = now
                        rec.chunk_s.append(now)
                    usage = msg.get("usage")
                    if usage:
                        rec.prompt_tokens = usage.get("prompt_tokens")
                        rec.output_tokens = usage.get("completion_tokens")
            rec.end_s = time.perf_counter() - t0
            if rec.first_chunk_s is None:
                rec.error = "stream ended without a token"
            elif rec.output_tokens is None:
                rec.error = "stream ended without a usage chunk (server ignored stream_options.include_usage)"
    except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        rec.error = f"{type(exc).__name__}: {exc}"[:300]


async def run_load_async(spec: LoadSpec) -> LoadResult:
    import aiohttp

    url = spec.base_url.rstrip("/") + spec.endpoint
    due = arrival_offsets_s(len(spec.requests), spec.rate_rps, spec.burstiness, spec.seed)
    records = [RequestRecord(index=i, tag=r.tag, due_s=d) for i, (r, d) in enumerate(zip(spec.requests, due))]
    limit = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
    timeout = aiohttp.ClientTimeout(total=spec.request_timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)

    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        t0 = time.perf_counter()

        async def fire(req: RequestSpec, rec: RequestRecord) -> None:
            delay = rec.due_s - (time.perf_counter() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            if limit is None:
                await _one(session, url, spec, req, rec, t0)
            else:
                async with limit:
                    await _one(session, url, spec, req, rec, t0)

        await asyncio.gather(*(fire(r, rec) for r, rec in zip(spec.requests, records)))
    sends = [r.send_s for r in records]
    ends = [r.end_s for r in records if r.end_s is not None]
    duration = (max(ends) if ends else max(sends)) - min(sends)
    summary = {"n": len(records), "max_concurrency": spec.max_concurrency, "rate_rps": spec.rate_rps,
               "burstiness": spec.burstiness, "ignore_eos": spec.ignore_eos, "seed": spec.seed}
    return LoadResult(records=records, duration_s=duration, spec_summary=summary,
                      window_s=(t0 + min(sends), t0 + min(sends) + duration))


ENGINE_SETTLE_S = 2.0  # how long the finished requests' histograms may lag the last token the client read


def _engine_counters(base_url: str) -> EngineCounters | None:
    """The engine histograms now, or None from a server without them (not vLLM V1) or gone (killed)."""
    try:
        return EngineCounters.read(base_url)
    except (OSError, KeyError, ValueError):  # URLError is an OSError; KeyError: no such histograms
        return None


def _engine_times(base_url: str, before: EngineCounters | None, completed: int) -> EngineTimes | None:
    """The engine's means over the run: read until the histograms count the run's completed requests
    (vLLM observes them as it hands out the last output, so a scrape right after the client read the
    last token can miss the last request or two), at most ENGINE_SETTLE_S; then what they count."""
    if before is None:
        return None
    deadline = time.monotonic() + ENGINE_SETTLE_S
    while True:
        now = _engine_counters(base_url)
        if now is None:
            return None
        if now.requests - before.requests >= completed or time.monotonic() > deadline:
            return now.since(before)
        time.sleep(0.02)


def run_load(spec: LoadSpec) -> LoadResult:
    """Send spec.requests and return the raw records (blocking), with the GPUs' busy share meanwhile
    and the engine's own clocks over the run (``engine``; None where /metrics has no such histograms).
    Only a run alone on its server has them: the histograms cannot tell concurrent runs apart."""
    before = _engine_counters(spec.base_url)
    result = run_loads_concurrently([spec])[0]
    return replace(result, engine=_engine_times(spec.base_url, before, result.completed))


def run_loads_concurrently(specs: Sequence[LoadSpec]) -> list[LoadResult]:
    """Run several load specs at the same time (e.g. decode streams + interfering prefills); each
    result carries the busy share of the one window they shared (perfgate.machine.gpu_busy)."""
    async def _all():
        return await asyncio.gather(*(run_load_async(s) for s in specs))
    with busy_window() as busy, memory_phase(" + ".join(s.describe() for s in specs)), _energy_meter() as meter:
        results = list(asyncio.run(_all()))
        energy = _energy_of(meter, results[0]) if meter is not None and len(results) == 1 else None
    return [replace(r, gpu_busy_samples=busy.percents, energy_j=energy) for r in results]


@contextlib.contextmanager
def _energy_meter():
    """The visible GPUs' energy counter read while the load runs (perfgate.workloads.device_energy), or
    None where there is none to read (a CPU machine, a driver without the counter)."""
    try:
        meter = device_energy.EnergyMeter.for_visible_gpus()
    except device_energy.EnergyUnavailable:
        yield None
        return
    with meter:
        yield meter


def _energy_of(meter, result: LoadResult) -> float | None:
    """Joules from the run's first send to its last end, or None (no requests, or a counter that did not
    advance across the run)."""
    if result.window_s is None:
        return None
    got = meter.joules_each([result.window_s])
    return got[0] if got else None


# ---- workloads -------------------------------------------------------------------------------

def _ids(rng: random.Random, pool: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(rng.choice(pool) for _ in range(n))


def random_requests(pool: Sequence[int], n: int, input_len: int, output_len: int, seed: int = 0,
                    tag: str = "random") -> tuple[RequestSpec, ...]:
    """n prompts of input_len random tokens, each generating output_len tokens."""
    rng = random.Random(seed)
    return tuple(RequestSpec(_ids(rng, pool, input_len), output_len, tag) for _ in range(n))


def shared_prefix_requests(pool: Sequence[int], n: int, num_prefixes: int, prefix_len: int, suffix_len: int,
                           output_len: int, seed: int = 0) -> tuple[RequestSpec, ...]:
    """n prompts = one of num_prefixes shared prefixes + a unique suffix (prefix-cache workload).

    Prefixes are assigned round-robin, so request reuse is 1 - num_prefixes/n. vLLM caches
    whole KV blocks only (128 tokens on CPU), so prefix_len should span several blocks.
    """
    if num_prefixes < 1 or num_prefixes > n:
        raise ValueError(f"num_prefixes must be in 1..n={n}, got {num_prefixes}")
    rng = random.Random(seed)
    prefixes = [_ids(rng, pool, prefix_len) for _ in range(num_prefixes)]
    return tuple(RequestSpec(prefixes[i % num_prefixes] + _ids(rng, pool, suffix_len), output_len,
                             f"prefix-{i % num_prefixes}") for i in range(n))


def long_prefill_requests(pool: Sequence[int], n: int, input_len: int, output_len: int = 1, seed: int = 0
                          ) -> tuple[RequestSpec, ...]:
    """Prefill-heavy requests (long prompt, few output tokens) to interfere with decoding streams."""
    return random_requests(pool, n, input_len, output_len, seed, tag="long-prefill")


def interleave(a: Sequence[RequestSpec], b: Sequence[RequestSpec]) -> tuple[RequestSpec, ...]:
    """Alternate two request lists (a0 b0 a1 b1 ...), the rest of the longer one at the end."""
    out: list[RequestSpec] = []
    for i in range(max(len(a), len(b))):
        if i < len(a):
            out.append(a[i])
        if i < len(b):
            out.append(b[i])
    return tuple(out)
