"""Tensor and data parallel serving against one GPU, same model (seed §11; 2 GPUs).

Seed (V100, 7B eager): TP=2 read -31 % output tok/s at C=1 and -16 % at C=32 with 3.2x the KV
tokens (a collective on every token, weights sharded so more memory is left for KV); DP=2 needs
load: nothing at C=32, +46 % at C=128 with DP=4. One server at a time (the GPUs): every
repetition on the 1-GPU dense server, then on the layout's. Recorded: output tok/s per C on
both and their ratio (median over repetitions), KV tokens of both and their ratio; asserted:
TP=2 has more KV tokens than TP=1. Not run yet: no 2-GPU machine was lent (docs/serving.md).
"""
from __future__ import annotations

import statistics

from fixtures.cases import parametrize
from fixtures.serving import serving_target
from perfgate.workloads import serving
from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.serving_metrics import summarize_run


@parametrize(serving.AREA, "parallel")
def test_parallel_serving(perf, case, server_pool, serving_models):
    layout = case.values
    p = layout.profile
    server_pool.max_alive = 1
    out = {}
    for name, variant, args in (("one_gpu", "", ()), (layout.name, layout.name, layout.engine_args)):
        target = serving_target(server_pool, serving_models, p, "dense", variant=variant, extra_args=args)
        if name != "one_gpu":
            perf.identify(**target.workload)
        tok_s = {}
        for c in layout.concurrency:
            n = max(p.min_requests, p.requests_per_slot * c)
            runs = []
            for rep in range(p.reps):
                reqs = random_requests(target.token_pool, n, p.input_len, p.output_len, seed=11000 + 10 * rep + c)
                result = run_load(target.load(reqs, max_concurrency=c, seed=rep))
                assert result.failed == 0, f"{target.label} C={c}: {result.errors()}"
                runs.append(summarize_run(result).output_throughput_tok_s)
            tok_s[c] = runs
            perf.record(f"c{c}_output_tok_s_{name}", runs, unit="tok/s", better="higher")
        out[name] = (tok_s, target.server.kv_cache_tokens())
    (one, kv_one), (par, kv_par) = out["one_gpu"], out[layout.name]
    for c in layout.concurrency:
        perf.record(f"c{c}_output_tok_s_{layout.name}_vs_one_gpu",
                    [statistics.median(par[c]) / statistics.median(one[c])], unit="x", better="higher")
    if kv_one and kv_par:
        if layout.tensor_parallel > 1:
            assert kv_par > kv_one, f"TP={layout.tensor_parallel} has {kv_par} KV tokens, not more than one GPU's {kv_one}"
        perf.record(f"kv_tokens_{layout.name}_vs_one_gpu", [kv_par / kv_one], unit="x", better="higher")
    perf.attach("kv_cache_tokens", {"one_gpu": kv_one, layout.name: kv_par})
