"""Single-stream decode speed, dense and MoE: one request at a time, many forced tokens.

decode tok/s per request = 1000 / TPOT, TPOT = (E2EL - TTFT) / (output tokens - 1) with the
server's token count. Absolute figures (recorded everywhere, gated where the plugin gates
absolute metrics, i.e. on GPU hardware ids); the in-run invariant is 0 failed requests.

On 2 shared vCPUs a client is now and then starved for a whole run and reads every answer in
one piece (TPOT 0, no decode speed to compute: seen in a CI run, all 5 requests). Such a run
is measured again, up to DECODE_ATTEMPTS times, and the test skips with that reason if none
streamed. Workload and metrics: perfgate.workloads.serving.measurements (``decode_workload``,
``decode_reduce``); every phase checks that no request failed and that each generated exactly its
forced tokens (ignore_eos honoured).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "decode")
def test_single_stream_decode(perf, servers, case):
    """Cases ``<profile>-dense`` and ``<profile>-moe``: the profile's Llama-style and Qwen3-MoE models."""
    record(perf, serving.AREA.run(servers, case))
