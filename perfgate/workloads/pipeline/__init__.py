"""Pipeline, tensor and sequence parallelism workloads (issue 9).

Modules, each with one job, none importing pytest:
``layout`` (the validated TP x PP x DP layout), ``bubble`` (bubble theory and the arithmetic
that turns busy times into a measured bubble), ``stages`` (the shared GPT cut into pipeline
chunks), ``chunk_timer`` (busy-time brackets around a stage's chunk computations),
``torch_pp`` (torch.distributed.pipelining worker, CPU/gloo and GPU/NCCL), ``summary``
(per-rank raw timings -> per-M series and the M trend), ``megatron_common`` (Megatron-Core
set-up shared by the two Megatron workers), ``megatron_norm`` (a LayerNorm that lets the
local spec run sequence parallelism without Apex), ``megatron_pp`` (1F1B and interleaved
schedules) and ``megatron_tp`` (TP/DP, sequence parallelism, full recompute). Megatron runs
on CUDA only.
"""
