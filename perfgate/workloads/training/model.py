"""A GPT-style decoder, defined once, with named configurations and synthetic batches.

Every training measurement (DDP, FSDP, pipeline) trains this one model so that numbers
from different parallelism modes differ only by the mode. The two GPU configurations
reproduce the seed report's parameter counts exactly (109,942,272 and 367,888,384):
bias-free linear layers, LayerNorm with bias, learned positions, and a tied LM head
for the 110M model but an untied one for the 368M model, as the seed's counts imply.

Tokens are drawn on the training device from a seeded generator, so the data path costs
no host-to-device copies and every mode sees the same batches (losses are comparable).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the decoder. ``seq_len`` is the training sequence length (also the position table)."""

    name: str
    n_layer: int
    d_model: int
    n_head: int
    vocab: int
    seq_len: int
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        for field_name in ("n_layer", "d_model", "n_head", "vocab", "seq_len"):
            if getattr(self, field_name) < 1:
                raise ValueError(f"{self.name}: {field_name} must be >= 1, got {getattr(self, field_name)}")
        if self.d_model % self.n_head:
            raise ValueError(f"{self.name}: d_model {self.d_model} is not divisible by n_head {self.n_head}")

    @property
    def n_params(self) -> int:
        """Exact parameter count (what ``sum(p.numel())`` of the built model gives)."""
        d = self.d_model
        block = 12 * d * d + 4 * d  # qkv 3d^2 + proj d^2 + mlp 8d^2, two LayerNorms (weight+bias)
        head = 0 if self.tie_embeddings else self.vocab * d
        return self.vocab * d + self.seq_len * d + self.n_layer * block + 2 * d + head


CONFIGS: dict[str, GPTConfig] = {c.name: c for c in (
    # The seed report's models (§5: DDP, §6: FSDP), for GPUs.
    GPTConfig("gpt-110m", n_layer=12, d_model=768, n_head=12, vocab=32000, seq_len=512, tie_embeddings=True),
    GPTConfig("gpt-368m", n_layer=24, d_model=1024, n_head=16, vocab=32000, seq_len=256, tie_embeddings=False),
    # Device-bound GPU cases: a step of thousands of tokens through a 1.3 B decoder keeps an H200
    # busy for tens to hundreds of ms, so the step time measures the GPU, not the host that feeds it
    # (the seed's models at their batch sizes step in a few ms of device work: host-bound).
    GPTConfig("gpt-1.3b", n_layer=24, d_model=2048, n_head=16, vocab=32000, seq_len=2048, tie_embeddings=True),
    GPTConfig("gpt-1.3b-untied", n_layer=24, d_model=2048, n_head=16, vocab=32000, seq_len=2048,
              tie_embeddings=False),
    # CPU stand-ins: same architecture, sized so a step takes tens of milliseconds on one core.
    GPTConfig("gpt-tiny", n_layer=2, d_model=128, n_head=4, vocab=2048, seq_len=64, tie_embeddings=True),
    GPTConfig("gpt-tiny-untied", n_layer=8, d_model=128, n_head=4, vocab=2048, seq_len=64, tie_embeddings=False),
)}

# Seed report's stated parameter counts, kept here so a cheap test can pin the architecture.
SEED_PARAM_COUNTS = {"gpt-110m": 109_942_272, "gpt-368m": 367_888_384}


def get_config(name: str) -> GPTConfig:
    try:
        return CONFIGS[name]
    except KeyError:
        raise ValueError(f"unknown model config {name!r}; known: {', '.join(sorted(CONFIGS))}") from None


class CausalSelfAttention(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model, bias=False)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.n_head, d // self.n_head).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class MLP(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.fc = nn.Linear(cfg.d_model, 4 * cfg.d_model, bias=False)
        self.proj = nn.Linear(4 * cfg.d_model, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


class GPTBlock(nn.Module):
    """One pre-LayerNorm transformer block: the unit FSDP wraps and pipelines split on."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab, cfg.d_model)
        self.pos_emb = nn.Embedding(cfg.seq_len, cfg.d_model)
        self.blocks = nn.ModuleList(GPTBlock(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.tok_emb.weight
        self.reset_parameters()

    def reset_parameters(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:  # LayerNorm
                nn.init.ones_(p) if name.endswith("weight") else nn.init.zeros_(p)
            elif name.endswith("proj.weight"):  # GPT-2: scale residual projections by depth
                nn.init.normal_(p, std=std / math.sqrt(2 * self.cfg.n_layer))
            else:
                nn.init.normal_(p, std=std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.tok_emb(tokens) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def build_model(name_or_cfg: str | GPTConfig, device: torch.device | str = "cpu", seed: int = 0) -> GPT:
    """Build the model with a seeded init, created directly on ``device``.

    Every rank and every mode gets the same numbers for the same seed and device type,
    which FSDP needs (it does not broadcast rank 0's weights) and which makes the losses
    of different modes comparable. Initialising on the GPU avoids a 1.5 GB CPU init per case.
    """
    cfg = get_config(name_or_cfg) if isinstance(name_or_cfg, str) else name_or_cfg
    dev = torch.device(device)
    cuda_devices = [dev.index if dev.index is not None else torch.cuda.current_device()] if dev.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda_devices):
        torch.manual_seed(seed)
        with dev:
            return GPT(cfg)


def loss_fn(model: nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy in fp32 (logits are upcast under autocast)."""
    logits = model(tokens[:, :-1])
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), tokens[:, 1:].reshape(-1))


class SyntheticTokens:
    """Seeded random token sequences generated on the device itself.

    Sequence ``g`` of optimizer step ``step`` is a pure function of ``(seed, step, g)``, and
    micro-batch ``micro`` on ``rank`` holds the global sequences
    ``((micro * world_size + rank) * micro_batch + j)``. So one optimizer step covers the
    same global batch whatever the split into ranks and accumulation steps: strong-scaling
    runs at world 1, 2, 4 train on identical data (their losses agree), and DDP and FSDP
    runs of one world size see identical batches.
    """

    def __init__(self, cfg: GPTConfig, micro_batch: int, device: torch.device | str, seed: int,
                 rank: int = 0, world_size: int = 1):
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside world size {world_size}")
        self.cfg = cfg
        self.micro_batch = micro_batch
        self.device = torch.device(device)
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self._gen = torch.Generator(device=self.device)

    def sequence_ids(self, micro: int) -> list[int]:
        first = (micro * self.world_size + self.rank) * self.micro_batch
        return list(range(first, first + self.micro_batch))

    def batch(self, step: int, micro: int = 0) -> torch.Tensor:
        rows = []
        for g in self.sequence_ids(micro):
            self._gen.manual_seed((self.seed * 1_000_003 + step) * 1_000_033 + g)
            rows.append(torch.randint(0, self.cfg.vocab, (self.cfg.seq_len + 1,), device=self.device,
                                      generator=self._gen))
        return torch.stack(rows)

    @property
    def tokens_per_micro(self) -> int:
        return self.micro_batch * self.cfg.seq_len
