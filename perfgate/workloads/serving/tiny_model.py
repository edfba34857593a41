"""Build a tiny model directory that `vllm serve` can load with no model hub.

There is no hub on CI machines, so the serving suite makes its own model: a config.json
of a small Llama-style (dense) or Qwen3-MoE-style (sparse) decoder, and a tokenizer
trained here with the `tokenizers` library on a synthetic corpus. Presets: `TINY_DENSE` and `TINY_MOE`
for CPU, and full-size layouts (`QWEN25_7B_STRUCTURE`, the seed's dummy 7B engine) for GPU. Weights are either
absent (serve with ``--load-format dummy``: vLLM fills random values) or random
safetensors written by transformers (exercises the real weight-loading path).

The tokenizer is word-level on purpose: every vocabulary word is exactly one token, so
a prompt of N words is N tokens for our load generator, for `vllm bench serve` and for
the server alike, and cross-tool comparisons use identical prompt lengths.

Heavy imports (tokenizers, transformers, torch) happen inside the functions that need
them, so importing perfgate never imports them.
"""
from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "</s>", "<|im_start|>", "<|im_end|>")

# ChatML, the format most instruct models use; vLLM needs a template for /v1/chat/completions.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

_SYLLABLES = ("ka", "lo", "mi", "nu", "ra", "te", "vo", "zi", "pe", "su", "da", "fo", "gi", "hu", "ja", "xe")


ARCHITECTURES = {
    # arch -> (HF architectures entry, model_type, kind)
    "llama": ("LlamaForCausalLM", "llama", "dense"),
    "qwen2": ("Qwen2ForCausalLM", "qwen2", "dense"),
    "qwen3_moe": ("Qwen3MoeForCausalLM", "qwen3_moe", "moe"),
}


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of a decoder to build. Defaults are small enough to serve on 2 CPU cores."""

    arch: Literal["llama", "qwen2", "qwen3_moe"] = "llama"
    vocab_words: int = 4000          # ordinary words in the tokenizer (specials come on top)
    vocab_size: int | None = None    # embedding rows; None = tokenizer size rounded up to 64
    hidden_size: int = 256
    num_layers: int = 4
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768     # dense MLP width
    num_experts: int = 8             # moe only
    experts_per_token: int = 2       # moe only
    moe_intermediate_size: int = 256  # moe only: per-expert MLP width
    max_position_embeddings: int = 4096
    dtype: str = "bfloat16"
    weights: Literal["dummy", "safetensors"] = "dummy"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise ValueError(f"arch must be one of {sorted(ARCHITECTURES)}, got {self.arch!r}")
        if self.weights not in ("dummy", "safetensors"):
            raise ValueError(f"weights must be 'dummy' or 'safetensors', got {self.weights!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}")
        if self.kind == "moe" and not 1 <= self.experts_per_token <= self.num_experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} must be in 1..num_experts={self.num_experts}")
        if self.vocab_words < 16:
            raise ValueError(f"vocab_words={self.vocab_words} is too small for a useful tokenizer")
        if self.vocab_size is not None and self.vocab_size < self.vocab_words + len(SPECIAL_TOKENS):
            raise ValueError(f"vocab_size={self.vocab_size} is smaller than the tokenizer "
                             f"({self.vocab_words} words + {len(SPECIAL_TOKENS)} specials)")

    @property
    def kind(self) -> str:
        return ARCHITECTURES[self.arch][2]

    @property
    def architecture(self) -> str:
        return ARCHITECTURES[self.arch][0]


TINY_DENSE = TinyModelSpec(arch="llama")
"""~5M parameters, Llama layout: the CPU suite's dense model."""
TINY_MOE = TinyModelSpec(arch="qwen3_moe")
"""Qwen3-MoE layout, 8 experts, top-2: the CPU suite's sparse model."""
QWEN25_7B_STRUCTURE = TinyModelSpec(
    arch="qwen2", vocab_size=152064, hidden_size=3584, num_layers=28, num_heads=28, num_kv_heads=4,
    head_dim=128, intermediate_size=18944, max_position_embeddings=32768)
"""Qwen2.5-7B-Instruct's shapes (the seed's dummy 7B engine), with our tokenizer: serve with dummy weights.
Not a default: its 152 064 embedding rows against our 4 006-word tokenizer let random weights
generate ids that are no word (point PERFGATE_SERVING_MODEL at a real checkpoint's dir instead)."""
QWEN3_MOE_SMALL_STRUCTURE = TinyModelSpec(
    arch="qwen3_moe", vocab_size=151936, hidden_size=2048, num_layers=24, num_heads=32, num_kv_heads=4,
    head_dim=128, intermediate_size=6144, num_experts=64, experts_per_token=8, moe_intermediate_size=768,
    max_position_embeddings=32768)
"""A ~15B-total / ~2B-active Qwen3-MoE layout for one GPU, dummy weights."""
LLAMA_1B_STRUCTURE = TinyModelSpec(
    arch="llama", vocab_words=32000, hidden_size=2048, num_layers=22, num_heads=32, num_kv_heads=4,
    head_dim=64, intermediate_size=5632, max_position_embeddings=4096)
"""TinyLlama-1.1B's shapes with a 32 000-word tokenizer (32 064 rows: 32 006 tokenizer entries and 58 rows of padding), dummy
weights: the GPU profile's dense model until 2026-12-02 (host-bound on a 16-core H200 host: TPOT 4.1x its weight-read
bound); ``dense-1b`` of dev/gpu/build_gpu_serving_models.py."""
LLAMA_7B_STRUCTURE = TinyModelSpec(
    arch="llama", vocab_words=32000, hidden_size=4096, num_layers=32, num_heads=32, num_kv_heads=8,
    head_dim=128, intermediate_size=14336, max_position_embeddings=4096)
"""A 7.24 B Llama layout (Llama-3-8B's shapes with the 32 000-word tokenizer, 32 064 rows), dummy weights:
device-bound on an H200 (single-stream TPOT 4.68 ms over three rounds of `vllm bench serve`, 1.38x the
14.5 GB weight-read bound; the 1.1 B profile reads 2.1-2.5 ms, 4.1x its bound: host-bound). Built as
``dense-7b`` by dev/gpu/build_gpu_serving_models.py: the GPU profile's dense model (docs/serving.md)."""
QWEN3_MOE_GPU_STRUCTURE = replace(QWEN3_MOE_SMALL_STRUCTURE, vocab_words=32000, vocab_size=None)
"""The Qwen3-MoE layout above with the 32 000-word tokenizer (7.8 B total): the GPU profile's MoE model."""


@dataclass
class TinyModel:
    """A built model directory and what a client needs to make prompts for it."""

    path: Path
    spec: TinyModelSpec
    vocab_size: int                     # rows of the embedding (tokenizer size, padded)
    word_ids: list[int] = field(repr=False)  # ids of ordinary one-token words, for prompts
    eos_token_id: int = 3

    @property
    def load_format_args(self) -> tuple[str, ...]:
        """Engine arguments the weights need (`--load-format dummy` when none were saved)."""
        return ("--load-format", "dummy") if self.spec.weights == "dummy" else ()


def _words(n: int, seed: int) -> list[str]:
    """n distinct pronounceable pseudo-words, deterministic for a seed."""
    rng = random.Random(seed)
    seen: set[str] = set()
    out: list[str] = []
    while len(out) < n:
        w = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4)))
        if w not in seen:
            seen.add(w)
            out.append(w)
    return out


def train_tokenizer(out_dir: Path, vocab_words: int, seed: int = 0):
    """Train a word-level tokenizer on a synthetic Zipf corpus; write tokenizer.json. Returns it."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    words = _words(vocab_words, seed)
    rng = random.Random(seed + 1)
    # Zipf-ish frequencies: word i appears ~ 1/(i+1) as often; each word at least twice so
    # the trainer keeps all of them (min_frequency=1, vocab limited only by our word count).
    weights = [1.0 / (i + 1) for i in range(len(words))]
    corpus = [" ".join(words[i:i + 50]) for i in range(0, len(words), 50)] * 2
    corpus += [" ".join(rng.choices(words, weights=weights, k=64)) for _ in range(200)]
    tok = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    trainer = trainers.WordLevelTrainer(vocab_size=len(words) + len(SPECIAL_TOKENS), min_frequency=1,
                                        special_tokens=list(SPECIAL_TOKENS))
    tok.train_from_iterator(corpus, trainer=trainer)
    tok.save(str(out_dir / "tokenizer.json"))
    return tok


def _model_config(spec: TinyModelSpec, vocab_size: int, bos: int, eos: int) -> dict:
    arch_name, model_type, _ = ARCHITECTURES[spec.arch]
    common = {
        "architectures": [arch_name],  # without it vLLM may pick a headless model class
        "vocab_size": vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": spec.dtype,
        "bos_token_id": bos,
        "eos_token_id": eos,
        "pad_token_id": 1,
        "initializer_range": 0.02,
        "attention_bias": False,
        "use_cache": True,
    }
    if spec.arch == "llama":
        return {**common, "model_type": model_type, "intermediate_size": spec.intermediate_size,
                "mlp_bias": False}
    if spec.arch == "qwen2":
        return {**common, "model_type": model_type, "intermediate_size": spec.intermediate_size,
                "use_sliding_window": False, "sliding_window": None, "max_window_layers": spec.num_layers}
    return {**common, "model_type": model_type, "intermediate_size": spec.intermediate_size,
            "num_experts": spec.num_experts, "num_experts_per_tok": spec.experts_per_token,
            "moe_intermediate_size": spec.moe_intermediate_size, "decoder_sparse_step": 1,
            "mlp_only_layers": [], "norm_topk_prob": True, "router_aux_loss_coef": 0.0,
            "output_router_logits": False}


def _save_random_safetensors(path: Path, spec: TinyModelSpec) -> None:
    """Random weights in safetensors via transformers, so vLLM's real loader is exercised."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    torch.manual_seed(spec.seed)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path))
    model.to(getattr(torch, spec.dtype)).save_pretrained(path, safe_serialization=True)


def build_tiny_model(out_dir: Path | str, spec: TinyModelSpec = TinyModelSpec()) -> TinyModel:
    """Write config.json, tokenizer files, generation_config.json (and weights if asked) to out_dir."""
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(path, spec.vocab_words, spec.seed)
    vocab = tok.get_vocab()
    bos, eos = vocab["<s>"], vocab["</s>"]
    word_ids = sorted(i for w, i in vocab.items() if w not in SPECIAL_TOKENS)
    vocab_size = spec.vocab_size or -(-len(vocab) // 64) * 64  # pad the embedding like real models do
    (path / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>",
        "add_bos_token": False, "add_eos_token": False,
        "model_max_length": spec.max_position_embeddings,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
    }, indent=2))
    (path / "special_tokens_map.json").write_text(json.dumps({
        "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}, indent=2))
    (path / "config.json").write_text(json.dumps(_model_config(spec, vocab_size, bos, eos), indent=2))
    (path / "generation_config.json").write_text(json.dumps({
        "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": 1}, indent=2))
    (path / "perfgate_tiny_model.json").write_text(json.dumps(asdict(spec), indent=2))
    if spec.weights == "safetensors":
        _save_random_safetensors(path, spec)
    return TinyModel(path=path, spec=spec, vocab_size=vocab_size, word_ids=word_ids, eos_token_id=eos)


def word_ids_of(model_dir: Path | str) -> list[int]:
    """Ids of ordinary (non-special) tokens of any HF model dir's tokenizer.json, for random prompts.

    Works for a user's own model on GPU too; reads JSON only (no tokenizers import).
    """
    data = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    vocab = data["model"]["vocab"]
    special = {t["id"] for t in data.get("added_tokens", [])}
    if isinstance(vocab, dict):  # WordLevel, BPE, WordPiece
        ids = [i for i in vocab.values() if i not in special]
    else:  # Unigram: list of [piece, score]
        ids = [i for i in range(len(vocab)) if i not in special]
    return sorted(ids)

