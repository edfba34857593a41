"""Run the Triton RMSNorm kernels through Triton's CPU interpreter; print one JSON line per check.

Started by tests/test_kernels.py in a process of its own with ``TRITON_INTERPRET=1``: Triton
reads that variable when a kernel is decorated, its own library kernels (``tl.sum``'s combine
function) included, so it must be set before ``triton.language`` is first imported, which a
pytest process may already have done.

Two parts:

- ``kernel`` lines: both access patterns on small shapes against a float64 reference, the
  output poisoned with NaN first;
- ``area`` lines: the three cases of one shrunk shape through ``AREA.run`` on CPU tensors (the
  copy probe and the shape's run through one run cache, ``measure_shape``'s numerics, rotating
  sets, bursts, rounds and busy shares, the reduce), to run the GPU path's plumbing where no GPU
  is. Faked for that, and only that: the device (the CPU), CUDA events (a host clock),
  synchronize, the device's name and L2 size, the profiler's busy share (0.96), CUDA graph capture
  (the launched burst stands in for its replay), and torch.compile (eager: inductor's CPU build takes minutes on this machine and is not what the
  GPU runs). The times it prints are meaningless.

Usage: TRITON_INTERPRET=1 python tests/rmsnorm_interpreted.py SEED
"""
from __future__ import annotations

import dataclasses
import json
import os
import sys
import time
import types

import torch

from perfgate.workloads.kernels import rmsnorm_torch

# (tokens, hidden, row_pad): row_pad > 0 makes rows further apart than they are long (a strided x)
SHAPES = [(5, 64, 0), (3, 100, 0), (4, 2048, 0), (6, 24, 9), (3, 300, 37)]
DRY_SHAPE = (8, 256)   # tokens, hidden of the measure_shape dry run


def check_kernels(gen) -> None:
    from perfgate.workloads.kernels import rmsnorm_triton

    for pattern in ("coalesced", "uncoalesced"):
        rmsnorm = rmsnorm_triton.launcher(pattern)
        for tokens, hidden, row_pad in SHAPES:
            wide, weight = rmsnorm_torch.random_inputs(tokens, hidden + row_pad, gen, "cpu")
            x, weight = wide[:, :hidden], weight[:hidden].contiguous()
            out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
            got = rmsnorm(x, weight, out)
            ref = rmsnorm_torch.reference(x, weight, dtype=torch.float64)
            print(json.dumps({"kernel": pattern, "tokens": tokens, "hidden": hidden, "row_stride": x.stride(0),
                              "same_buffer": got is out, "unwritten": rmsnorm_torch.unwritten(out),
                              "rel_error": rmsnorm_torch.relative_error(out, ref)}), flush=True)


class _HostClockEvent:
    def __init__(self, enable_timing: bool = False):
        self.t = None

    def record(self) -> None:
        self.t = time.perf_counter()

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: "_HostClockEvent") -> float:
        return (end.t - self.t) * 1e3


def dry_run_area() -> None:
    """Every implementation's case of one (shrunk) shape through ``AREA.run``: the copy probe and the
    shape's run through one run cache, measure_shape, the reduce; one ``area`` line per case."""
    from perfgate.runcache import RunCache
    from perfgate.workloads import device_time, kernels
    from perfgate.workloads.area import Measured
    from perfgate.workloads.kernels import gpu_timing, rmsnorm_bench

    torch.cuda.Event = _HostClockEvent
    torch.cuda.synchronize = lambda *a, **k: None
    torch.cuda.empty_cache = lambda: None
    torch.cuda.get_device_name = lambda device=None: "cpu (dry run)"
    torch.cuda.get_device_properties = lambda device: types.SimpleNamespace(L2_cache_size=1 << 10)  # 2 sets
    device_time.measure = lambda fn, device: (fn(), device_time.DeviceWindow(span_ms=1.0, busy_ms=0.96))
    gpu_timing.graphed = lambda burst, device: burst
    rmsnorm_torch.compiled_rmsnorm = lambda: rmsnorm_torch.rmsnorm_eager
    kernels._device = lambda: "cpu"
    gpu_timing.BYTES_PER_SAMPLE = 1          # the fewest calls a burst takes
    gpu_timing.BUSY_BURSTS = 1
    gpu_timing.COPY_BYTES = 1 << 20
    rmsnorm_bench.ROUNDS = 5
    runs = RunCache()
    tokens, hidden = DRY_SHAPE
    for case in kernels.AREA.cases(kernels.GPU)[:3]:  # triton, eager, compile of the first shape, shrunk
        case = dataclasses.replace(case, values=dataclasses.replace(case.values, hidden=hidden, tokens=tokens))
        records = kernels.AREA.run(runs, case)
        print(json.dumps({"area": case.values.impl,
                          "metrics": {r.name: r.record_kwargs() for r in records if isinstance(r, Measured)},
                          "spec": next(r.data for r in records if not isinstance(r, Measured))}), flush=True)
    print(json.dumps({"produced": runs.produced}), flush=True)


def main(seed: int) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1: the kernels must be decorated for the interpreter")
    import triton

    print(json.dumps({"triton": triton.__version__}), flush=True)
    check_kernels(torch.Generator().manual_seed(seed))
    dry_run_area()


if __name__ == "__main__":
    main(int(sys.argv[1]))
