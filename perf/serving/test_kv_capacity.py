"""KV-cache capacity and preemption: a server with too few KV blocks against the default (seed §16.10).

Seed (V100, 7B): with 1 GiB of KV instead of 4 GiB, C=16 ran at 66 % of the throughput, with 4
preemptions in both runs, TPOT worse and TTFT slightly lower. Here the small server is the
session's default dense server with only ``kv_small_blocks`` KV blocks (``--num-gpu-blocks-override``:
on CPU ``VLLM_CPU_KVCACHE_SPACE`` counts whole GiB, 524 288 tokens of the tiny model, far more
than any load here); the profile's blocks hold one max-length request (fewer and vLLM refuses to
start: 16 blocks of 128 tokens read "estimated maximum model length is 1920", one block being
vLLM's null block), and the load (C=16 of 128-token prompts on CPU) needs two blocks per running
request, so the scheduler must preempt.
Both servers get the same requests at the same concurrency, alternating every repetition on CPU.

Gated: output tok/s small / default (paired by repetition). Recorded: TTFT and TPOT medians of
both, their ratios, and the preemptions per request of the small server. Asserted: the small
server preempted (vllm:num_preemptions from /metrics rose), the default one did not: preemptions
appear only where capacity is short.
"""
from __future__ import annotations

import pytest

from perfgate.judge.metrics import paired_ratio
from perfgate.workloads import serving
from perfgate.workloads.serving.loadgen import random_requests, run_load
from perfgate.workloads.serving.prometheus_counters import preemptions
from perfgate.workloads.serving.serving_metrics import summarize_run
from perfgate.workloads.serving.starvation import skip_reason, starved, unstarved_runs

SERVERS = ("default", "small")


def test_small_kv_cache_preempts(perf, small_kv_servers):
    get_server, side_by_side = small_kv_servers
    servers = {}

    def get(name: str):
        target = get_server(name == "small")
        servers.setdefault(name, target)
        return target

    default = get("default")
    p = default.profile
    perf.identify(**default.workload)  # the small server differs only by --num-gpu-blocks-override

    def phase(name: str, rep: int) -> dict:
        target = get(name)
        reqs = random_requests(target.token_pool, p.kv_requests, p.input_len, p.output_len, seed=12000 + rep)
        before = preemptions(target.base_url)
        result = run_load(target.load(reqs, max_concurrency=p.kv_concurrency, seed=rep))
        assert result.failed == 0, f"{target.label}: {result.failed} failed requests: {result.errors()}"
        return {"summary": summarize_run(result),
                "preemptions": preemptions(target.base_url) - before}

    def repetition(rep: int, names=SERVERS) -> dict:
        order = names if rep % 2 == 0 else names[::-1]
        phases = {name: phase(name, rep) for name in order}
        return {"rep": rep, "order": order, "phases": phases,
                "starved": starved(*(x["summary"].tpot_ms.median for x in phases.values()))}

    if side_by_side:
        kept, every = unstarved_runs(repetition, lambda r: r["starved"], wanted=p.reps, extra=p.reps)
    else:  # one server at a time: every repetition on the default one, then on the small one
        runs = {n: unstarved_runs(lambda rep, n=n: repetition(rep, (n,)), lambda r: r["starved"], wanted=p.reps,
                                  extra=p.reps) for n in SERVERS}
        every = runs["default"][1] + runs["small"][1]
        kept = [{"phases": {**a["phases"], **b["phases"]}} for a, b in zip(runs["default"][0], runs["small"][0])]
    preempted = {n: sum(r["phases"][n]["preemptions"] for r in every if n in r["phases"]) for n in SERVERS}
    perf.attach("runs", [{"rep": r["rep"], "order": r["order"], "starved": r["starved"],
                          "phases": {n: {"summary": x["summary"].to_dict(), "preemptions": x["preemptions"]}
                                     for n, x in r["phases"].items()}} for r in every])
    perf.attach("kv_cache_tokens", {n: t.server.kv_cache_tokens() for n, t in servers.items()})
    perf.attach("quiet_waits", get_server.waits)  # before each switch of server (fixtures.serving.QuietSwitch)
    assert preempted["default"] == 0, (f"the default server ({servers['default'].server.kv_cache_tokens()} KV "
                                       f"tokens) preempted {preempted['default']:.0f} requests: its capacity is "
                                       f"short too, so the comparison says nothing")
    assert preempted["small"] > 0, (f"the server with {p.kv_small_blocks} KV blocks preempted nothing at "
                                    f"C={p.kv_concurrency}: the load did not outgrow its cache")
    if not kept:
        pytest.skip(skip_reason(len(every), "median TPOT ~0"))

    def per_rep(name: str, figure) -> list[float]:
        return [figure(r["phases"][name]["summary"]) for r in kept]

    tok_s = {n: per_rep(n, lambda s: s.output_throughput_tok_s) for n in SERVERS}
    ttft = {n: per_rep(n, lambda s: s.ttft_ms.median) for n in SERVERS}
    tpot = {n: per_rep(n, lambda s: s.tpot_ms.median) for n in SERVERS}
    mix = serving.mix_ratio(p)
    perf.record("output_tok_s_small_vs_default", paired_ratio(tok_s["small"], tok_s["default"]), unit="x",
                better="higher", **mix)
    perf.record("ttft_small_vs_default", paired_ratio(ttft["small"], ttft["default"]), unit="x", better="lower",
                **mix)
    perf.record("tpot_small_vs_default", paired_ratio(tpot["small"], tpot["default"]), unit="x", better="lower",
                **mix)
    for n in SERVERS:
        perf.record(f"output_tok_s_{n}", tok_s[n], unit="tok/s", better="higher")
        perf.record(f"ttft_ms_{n}", ttft[n], unit="ms", better="lower")
        perf.record(f"tpot_ms_{n}", tpot[n], unit="ms", better="lower")
    perf.record("small_preemptions_per_request", [r["phases"]["small"]["preemptions"] / p.kv_requests for r in kept],
                unit="x", better="lower")
