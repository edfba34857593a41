"""How much GPU memory a training case needs, from its model and micro-batch, before it runs.

A perfgate test must never fail for lack of memory on a supported GPU: a case whose need
exceeds the GPU's memory is skipped with ``needs >= N GiB of GPU memory, this GPU has M``
(perfgate.machine.markers). The need is an upper estimate from the shapes, calibrated on what
torch's MemTracker measured on one H200 (1xH200 baselines, 2026-12-02..05, bf16 autocast, fused AdamW):

- model state, 16 bytes a parameter: fp32 weights (4), gradients (4), AdamW's two moments (8);
  4 more where the gathered weights stay beside the shards (FSDP2 without resharding: 10,250 MiB of
  params at the peak of the 1.3 B model, against 5,125 for DDP and the other FSDP modes);
- activations per sequence: ``seq_len x (36 x n_layer x d_model + 16 x vocab)`` bytes. The 1.3 B
  decoder (24 x 2048, seq 2048, vocab 32 k) measured 3,734 MiB of activations and 500 MiB of
  temporaries per sequence at every micro-batch from 1 to 8; the formula gives 4,457 MiB (the
  vocabulary term is the bf16 logits, their fp32 upcast and the loss gradient);
- 5 GiB that the shapes do not give: the ~2.4 GiB of activations the 1.3 B model keeps whatever
  the micro-batch, the allocator's rounding and fragmentation, NCCL's buffers.

For gpt-1.3b DDP at micro-batch 8 that is 58.9 GiB against a measured peak of 54.6 (H200), and 64.8 for
the untied model under FSDP2 without resharding (55.5 measured): both run on an 80 GB H100 (79.2 GiB usable) and skip on a
48 GB card; micro-batch 1 needs 28.4 (25.6 measured). ``tests/test_training_memory_need.py``
holds the estimate above every committed 1xH200 peak and within 25 % of the large ones.
"""
from __future__ import annotations

from perfgate.workloads.training.model import GPTConfig, get_config

GIB = 2 ** 30
STATE_BYTES_PER_PARAM = 16          # fp32 weights, gradients, AdamW moments
FSDP_UNSHARDED_BYTES_PER_PARAM = 4  # FSDP's gathered copy of the weights
ACTIVATION_BYTES_PER_LAYER_TOKEN_WIDTH = 36
LOGIT_BYTES_PER_TOKEN_VOCAB = 16
UNTRACKED_GIB = 5.0


def activation_bytes_per_sequence(cfg: GPTConfig) -> int:
    return cfg.seq_len * (ACTIVATION_BYTES_PER_LAYER_TOKEN_WIDTH * cfg.n_layer * cfg.d_model
                          + LOGIT_BYTES_PER_TOKEN_VOCAB * cfg.vocab)


def need_gib(model: str | GPTConfig, micro_batch: int, *, unsharded_copy: bool = False) -> float:
    """GPU memory (GiB) one rank of a case of ``model`` at ``micro_batch`` sequences needs at most.

    ``unsharded_copy``: the gathered weights stay beside the shards (FSDP2 without resharding).
    Sharding over more ranks only lowers the need, so one rank's whole model is counted: the
    estimate holds at every world size."""
    if micro_batch < 1:
        raise ValueError(f"micro_batch must be >= 1, got {micro_batch}")
    cfg = get_config(model) if isinstance(model, str) else model
    per_param = STATE_BYTES_PER_PARAM + (FSDP_UNSHARDED_BYTES_PER_PARAM if unsharded_copy else 0)
    total = per_param * cfg.n_params + micro_batch * activation_bytes_per_sequence(cfg)
    return round(total / GIB + UNTRACKED_GIB, 1)
