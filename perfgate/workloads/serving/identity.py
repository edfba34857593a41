"""What a vLLM server serves, in a few words: the identity a serving baseline is valid for.

A serving test's id names the case (``test_concurrency_sweep[gpu-C=8]``), not the model: on a
GPU node the user picks it (``PERFGATE_SERVING_MODEL``, ``PERFGATE_SERVING_ENGINE_ARGS``). A
baseline of another model or other engine flags is another number, so the tests record this
identity (``perf.identify``) and the gate calls such a baseline ``not-comparable`` instead of
judging a 7B model a regressed 1.1 B one.

Only what sets the performance is in it: the model's shapes and dtype from its config.json
(not its path, name or the transformers version that wrote it, so a rebuilt or moved copy of
one model is the same workload) and the ``vllm serve`` flags, as flag/value pairs sorted by flag
(so ``--load-format dummy`` counts the same wherever on the command line it came from).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

# config.json keys, as "<label><value>"; absent keys are left out
_SHAPE = (("hidden_size", "h"), ("num_hidden_layers", "L"), ("num_attention_heads", "heads"),
          ("num_key_value_heads", "kv"), ("head_dim", "hd"), ("intermediate_size", "mlp"),
          ("vocab_size", "vocab"), ("num_experts", "experts"), ("num_local_experts", "experts"),
          ("n_routed_experts", "experts"), ("num_experts_per_tok", "top"), ("moe_intermediate_size", "moe-mlp"))


def describe_model(model_dir: Path | str) -> str:
    """``llama h2048 L22 heads32 kv4 hd64 mlp5632 vocab32064 bfloat16`` from a Hugging Face config.json."""
    path = Path(model_dir) / "config.json"
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: cannot read the model's config ({exc}); point the model variable at a "
                         f"Hugging Face model dir") from None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    words = [str(config.get("model_type") or text.get("model_type") or "?")]
    seen = set()
    for key, label in _SHAPE:
        value = text.get(key)
        if value is not None and label not in seen:
            seen.add(label)
            words.append(f"{label}{value}")
    dtype = text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or config.get("dtype")
    if dtype:
        words.append(str(dtype))
    return " ".join(words)


def canonical_flags(argv: Sequence[str]) -> str:
    """``vllm serve`` flags as ``--flag value`` pairs sorted by flag; a repeated flag keeps its last value."""
    pairs: dict[str, list[str]] = {}
    flag = None
    for token in argv:
        if token.startswith("-") and not _is_number(token):
            name, eq, value = token.partition("=")
            flag = name
            pairs[flag] = [value] if eq else []
        elif flag is not None:
            pairs[flag].append(token)
        else:
            pairs.setdefault("", []).append(token)  # a stray value before any flag: kept, in order
    return " ".join(" ".join([f, *v]).strip() for f, v in sorted(pairs.items()))


def _is_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def served_workload(model_dir: Path | str, engine_args: Sequence[str]) -> dict[str, str]:
    """The identity ``perf.identify`` records for a test against this server."""
    return {"model": describe_model(model_dir), "engine_args": canonical_flags(engine_args)}
