"""torch LayerNorm that Megatron-Core's sequence parallelism can use without Apex.

Megatron's local layer spec falls back to ``WrappedTorchNorm`` when Apex is absent (the GPU
image has neither Apex nor Transformer Engine), and that wrapper refuses
``sequence_parallel=True``: under SP a LayerNorm sees only its rank's slice of the
sequence, so its weight and bias gradients are partial sums that must be all-reduced over
the TP group, and only modules that mark their parameters ``sequence_parallel`` get that
all-reduce in ``finalize_model_grads``. Apex's FusedLayerNorm marks them; this class does
the same one thing on top of ``torch.nn.LayerNorm`` (the math is per token, so a sequence
slice is fine). With SP off the mark is False and it is plain torch LayerNorm.
"""
from __future__ import annotations

import torch


class SequenceParallelLayerNorm(torch.nn.LayerNorm):
    def __init__(self, config, hidden_size: int, eps: float = 1e-5, **_unused):
        super().__init__(hidden_size, eps=eps)
        for param in self.parameters():
            setattr(param, "sequence_parallel", bool(config.sequence_parallel))
