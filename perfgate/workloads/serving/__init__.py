"""Serving measurements: a real `vllm serve`, our load generator, metrics from raw records.

Modules: loadgen (requests and raw timings), serving_metrics (records -> TTFT/TPOT/ITL/goodput),
server (start/stop vllm serve), server_metrics (its /metrics counters), vllm_bench (vLLM's
own benchmark, for the cross-check), tiny_model (model dirs with no download),
decode_command and hf_decode (decode tokens/s of external commands). None imports vLLM.
"""
