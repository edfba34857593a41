"""Build the GPU serving suite's model directories (config + tokenizer, no weights) for one H200.

Why these and not the GPU profile's default (Qwen2.5-7B shapes with a 4 006-word tokenizer
and 152 064 embedding rows): with dummy weights most generated ids would then lie outside
the tokenizer, and a 7B model leaves a 30 GB-per-server start on a lease measured in
minutes. These models are real shapes with every generated id inside the tokenizer:

  dense  TinyLlama-1.1B's shapes (Llama layout: hidden 2048, 22 layers, 32 heads / 4 KV heads,
         MLP 5632, vocabulary 32 000 words -> 32 064 rows): 1.1 B parameters, 2.2 GB in bf16
  moe    the profile's Qwen3-MoE layout (hidden 2048, 24 layers, 64 experts top-8), vocabulary
         32 000 words: 7.8 B total / ~1.8 B active parameters

Serve them with `--load-format dummy` (vLLM fills random weights on the GPU; no hub, no
weight files). Usage, on the GPU machine:

  python3 scripts/build_gpu_serving_models.py /tmp/models
  export PERFGATE_SERVING_MODEL=/tmp/models/dense PERFGATE_SERVING_MOE_MODEL=/tmp/models/moe
  export PERFGATE_SERVING_ENGINE_ARGS="--load-format dummy"
"""
from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from perfgate.workloads.serving.tiny_model import (QWEN3_MOE_SMALL_STRUCTURE, TinyModelSpec,  # noqa: E402
                                                   build_tiny_model)

LLAMA_1B_STRUCTURE = TinyModelSpec(
    arch="llama", vocab_words=32000, hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4,
    head_dim=64, intermediate_size=5632, max_position_embeddings=4096)
QWEN3_MOE_32K_VOCAB = replace(QWEN3_MOE_SMALL_STRUCTURE, vocab_words=32000, vocab_size=None)

MODELS = {"dense": LLAMA_1B_STRUCTURE, "moe": QWEN3_MOE_32K_VOCAB}


def params(spec: TinyModelSpec, vocab_size: int) -> float:
    """Parameter count (embedding + lm head + layers), for the printed summary."""
    h, L = spec.hidden_size, spec.num_layers
    attn = h * spec.head_dim * (spec.num_heads * 2 + spec.num_kv_heads * 2)
    if spec.kind == "moe":
        mlp = spec.num_experts * 3 * h * spec.moe_intermediate_size + h * spec.num_experts
    else:
        mlp = 3 * h * spec.intermediate_size
    return 2 * vocab_size * h + L * (attn + mlp)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print(f"usage: {argv[0]} OUT_DIR", file=sys.stderr)
        return 2
    out = Path(argv[1])
    for name, spec in MODELS.items():
        built = build_tiny_model(out / name, spec)
        print(f"{name}: {built.path} ({spec.architecture}, {params(spec, built.vocab_size) / 1e9:.2f} B params, "
              f"vocab {built.vocab_size}, {len(built.word_ids)} prompt words)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
