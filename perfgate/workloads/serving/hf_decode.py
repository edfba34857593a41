"""A reference external decode command: greedy decoding with Hugging Face transformers.

    python -m perfgate.workloads.serving.hf_decode --model DIR -n 32 -r 5 -o json

prints llama-bench's JSON format (one text-generation entry with per-repetition
``samples_ts``), so the decode-command adapter is exercised on every machine by a real
decode loop even where llama.cpp is not installed, and llama-bench can replace it by
changing one line of configuration. Every generated token is forced (min_new_tokens), like
llama-bench's tg test. A model dir without weights (served with --load-format dummy) gets
random weights from its config.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="Hugging Face model dir")
    ap.add_argument("-n", "--n-gen", type=int, default=32, help="tokens to generate per repetition")
    ap.add_argument("-p", "--n-prompt", type=int, default=8, help="prompt tokens before decoding")
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("-o", "--output", choices=("json", "md"), default="json")
    args = ap.parse_args(argv)

    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    if args.threads:
        torch.set_num_threads(args.threads)
    path = Path(args.model)
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    torch.manual_seed(0)
    if has_weights:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(path), dtype=torch.float32)
    model.eval()
    vocab = model.config.vocab_size
    prompt = torch.randint(16, min(vocab, 4000), (1, args.n_prompt))
    gen = dict(max_new_tokens=args.n_gen, min_new_tokens=args.n_gen, do_sample=False,
               pad_token_id=model.config.pad_token_id or 0)
    with torch.inference_mode():
        model.generate(prompt, **{**gen, "max_new_tokens": 4, "min_new_tokens": 4})  # warm-up
        samples_ns = []
        for _ in range(args.repetitions):
            t0 = time.perf_counter_ns()
            out = model.generate(prompt, **gen)
            samples_ns.append(time.perf_counter_ns() - t0)
            assert out.shape[1] == args.n_prompt + args.n_gen, out.shape
    samples_ts = [args.n_gen / (ns / 1e9) for ns in samples_ns]
    entry = {
        "backends": "transformers-" + ("cuda" if torch.cuda.is_available() else "cpu"),
        "model_filename": str(path), "model_type": model.config.model_type,
        "n_threads": torch.get_num_threads(), "n_prompt": 0, "n_gen": args.n_gen,
        "avg_ns": int(statistics.mean(samples_ns)), "avg_ts": statistics.mean(samples_ts),
        "stddev_ts": statistics.stdev(samples_ts) if len(samples_ts) > 1 else 0.0,
        "samples_ns": samples_ns, "samples_ts": [round(x, 3) for x in samples_ts],
    }
    if args.output == "json":
        json.dump([entry], sys.stdout, indent=2)
        print()
    else:
        print(f"| model | test | t/s |\n| --- | --- | ---: |\n"
              f"| {entry['model_type']} | tg{args.n_gen} | {entry['avg_ts']:.2f} ± {entry['stddev_ts']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
