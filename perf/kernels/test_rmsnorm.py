"""RMSNorm on one GPU: a Triton kernel beside eager PyTorch and torch.compile (bf16, fp32 accumulation).

Per (implementation, hidden, tokens): the time per call, from CUDA events around bursts of calls
that rotate among input sets several L2s large; the bandwidth it achieves (x read and y written
once, over that time) as a fraction of a large device-to-device copy measured in the same session;
for Triton, its time over eager's and over compile's, measured in the same rounds. Every
implementation is first checked against the fp32 reference on fresh random inputs (the Triton
output poisoned and checked fully written); the device's busy share is recorded beside each
timing, and a call of 512 MiB or more must keep the device busy (else the test says host-bound).
How: perfgate.workloads.kernels; what it means and how to run it: docs/kernels.md.
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads.kernels import AREA


@parametrize(AREA, "rmsnorm")
def test_rmsnorm(perf, runs, case):
    record(perf, AREA.run(runs, case))
