"""Long-prefill interference: what long prompts arriving mid-stream do to running decodes
(seed §10.4: 1024-token prompts lifted TTFT to ~1 s and slowed decode TPOT to 72-91 ms).

Each repetition runs the same shape of decode streams twice: alone, then with a few
long-prompt requests (output 1 token) arriving while they decode. Gated: the decode
streams' median E2EL (always), median TPOT and p99 inter-chunk latency (over repetitions
whose tokens did not all arrive in one read) with prefills over without (in-run ratios); recorded:
the long prompts' own TTFT and the decode streams' latencies. Workload and metrics:
perfgate.workloads.serving.measurements (``long_prefill_workload``, ``long_prefill_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "long_prefill")
def test_long_prefill_interference(perf, servers, case):
    """Gates nothing on the CPU machine: every ratio here is record-only in
    baselines/cpu-*/tolerances.toml (run-to-run spread 26 %, starved clients); gated on GPUs."""
    record(perf, serving.AREA.run(servers, case))
