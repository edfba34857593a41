"""Build the GPU serving profile's model directories (config + tokenizer, no weights) ahead of a run.

The suite builds the same directories itself when PERFGATE_SERVING_MODEL is unset
(perfgate.workloads.serving.GPU_PROFILE); building them once under a fixed path lets the runs
of one warm lent machine share them (dev/gpu/gpu_serving_session.sh). The models are real
shapes whose ids are tokenizer entries but for the embedding's padding to a multiple of 64
(the Qwen2.5-7B shapes' 152 064 rows against a 4 006-word tokenizer are not:
tiny_model.QWEN25_7B_STRUCTURE):

  dense-7b  the profile's dense model: a 7.24 B Llama layout (hidden 4096, 32 layers, 32 / 8 KV
         heads, MLP 14336, vocabulary 32 000 words -> 32 064 rows), 14.5 GB in bf16: device-bound
         on an H200
  dense-1b  TinyLlama-1.1B's shapes (hidden 2048, 22 layers, 32 heads / 4 KV heads, MLP 5632, the
         same tokenizer): the profile's model until 2026-12-02, host-bound on a 16-core H200 host
         (kept to reproduce the results-store runs of that time: DENSE=dense-1b)
  moe    a Qwen3-MoE layout (hidden 2048, 24 layers, 64 experts top-8), vocabulary
         32 000 words: 7.8 B total / ~1.8 B active parameters

Serve them with `--load-format dummy` (vLLM fills random weights on the GPU; no hub, no
weight files). Usage, on the GPU machine:

  python3 dev/gpu/build_gpu_serving_models.py /tmp/models
  export PERFGATE_SERVING_MODEL=/tmp/models/dense-7b PERFGATE_SERVING_MOE_MODEL=/tmp/models/moe
  export PERFGATE_SERVING_ENGINE_ARGS="--load-format dummy"
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from perfgate.workloads.serving import GPU_PROFILE  # noqa: E402
from perfgate.workloads.serving.tiny_model import LLAMA_1B_STRUCTURE, TinyModelSpec, build_tiny_model  # noqa: E402

MODELS = {"dense-7b": GPU_PROFILE.dense_model, "moe": GPU_PROFILE.moe_model, "dense-1b": LLAMA_1B_STRUCTURE}


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
