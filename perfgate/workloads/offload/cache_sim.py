"""Expert-cache analysis of a routing trace: how often would a missed expert have to come off SSD?

A routing trace lists, per decoded token and per MoE layer, the expert ids the router selected.
Each (layer, expert) pair is one cache key; the request stream is token-major, layer-minor, experts
in the order given. Capacity counts expert slots shared by all layers (one slot = one expert of
one layer, ~1.9 MB in the seed), like the seed's RAM arena.

Trace formats (`load_trace` picks by content):

  JSONL, one record per line, either per (token, layer)
      {"token": 0, "layer": 3, "experts": [12, 40, 7, 99, 1, 5, 230, 64]}
  or per token, experts of layer i at index i
      {"token": 0, "layers": [[12, 40, ...], [3, 8, ...], ...]}
  Text, one line per (token, layer), whitespace- or comma-separated integers
      # token layer experts...
      0 3 12 40 7 99 1 5 230 64
  '#' starts a comment; blank lines are ignored.

Policies (all count the first touch of a key as a miss - it must be read once in any case):

  LRU            evict the least recently used slot.
  Belady         the offline optimum for unit-size items: on a miss with a full cache keep the
                 `capacity` keys - among the cached ones and the new one - whose next use is
                 soonest; the new key is not cached (bypassed) when its own next use is the
                 farthest. With bypass allowed this is optimal among all policies, so it bounds
                 LRU, pinning and admission control from above (the seed's "ceiling").
  pin            static hot set: the `capacity` keys requested most often over the whole trace
                 (an oracle ranking, i.e. the best static pin); everything else is streamed.
  admit-after-N  LRU that caches a key only from its N-th request on (the seed's
                 SDQ_ADMIT_MIN_HITS); N = 1 is plain LRU.

Locality measures:
  first-touch bound   1 - distinct/requests: no policy can beat it; LRU with capacity >= distinct
                      and Belady with capacity >= distinct reach it.
  stack distance      per request, distinct keys touched since the previous request of the same key
                      (Mattson): LRU with capacity C hits exactly the requests with distance < C.
  token reuse gap     tokens since the key's previous request.
  singleton fraction  requests whose key occurs once in the trace (nothing for a cache to keep).
  U(k)                mean number of distinct keys in a window of k consecutive tokens; reads per
                      token if k tokens are decoded together is U(k)/k, a saving of
                      1 - U(k) / (k U(1)) over one token at a time.
"""
from __future__ import annotations

import heapq
import json
from collections import Counter, OrderedDict
from dataclasses import dataclass
from pathlib import Path

from perfgate import mutations

INF = float("inf")


@dataclass(frozen=True)
class RouteTrace:
    """Routing decisions in decode order: steps of (token, layer, expert ids)."""

    steps: tuple[tuple[int, int, tuple[int, ...]], ...]

    @classmethod
    def from_tokens(cls, tokens: list[list[list[int]]]) -> "RouteTrace":
        """tokens[t][layer] = expert ids."""
        return cls(tuple((t, l, tuple(ex)) for t, layers in enumerate(tokens) for l, ex in enumerate(layers)))

    def keys(self) -> list[tuple[int, int]]:
        """The request stream: (layer, expert) per selected expert."""
        return [(layer, e) for _, layer, experts in self.steps for e in experts]

    @property
    def n_tokens(self) -> int:
        return len({t for t, _, _ in self.steps})

    @property
    def n_layers(self) -> int:
        return len({l for _, l, _ in self.steps})

    @property
    def n_requests(self) -> int:
        return sum(len(ex) for _, _, ex in self.steps)

    @property
    def distinct(self) -> int:
        return len(set(self.keys()))

    def to_jsonl(self) -> str:
        return "".join(json.dumps({"token": t, "layer": l, "experts": list(ex)}) + "\n" for t, l, ex in self.steps)

    def to_text(self) -> str:
        return "# token layer experts...\n" + "".join(
            f"{t} {l} {' '.join(map(str, ex))}\n" for t, l, ex in self.steps)


class TraceFormatError(ValueError):
    pass


def parse_trace(text: str, source: str = "<trace>") -> RouteTrace:
    """Parse JSONL or text (see module docstring); errors name the source and line."""
    steps: list[tuple[int, int, tuple[int, ...]]] = []
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.split("#", 1)[0].strip() if not raw.lstrip().startswith("{") else raw.strip()
        if not line:
            continue
        try:
            if line.startswith("{"):
                rec = json.loads(line)
                if "layers" in rec:
                    for l, ex in enumerate(rec["layers"]):
                        steps.append((int(rec["token"]), l, tuple(int(e) for e in ex)))
                else:
                    steps.append((int(rec["token"]), int(rec["layer"]), tuple(int(e) for e in rec["experts"])))
            else:
                nums = [int(x) for x in line.replace(",", " ").split()]
                if len(nums) < 3:
                    raise ValueError("need token, layer and at least one expert id")
                steps.append((nums[0], nums[1], tuple(nums[2:])))
        except (ValueError, KeyError, TypeError, json.JSONDecodeError) as exc:
            raise TraceFormatError(f"{source}:{lineno}: cannot parse {raw[:80]!r}: {exc}") from exc
    if not steps:
        raise TraceFormatError(f"{source}: no routing records found")
    return RouteTrace(tuple(steps))


def load_trace(path: str | Path) -> RouteTrace:
    path = Path(path)
    return parse_trace(path.read_text(), str(path))


# ---------------------------------------------------------------- policies (hits for one capacity)

def lru_hits(keys: list, capacity: int) -> int:
    cache: OrderedDict = OrderedDict()
    hits = 0
    if capacity <= 0:
        return 0
    for k in keys:
        if k in cache:
            hits += 1
            cache.move_to_end(k)
        else:
            cache[k] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


def next_uses(keys: list) -> list[float]:
    """next_use[i] = index of the next request of keys[i], or INF."""
    nxt: list[float] = [INF] * len(keys)
    last: dict = {}
    for i in range(len(keys) - 1, -1, -1):
        nxt[i] = last.get(keys[i], INF)
        last[keys[i]] = i
    return nxt


def belady_hits(keys: list, capacity: int) -> int:
    """Belady/MIN with bypass (see module docstring)."""
    if capacity <= 0:
        return 0
    nxt = next_uses(keys)
    cached: dict = {}  # key -> its next use
    heap: list = []  # (-next_use, tiebreak, key); stale entries skipped lazily
    hits = 0
    for i, k in enumerate(keys):
        nu = nxt[i]
        if k in cached:
            hits += 1
            cached[k] = nu
            heapq.heappush(heap, (-nu, i, k))
            continue
        if nu == INF:
            continue  # never used again: caching it cannot help
        if len(cached) < capacity:
            cached[k] = nu
            heapq.heappush(heap, (-nu, i, k))
            continue
        while True:  # farthest next use among cached keys
            neg, _, victim = heap[0]
            if cached.get(victim) == -neg:
                break
            heapq.heappop(heap)
        if -neg > nu:
            heapq.heappop(heap)
            del cached[victim]
            cached[k] = nu
            heapq.heappush(heap, (-nu, i, k))
    return hits


def pin_hits(keys: list, capacity: int) -> int:
    """Best static pin: the `capacity` most requested keys stay cached after their first touch."""
    if capacity <= 0:
        return 0
    top = Counter(keys).most_common(capacity)
    return sum(n - 1 for _, n in top)


def pin_coverage(keys: list, capacity: int) -> float:
    """Share of requests going to the `capacity` most requested keys (the seed's 'top 2048 cover 54.5 %')."""
    if not keys or capacity <= 0:
        return 0.0
    return sum(n for _, n in Counter(keys).most_common(capacity)) / len(keys)


def admit_after_hits(keys: list, capacity: int, n: int = 2) -> int:
    """LRU that admits a key only once it has been requested n times (this request included)."""
    if n < 1:
        raise ValueError("admit-after-N needs N >= 1")
    cache: OrderedDict = OrderedDict()
    seen: Counter = Counter()
    hits = 0
    if capacity <= 0:
        return 0
    for k in keys:
        if k in cache:
            hits += 1
            if not mutations.active("cache_fifo_eviction"):
                cache.move_to_end(k)
            continue
        seen[k] += 1
        if seen[k] >= n:
            cache[k] = None
            if len(cache) > capacity:
                cache.popitem(last=False)
    return hits


# ---------------------------------------------------------------- locality measures

def stack_distances(keys: list) -> list[float]:
    """Mattson stack distance per request (INF for a first touch), O(n log n) with a Fenwick tree."""
    n = len(keys)
    tree = [0] * (n + 1)

    def add(i: int, v: int) -> None:
        i += 1
        while i <= n:
            tree[i] += v
            i += i & -i

    def prefix(i: int) -> int:  # sum of marks at positions < i
        s = 0
        while i > 0:
            s += tree[i]
            i -= i & -i
        return s

    last: dict = {}
    out: list[float] = []
    for i, k in enumerate(keys):
        p = last.get(k)
        if p is None:
            out.append(INF)
        else:
            out.append(prefix(i) - prefix(p + 1))  # keys whose latest request lies strictly between
            add(p, -1)
        add(i, 1)
        last[k] = i
    return out


def lru_curve(distances: list[float], capacities: list[int]) -> dict[int, float]:
    """LRU hit rate at each capacity from stack distances (hit iff distance < capacity)."""
    import bisect

    finite = sorted(d for d in distances if d != INF)
    n = len(distances)
    return {c: (bisect.bisect_left(finite, c) / n if n else 0.0) for c in capacities}


def token_reuse_gaps(trace: RouteTrace) -> list[float]:
    """Per request: tokens since the same (layer, expert) was last requested (INF for first touch)."""
    last: dict = {}
    out: list[float] = []
    for t, layer, experts in trace.steps:
        for e in experts:
            p = last.get((layer, e))
            out.append(INF if p is None else t - p)
            last[(layer, e)] = t
    return out


def histogram(values: list[float], edges: tuple[int, ...] = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)) -> dict:
    """Counts per bucket (previous edge, edge], first bucket from 0; then '>last' and 'never' (INF)."""
    out: dict[str, int] = {}
    lo = -1 if edges[0] == 0 else 0
    for e in edges:
        out[str(e) if e == lo + 1 else f"{lo + 1}-{e}"] = sum(1 for v in values if lo < v <= e)
        lo = e
    out[f">{edges[-1]}"] = sum(1 for v in values if edges[-1] < v < INF)
    out["never"] = sum(1 for v in values if v == INF)
    return out


def singleton_fraction(keys: list) -> float:
    counts = Counter(keys)
    return sum(1 for k in keys if counts[k] == 1) / len(keys) if keys else 0.0


def unique_per_window(trace: RouteTrace, k: int) -> float:
    """U(k): mean distinct (layer, expert) keys over non-overlapping windows of k consecutive tokens."""
    if k < 1:
        raise ValueError("window k must be >= 1")
    by_token: dict[int, set] = {}
    for t, layer, experts in trace.steps:
        by_token.setdefault(t, set()).update((layer, e) for e in experts)
    tokens = sorted(by_token)
    windows = [tokens[i:i + k] for i in range(0, len(tokens) - k + 1, k)]
    if not windows:
        return float("nan")
    return sum(len(set().union(*(by_token[t] for t in w))) for w in windows) / len(windows)


# ---------------------------------------------------------------- one call for tools and tests

def default_capacities(distinct: int) -> list[int]:
    """Capacities from 1/32 of the distinct keys up to all of them."""
    caps = sorted({max(1, distinct * f // 32) for f in (1, 2, 4, 8, 16, 24, 32)})
    return caps


def analyze(trace: RouteTrace, capacities: list[int] | None = None, *, admit_n: int = 2,
            k_list: tuple[int, ...] = (1, 2, 4, 8)) -> dict:
    """Hit rates of every policy at every capacity, plus the locality measures. JSON-serialisable."""
    keys = trace.keys()
    n = len(keys)
    distinct = len(set(keys))
    caps = capacities or default_capacities(distinct)
    dists = stack_distances(keys)
    lru_from_stack = lru_curve(dists, caps)
    rows = []
    for c in caps:
        lru = lru_hits(keys, c) / n
        rows.append({
            "capacity": c,
            "lru": lru,
            "belady": belady_hits(keys, c) / n,
            "pin": pin_hits(keys, c) / n,
            "pin_coverage": pin_coverage(keys, c),
            f"admit{admit_n}": admit_after_hits(keys, c, admit_n) / n,
            "lru_stack_check": lru_from_stack[c],
        })
    u1 = unique_per_window(trace, 1)
    u = {k: unique_per_window(trace, k) for k in k_list}
    return {
        "tokens": trace.n_tokens,
        "layers": trace.n_layers,
        "requests": n,
        "distinct": distinct,
        "first_touch_bound": 1 - distinct / n if n else 0.0,
        "singleton_fraction": singleton_fraction(keys),
        "policies": rows,
        "admit_n": admit_n,
        "stack_distance_hist": histogram(dists),
        "token_gap_hist": histogram(token_reuse_gaps(trace), (1, 2, 4, 8, 16, 32, 64)),
        "U": {str(k): {"unique": v, "per_token": v / k, "saving": 1 - v / (k * u1) if u1 else 0.0}
              for k, v in u.items()},
    }
