"""The shared GPT (perfgate.workloads.training.model) cut into pipeline chunks.

Every rank builds the whole model from the same seed and keeps only its chunks, so the
pipeline's parameters are bit-identical to a single-process model built the same way;
that is what lets the workload compare losses and gradients with a one-process run.
The embedding sits on the first chunk and the final norm and LM head on the last, as in
Megatron-Core: the end stages carry more parameters and work (the seed report's stage
imbalance), and the measurement shows it rather than hiding it.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from perfgate.workloads.training.model import GPT, GPTConfig

# CPU stand-in: 8 layers so that PP 4 x v 2 still gets one layer per chunk; untied head
# (a tied one would put one weight on two stages). Vocabulary 1024 makes the LM head cost
# about 2/3 of a block, the ratio of a 7B model (32k x 4096 vs 12 x 4096^2), so the end
# stages are heavier the way real ones are, without drowning the bubble in that imbalance.
# One microbatch of 4 x 64 tokens: ~50 ms forward+backward through the whole model on one core.
CPU_CONFIG = GPTConfig("gpt-pp-cpu", n_layer=8, d_model=128, n_head=4, vocab=1024, seq_len=64,
                       tie_embeddings=False)
# The seed report's PP model (§8): 16 layers, hidden 768, 16 heads, vocab 32k, seq 512,
# untied embedding and output (share_embeddings_and_output_weights=False), ~163M parameters.
GPU_CONFIG = GPTConfig("gpt-pp-163m", n_layer=16, d_model=768, n_head=16, vocab=32000, seq_len=512,
                       tie_embeddings=False)


class StageModule(nn.Module):
    """Embedding (first chunk only) -> a slice of blocks -> final norm and head (last chunk only)."""

    def __init__(self, gpt: GPT, layers: range, *, first: bool, last: bool):
        super().__init__()
        self.tok_emb = gpt.tok_emb if first else None
        self.pos_emb = gpt.pos_emb if first else None
        self.blocks = nn.ModuleList(gpt.blocks[i] for i in layers)
        self.ln_f = gpt.ln_f if last else None
        self.head = gpt.head if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tok_emb is not None:
            pos = torch.arange(x.shape[1], device=x.device)
            x = self.tok_emb(x) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.ln_f(x))
        return x


def cut(gpt: GPT, layers: range, *, first: bool, last: bool) -> tuple[StageModule, dict[str, str]]:
    """One chunk of ``gpt`` and a map from the chunk's parameter names to the full model's."""
    if gpt.cfg.tie_embeddings and not (first and last):
        raise ValueError(f"model {gpt.cfg.name} ties embedding and head: a pipeline cut would put one "
                         "weight on two stages; use an untied config")
    full_names = {id(p): name for name, p in gpt.named_parameters()}
    module = StageModule(gpt, layers, first=first, last=last)
    return module, {name: full_names[id(p)] for name, p in module.named_parameters()}


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())
