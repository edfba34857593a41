"""Cross-check our load generator against vLLM's own `vllm bench serve`.

Both tools load the same server with the same workload shape (random prompts of input_len
tokens, output_len forced tokens, greedy, the same request count and concurrency) *at the
same time*: we start `vllm bench serve`, wait until its timed run begins (after it imports
vLLM and sends its test prompt), and run ours alongside. Back-to-back runs on a shared
2-core machine drift by more than the tools differ; side by side, both instruments see the
same server state.

Per round we compare medians; the median over rounds of ours/bench must lie within the
profile's ``bench_bounds`` (perfgate.workloads.serving.BenchBounds): on GPU ITL and E2EL 5 % each.
The GPU's TTFT and TPOT were bounded too (10 %, 5 %) while the served model was the host-bound 1.1 B
one; on the 7.24 B model the same C=16 read TTFT ours/bench 0.795 and TPOT 1.067 with E2EL 0.990 and
ITL 1.001 (2026-12-02, results-store/1xH200/serving-7b-2026-12-02-sitting2-run3-rest): the split below.
The 2-core CPU profile records the gaps without bounds: until 2026-12-02 it asserted ITL 5 %, E2EL
10 %, TPOT 25 %, TTFT 50 %, which held on AMD VMs and failed twice in two runs on an Intel AMX VM
where half the rounds had a client starved (ServingProfile.bench_bounds). TTFT is not an instrument figure
at C > 1: each closed-loop client settles into a phase pattern of its own, and the pattern
sets TTFT. On an aligned timeline at C=4, `vllm bench serve` sent one request of every wave
~7 ms ahead of the other three (prefilled alone, TTFT ~22 ms; the three waited a step, ~34
ms) while ours went in lock-step, so median TTFT ours/bench read 0.64-1.38 per round with
E2EL within 3 %. E2EL carries that TTFT: on 2 vCPUs TTFT is ~10 % of E2EL at C=4, so the
TTFT pattern alone moves E2EL by several percent (the CI run of 481f343: TTFT ours/bench 0.632,
E2EL 0.942, TPOT 1.007, ITL 1.002), and TPOT = (E2EL - TTFT)/(n - 1) takes up what TTFT gives
(a later run: TTFT 0.643, TPOT 1.159, E2EL 0.989, ITL 1.004), hence 10 % and 25 % there. At C=1 there is no pattern, but on 2 vCPUs most C=1 rounds had a client
starved of CPU (one CI run: 6 of 8 rounds), so C=1 cannot be the CI check here.

A round in which either client was starved (every token of most requests in one read:
median TPOT ~0, TTFT = E2EL) says nothing about the instruments and is run again, up to a
limit; if every round is starved the test is skipped and says so. Rounds whose tokens came
in pairs (median ITL ~0, TPOT fine) still compare TTFT, TPOT and E2EL, but not ITL.
Workload and metrics: perfgate.workloads.serving.measurements (``bench_workload``: one phase with
`vllm bench serve` beside it; ``bench_reduce``, which also imports the file the real tool wrote).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "bench")
def test_vllm_bench_serve_crosscheck(perf, servers, case):
    """The gaps to `vllm bench serve` are recorded; where the profile has bench_bounds (the GPU), the
    agreement is checked on the median over rounds. On 2 vCPUs it is not (ServingProfile.bench_bounds):
    there the test fails on failed requests, a wrong token count or an import that changes a number."""
    record(perf, serving.AREA.run(servers, case))
