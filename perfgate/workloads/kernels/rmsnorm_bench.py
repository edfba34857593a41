"""One RMSNorm shape on one GPU: every implementation checked, then timed side by side.

For a shape (tokens x hidden, bf16):

1. each implementation (Triton, eager PyTorch, torch.compile) runs once on fresh random inputs
   and is compared with the fp32 reference (the first call also compiles it); the Triton
   kernel writes into an output poisoned with NaN, so an element it never wrote shows;
2. ``ROUNDS`` rounds, each timing one burst of every implementation in turn over the same
   rotating input sets (perfgate.workloads.kernels.gpu_timing): the i-th samples of two
   implementations were measured seconds apart, so their ratio pairs round by round;
3. ``BUSY_WINDOWS`` profiled windows of each (``gpu_timing.BUSY_BURSTS`` bursts back to back) give
   the device's busy share;
4. each burst captured as a CUDA graph (``gpu_timing.graphed``), then ``ROUNDS`` rounds of one
   replay of every implementation in turn: the same calls with no host launch between them.

Returns the raw :class:`ShapeRun`; perfgate.workloads.kernels.reduce makes the metrics.
"""
from __future__ import annotations

import secrets
from typing import Callable

from perfgate.workloads import device_time
from perfgate.workloads.kernels import gpu_timing, rmsnorm_torch
from perfgate.workloads.kernels.raw import ImplRun, ShapeRun

IMPLS = ("triton", "eager", "compile")
WRITES_INTO_OUT = frozenset({"triton"})  # takes the output buffer: poisoned before its check
ROUNDS = 15
WARMUP_BURSTS = 2
BUSY_WINDOWS = 3


def bytes_per_call(tokens: int, hidden: int, element_bytes: int = 2) -> int:
    """The fewest bytes one call moves: x read once, y written once, the weight read once."""
    return (2 * tokens * hidden + hidden) * element_bytes


def implementations(pattern: str) -> dict[str, Callable]:
    """The three RMSNorms, each ``fn(x, weight) -> out`` (Triton's also takes ``out``)."""
    from perfgate.workloads.kernels import rmsnorm_triton

    return {"triton": rmsnorm_triton.launcher(pattern), "eager": rmsnorm_torch.rmsnorm_eager,
            "compile": rmsnorm_torch.compiled_rmsnorm()}


def check_numerics(name: str, fn: Callable, tokens: int, hidden: int, gen, device) -> tuple[float, int]:
    """(relative error against the fp32 reference, elements left unwritten) on fresh inputs."""
    import torch

    x, weight = rmsnorm_torch.random_inputs(tokens, hidden, gen, device)
    if name in WRITES_INTO_OUT:
        out = torch.full_like(x, float("nan"))
        fn(x, weight, out)
    else:
        out = fn(x, weight)
    torch.cuda.synchronize(device)
    ref = rmsnorm_torch.reference(x, weight)
    return rmsnorm_torch.relative_error(out, ref), rmsnorm_torch.unwritten(out)


def _rounds(timed: dict, calls: int) -> dict[str, list[float]]:
    """ROUNDS rounds, each timing one burst (or replay) of every implementation in turn: us per call."""
    time_us: dict[str, list[float]] = {name: [] for name in timed}
    for _ in range(ROUNDS):
        for name, burst in timed.items():
            time_us[name].append(burst.timed_ms() * 1e3 / calls)
    return time_us


def measure_shape(tokens: int, hidden: int, device) -> ShapeRun:
    """Check, time and profile every implementation at ``tokens x hidden`` (see the module docstring)."""
    import torch

    from perfgate.workloads.kernels import rmsnorm_triton

    pattern = rmsnorm_triton.variant()
    fns = implementations(pattern)
    seed = secrets.randbits(62)
    gen = torch.Generator(device=device).manual_seed(seed)
    numerics = {name: check_numerics(name, fn, tokens, hidden, gen, device) for name, fn in fns.items()}
    torch.cuda.empty_cache()

    moved = bytes_per_call(tokens, hidden)
    l2 = gpu_timing.l2_bytes(device)
    sets = gpu_timing.buffer_sets(moved, l2)
    calls = gpu_timing.calls_per_sample(moved, sets)
    inputs = [rmsnorm_torch.random_inputs(tokens, hidden, gen, device) for _ in range(sets)]
    bursts = {name: gpu_timing.Burst(fn, inputs, calls) for name, fn in fns.items()}
    for burst in bursts.values():
        for _ in range(WARMUP_BURSTS):
            burst()
    torch.cuda.synchronize(device)
    time_us = _rounds(bursts, calls)
    busy = {name: [device_time.measure(lambda b=burst: b.repeated(gpu_timing.BUSY_BURSTS), device)[1].fraction
                   for _ in range(BUSY_WINDOWS)]
            for name, burst in bursts.items()}
    graphs = {name: gpu_timing.graphed(burst, device) for name, burst in bursts.items()}
    for graph in graphs.values():
        graph()
    torch.cuda.synchronize(device)
    graph_us = _rounds(graphs, calls)
    for graph in graphs.values():
        graph.release()
    del bursts, graphs, inputs
    torch.cuda.empty_cache()
    runs = {name: ImplRun(name, time_us[name], busy[name], *numerics[name], graph_time_us=tuple(graph_us[name]))
            for name in fns}
    return ShapeRun(hidden=hidden, tokens=tokens, impls=runs, buffer_sets=sets, calls_per_sample=calls, seed=seed,
                    l2_bytes=l2, device=torch.cuda.get_device_name(device), variant=pattern)
