"""Training-parallelism workloads: one GPT model, DDP and FSDP engines, validated specs.

The modules run inside :func:`perfgate.launch.launch` workers and never import pytest:
``model`` (the decoder and synthetic data), ``specs`` (validated job descriptions),
``engine`` (the shared warm-up / timed / memory-tracked step loop), ``ddp`` and ``fsdp``
(build the parallel wrapper for one case and hand its step to the engine), ``summary``
(pure arithmetic over the per-rank results) and ``plans`` (which cases a session runs).
"""
