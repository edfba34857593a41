"""KV-cache capacity and preemption: a server with too few KV blocks against the default (seed §16.10).

Seed (V100, 7B): with 1 GiB of KV instead of 4 GiB, C=16 ran at 66 % of the throughput, with 4
preemptions in both runs, TPOT worse and TTFT slightly lower. Here the small server is the
session's default dense server with only ``kv_small_blocks`` KV blocks (``--num-gpu-blocks-override``:
on CPU ``VLLM_CPU_KVCACHE_SPACE`` counts whole GiB, 524 288 tokens of the tiny model, far more
than any load here); the profile's blocks hold one max-length request (fewer and vLLM refuses to
start: 16 blocks of 128 tokens read "estimated maximum model length is 1920", one block being
vLLM's null block), and the load (C=16 of 128-token prompts on CPU) needs two blocks per running
request, so the scheduler must preempt.
Both servers get the same requests at the same concurrency, alternating every repetition on CPU.

Gated: output tok/s small / default (paired by repetition). Recorded: TTFT and TPOT medians of
both, their ratios, and the preemptions per request of the small server. Asserted: the small
server preempted (vllm:num_preemptions from /metrics rose), the default one did not: preemptions
appear only where capacity is short. Workload and metrics: perfgate.workloads.serving.measurements
(``kv_workload``, ``kv_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "kv")
def test_small_kv_cache_preempts(perf, servers, case):
    record(perf, serving.AREA.run(servers, case))
