"""Collective communication worker: one timing loop, many small op specs (nccl-tests style).

Each op is an :class:`OpDef` of callbacks: buffer sizes, initial data *and the expected
result*, the bus-bandwidth factor, and the call itself. :func:`run` times every size of a
:class:`CollectiveSpec` on every rank and returns that rank's raw per-size samples; the
area's ``reduce`` (perfgate.workloads.collectives) combines the ranks. Sizes follow
nccl-tests: ``size`` is the bytes of the largest buffer a rank sees (all_gather's output,
reduce_scatter's input), algbw = size / time, busbw = algbw * factor(n).

Timing: on CPU, perf_counter around ``iters`` back-to-back calls after a barrier; on
GPU, CUDA events, and for small messages the ``iters`` calls are captured once in a
CUDA graph and replayed, so Python launch overhead does not masquerade as NCCL latency.
Each rank reports its own time per sample; the time of a sample is the slowest rank's
(taken in ``reduce``, in the parent).

Correctness: after timing, every op runs once more on fresh, rank-specific data and the
output is compared element by element with the expected result; ``wrong`` counts the
mismatches on this rank (``reduce`` sums them; the test asserts the sum is 0). A rank whose
output the op leaves undefined (a reduce's non-root ranks: ``OpDef.root_only``) counts none.

The in-run reference (``time_over_p2p``, gated on every machine): each timed call of the op
is followed by one ring send/recv of the same bytes by the same ranks (``ref_us``), call by
call, and a sample's ratio is the median call of the op over the median call of the reference
(``call_us`` / ``ref_us``, the slowest rank's of each). Medians, not means: on a shared 2-core
machine one call in fifty that waits out a descheduled rank (milliseconds, against a 100 us
call) moved a sample's mean by tens of percent and the op's and the reference's alike only on
average (issue 47); the median call is the op's own cost. ``time_us`` stays the mean per call,
what bandwidth is. The iteration count is agreed from the median of five timed calls, not one:
a single call timed while a core was away set 1 iteration per sample in one run and 80 in the
next. How far the reference resolves a slowdown, measured with `perfgate power
--against-baselines`: docs/lifecycle.md.

Test-only knob: ``PERFGATE_TEST_MUTATION=collective_slowdown:<k>`` (perfgate.mutations; bare
``collective_slowdown`` is k = 4). An integer k >= 1 makes every
timed iteration issue the collective k times, which divides bandwidth by k; a fractional
k > 1 (e.g. 1.1, CPU only) waits (k - 1) times each timed call's own duration right after it,
inside its timed region, so each call takes k times as long. It
exists so the regression gate (and `perfgate ab`) can be shown to fire on a real slowdown;
never set it otherwise.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable

from perfgate import mutations
from perfgate.workloads import timing

@dataclass(frozen=True)
class CollectiveSpec:
    op: str
    sizes: tuple[int, ...]          # bytes, nccl-tests convention
    dtype: str = "float32"
    samples: int = 7                # timed samples per size (each the mean of `iters` calls)
    warmup: int = 3
    target_sample_s: float = 0.02   # iters per sample are chosen so a sample takes about this long
    max_iters: int = 200
    graph_max_bytes: int = 1 << 20  # CUDA-graph capture for sizes up to this (GPU only)

    def __post_init__(self):
        if self.op not in OP_DEFS:
            raise ValueError(f"unknown collective {self.op!r}; known: {', '.join(OP_DEFS)}")
        if not self.sizes or any(s <= 0 for s in self.sizes):
            raise ValueError(f"sizes must be positive byte counts, got {self.sizes}")
        if self.samples < 1 or self.warmup < 0:
            raise ValueError(f"samples must be >= 1 and warmup >= 0, got {self.samples}, {self.warmup}")

    def expected_s(self) -> float:
        """Healthy work time of the sweep, on the slow side: the launcher's hang budget is 3x this
        (perfgate.launch.liveness). Per size: warm-up, estimate, samples and check, each about one sample
        long, or one call at a pessimistic 0.5 GB/s when that is longer."""
        return sum((self.warmup + self.samples + 3) * max(self.target_sample_s, size / 0.5e9) for size in self.sizes)


@dataclass
class SizeResult:
    """One rank's raw samples of one size."""

    size_bytes: int
    count: int                       # elements in the per-rank input buffer
    iters: int
    bus_factor: float                # busbw = algbw * bus_factor(world size)
    time_us: list[float] = field(default_factory=list)  # this rank's time per call, per sample
    # In-run reference, timed right after each call of the op by the same process group: one ring
    # send/recv of the same bytes (each rank to the next), its median call per sample. The ratio
    # call_us / ref_us moves with the collective's own cost, not with the machine's load.
    ref_us: list[float] = field(default_factory=list)
    wrong: int = 0                   # mismatching output elements on this rank
    graph: bool = False
    # The op's median call per sample (time_us is the mean): the numerator of time_over_p2p, as ref_us
    # (also a median call) is its denominator. A CUDA graph replays its calls as one block: its mean.
    call_us: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class OpDef:
    """Everything op-specific, so adding an op is adding a row to :data:`OP_DEFS` (docs/adding-a-measurement.md):
    the engine, the area, the mesh's step and the nccl-tests importer name no op, they read its row.
    ``n``: world size (of the group), ``elems``: elements of the size in bytes."""

    bus_factor: Callable[[int], float]       # busbw = algbw * bus_factor(n), as nccl-tests defines it per op
    input_elems: Callable[[int, int], int]   # (elems, n) -> elements in each rank's input
    output_elems: Callable[[int, int], int]  # 0: the op works in place and its result is the input buffer
    # (torch, inp, out, rank, n) -> expected output tensor, given inputs made by fill
    expected: Callable
    # (dist, inp, out, rank, n, group=None) -> None; rank and n are within ``group`` (None: the default group)
    call: Callable
    divisible_by_world: bool = False  # a size is rounded down to a multiple of n elements (each rank a chunk)
    # Only rank 0 of the group holds a defined result (a reduce to root 0): the backend may use the other
    # ranks' buffers as scratch (gloo leaves partial sums in them), so their outputs are not checked.
    root_only: bool = False
    # An in-place reduction feeds its result back as the next call's input (reset once per sample), so its
    # values grow with every call: a cap on the calls of one sample keeps the small integers far from overflow.
    max_iters: int | None = None
    nccl_tests: str | None = None  # the nccl-tests binary of this op ("all_reduce_perf"): what the importer maps
    dispatched_per_call: int = 1   # c10d operators one call reaches the dispatcher as (a ring exchange: 2)

    def wrong(self, torch, init, inp, out, elems: int, rank: int, n: int) -> int:
        """Mismatching elements of this rank's result after one call on ``init`` (``inp`` holds it, ``out`` is
        the output buffer): 0 on a rank whose output the op leaves undefined (``root_only``)."""
        if self.root_only and rank != 0:
            return 0
        out_elems = self.output_elems(elems, n)
        got = out[:out_elems] if out_elems else inp
        return int((got != self.expected(torch, init, got, rank, n)).sum().item())


def fill(torch, elems: int, rank: int, device, dtype):
    """Rank-specific small integers: exact in every float type we use, so checks are exact."""
    idx = torch.arange(elems, device=device, dtype=torch.int64)
    return ((idx % 13) + rank + 1).to(dtype)


def _sum_expected(torch, elems, n, device, dtype):
    idx = torch.arange(elems, device=device, dtype=torch.int64)
    return ((idx % 13) * n + n * (n + 1) // 2).to(dtype)


def _all_reduce(dist, inp, out, rank, n, group=None):
    dist.all_reduce(inp, group=group)


def _all_gather(dist, inp, out, rank, n, group=None):
    dist.all_gather_into_tensor(out, inp, group=group)


def _reduce_scatter(dist, inp, out, rank, n, group=None):
    dist.reduce_scatter_tensor(out, inp, group=group)


def _all_to_all(dist, inp, out, rank, n, group=None):
    dist.all_to_all_single(out, inp, group=group)


def _broadcast(dist, inp, out, rank, n, group=None):
    dist.broadcast(inp, src=0 if group is None else dist.get_global_rank(group, 0), group=group)


def _send_recv(dist, inp, out, rank, n, group=None):
    """A ring step: send to the next rank of the group, receive from the previous one (peers are global ranks)."""
    def peer(r):
        return r if group is None else dist.get_global_rank(group, r)

    ops = [dist.P2POp(dist.isend, inp, peer((rank + 1) % n), group=group),
           dist.P2POp(dist.irecv, out, peer((rank - 1) % n), group=group)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()


def _expected_all_gather(torch, inp, out, rank, n):
    return torch.cat([fill(torch, inp.numel(), r, inp.device, inp.dtype) for r in range(n)])


def _expected_reduce_scatter(torch, inp, out, rank, n):
    chunk = out.numel()
    full = _sum_expected(torch, inp.numel(), n, inp.device, inp.dtype)
    return full[rank * chunk:(rank + 1) * chunk]


def _expected_all_to_all(torch, inp, out, rank, n):
    chunk = inp.numel() // n
    parts = [fill(torch, inp.numel(), r, inp.device, inp.dtype)[rank * chunk:(rank + 1) * chunk] for r in range(n)]
    return torch.cat(parts)


OP_DEFS: dict[str, OpDef] = {
    "all_reduce": OpDef(lambda n: 2 * (n - 1) / n, lambda e, n: e, lambda e, n: 0,
                        lambda torch, i, o, r, n: _sum_expected(torch, i.numel(), n, i.device, i.dtype), _all_reduce,
                        max_iters=50, nccl_tests="all_reduce_perf"),
    "all_gather": OpDef(lambda n: (n - 1) / n, lambda e, n: e // n, lambda e, n: (e // n) * n,
                        _expected_all_gather, _all_gather, divisible_by_world=True, nccl_tests="all_gather_perf"),
    "reduce_scatter": OpDef(lambda n: (n - 1) / n, lambda e, n: (e // n) * n, lambda e, n: e // n,
                            _expected_reduce_scatter, _reduce_scatter, divisible_by_world=True,
                            nccl_tests="reduce_scatter_perf"),
    "all_to_all": OpDef(lambda n: (n - 1) / n, lambda e, n: (e // n) * n, lambda e, n: (e // n) * n,
                        _expected_all_to_all, _all_to_all, divisible_by_world=True, nccl_tests="alltoall_perf"),
    "broadcast": OpDef(lambda n: 1.0, lambda e, n: e, lambda e, n: 0,
                       lambda torch, i, o, r, n: fill(torch, i.numel(), 0, i.device, i.dtype), _broadcast,
                       nccl_tests="broadcast_perf"),
    "send_recv": OpDef(lambda n: 1.0, lambda e, n: e, lambda e, n: e,
                       lambda torch, i, o, r, n: fill(torch, i.numel(), (r - 1) % n, i.device, i.dtype), _send_recv,
                       nccl_tests="sendrecv_perf", dispatched_per_call=2),
}
OPS = tuple(OP_DEFS)  # every op's name: a profile measures these unless it names its own


def _slowdown() -> float:
    """The TEST-ONLY slowdown (registered mutation ``collective_slowdown``, see the module docstring):
    an integer is calls per timed iteration, a fraction stretches each timed sample."""
    return mutations.factor("collective_slowdown") or 1.0


def _slowed(fn: Callable[[], None], k: float) -> Callable[[], None]:
    """The test-only knob applied to ``fn``: k calls for an integer k. A fractional k is applied to
    each timed call by the timing loop instead (``_busy_wait`` after the call, inside its timed
    region): the reference call that follows on every rank absorbs the small differences between
    the ranks' waits, so the next call of the op does not count another rank's wait as its own."""
    return (lambda: [fn() for _ in range(int(k))]) if k == int(k) else fn


def _busy_wait(seconds: float) -> None:
    """Spend ``seconds`` of real time: sleep the bulk, spin the last half millisecond."""
    end = time.perf_counter() + seconds
    if seconds > 1e-3:
        time.sleep(seconds - 5e-4)
    while time.perf_counter() < end:
        pass


def timer_for(device) -> Callable[[Callable[[], None]], float]:
    """Seconds of one call on ``device``'s clock (perfgate.workloads.timing: CUDA events on GPU, perf_counter
    on CPU): how every collective call, and the mesh's phases, are timed."""
    clock = timing.clock_of(device)
    return lambda fn: timing.time_call(fn, clock)[1]


def _measure_size(torch, dist, ctx, spec: CollectiveSpec, opdef: OpDef, size: int, slowdown: float) -> SizeResult:
    dtype = getattr(torch, spec.dtype)
    esize = torch.tensor([], dtype=dtype).element_size()
    n, rank, device = ctx.world_size, ctx.rank, ctx.device
    elems = max(size // esize, n if opdef.divisible_by_world else 1)
    if opdef.divisible_by_world:
        elems = max(n, (elems // n) * n)
    in_elems, out_elems = opdef.input_elems(elems, n), opdef.output_elems(elems, n)
    inp = fill(torch, in_elems, rank, device, dtype)
    init = inp.clone()
    out = torch.empty(max(out_elems, 1), device=device, dtype=dtype)
    whole = slowdown == int(slowdown)  # integer: k collectives per call; fractional: stretch each sample
    run_once = _slowed(lambda: opdef.call(dist, inp, out, rank, n), slowdown if whole else 1)
    timer = timer_for(device)
    ctx.phase(f"{spec.op} {size} B warm-up")
    for _ in range(max(spec.warmup, 1)):
        run_once()
    if device.type == "cuda":
        torch.cuda.synchronize()
    dist.barrier()
    one = sorted(timer(run_once) for _ in range(5))[2]  # a median: one call may have waited out a core
    # agree on the iteration count, or ranks would wait on each other inside the loop
    est = torch.tensor([one], device=device, dtype=torch.float64)
    dist.all_reduce(est, op=dist.ReduceOp.MAX)
    iters = int(min(spec.max_iters, max(1, spec.target_sample_s / max(est.item(), 1e-7))))
    if opdef.max_iters is not None:
        iters = min(iters, opdef.max_iters)  # an in-place reduction's values grow each call (OpDef.max_iters)
    use_graph = device.type == "cuda" and size <= spec.graph_max_bytes
    body = lambda: [run_once() for _ in range(iters)]  # noqa: E731
    if use_graph:
        ctx.phase(f"{spec.op} {size} B graph capture")
        graph = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            run_once()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            body()
        body = graph.replay
        body()
        torch.cuda.synchronize()
    # nccl-tests' size: the largest buffer a rank sees (all_gather's output, reduce_scatter's input)
    res = SizeResult(size_bytes=max(in_elems, out_elems) * esize, count=in_elems, iters=iters,
                     bus_factor=opdef.bus_factor(n), graph=use_graph)
    ref_in = fill(torch, max(res.size_bytes // esize, 1), rank, device, dtype)
    ref_out = torch.empty_like(ref_in)
    ref_once = lambda: _send_recv(dist, ref_in, ref_out, rank, n)  # noqa: E731
    ref_once()
    for i in range(spec.samples):
        inp.copy_(init)
        if device.type == "cuda":
            torch.cuda.synchronize()
        dist.barrier()
        ctx.phase(f"{spec.op} {size} B sample {i}")
        if use_graph:  # the graph replays all iterations at once: the reference follows as a block
            res.time_us.append(timer(body) / iters * 1e6)
            res.call_us.append(res.time_us[-1])
            res.ref_us.append(timer(lambda: [ref_once() for _ in range(iters)]) / iters * 1e6)
            continue
        # op and reference alternate call by call, so a core taken away for a few ms hits both
        op_calls, ref_calls = [], []
        for _ in range(iters):
            t = timer(run_once)
            if not whole:  # the fractional knob: this call takes k times as long, in real time
                t += timer(lambda: _busy_wait(t * (slowdown - 1)))
            op_calls.append(t)
            ref_calls.append(timer(ref_once))
        res.time_us.append(sum(op_calls) / iters * 1e6)
        res.call_us.append(statistics.median(op_calls) * 1e6)
        res.ref_us.append(statistics.median(ref_calls) * 1e6)
    # correctness on fresh data, outside the timed region
    ctx.phase(f"{spec.op} {size} B check")
    inp.copy_(init)
    out.fill_(-1)
    opdef.call(dist, inp, out, rank, n)
    if device.type == "cuda":
        torch.cuda.synchronize()
    res.wrong = opdef.wrong(torch, init, inp, out, elems, rank, n)
    return res


def run(spec: CollectiveSpec, ctx) -> list[dict]:
    """Worker entry point (see perfgate.launch.jobs): this rank's raw per-size samples as plain dicts."""
    import torch
    import torch.distributed as dist

    opdef = OP_DEFS[spec.op]
    slowdown = _slowdown()
    if slowdown != int(slowdown) and ctx.device.type == "cuda":
        raise ValueError(f"collective slowdown {slowdown:g} ({mutations.ENV}=collective_slowdown:k): fractional "
                         f"slowdowns time the host and work on CPU only")
    out = []
    for size in spec.sizes:
        out.append(vars(_measure_size(torch, dist, ctx, spec, opdef, size, slowdown)))
    return out
