"""The seed report's 8x V100 PCIe numbers, typed in by hand, each with its section.

Source: ../shared/seeds/000_e59bb1ebc4641494.txt ("8x V100 大模型并行训练与推理框架实测报告",
experiments 2026-07-15..17, 8x Tesla V100-PCIE-32GB, no NVLink). ``perfgate import-seed``
writes these into ``baselines/8xV100-PCIE-32GB-PCIe/<area>.json`` with provenance
``imported: seed report 000 (8x V100 PCIe), §X.Y``, so a user with that machine is
compared against the report on the first run.

Rules followed here:
- Only numbers the report states (a table cell, or a percentage in the text, which becomes
  a ratio: "-1.83 %" -> 0.9817). Nothing derived by us from two cells.
- Only where the statistic matches the test's metric: throughputs, step times, bus
  bandwidths, memory, stated ratios. Latency means and p95s are not imported (our latency
  metrics summarise per-request samples by their median). NOT_IMPORTED lists the rest.
- ``n`` is the number of runs the report averaged for that number: 3 for the main NCCL,
  DDP, FSDP and Megatron results and the DDP micro-batch and Megatron long-sequence
  supplements (§2), 2 for the Poisson points (§12.2), 1 where one round is reported
  (vLLM §10: the second, steady round) or the report does not say (§4.7).
"""
from __future__ import annotations

from dataclasses import dataclass

SEED = "seed report 000 (8x V100 PCIe)"
SEED_FILE = "shared/seeds/000_e59bb1ebc4641494.txt"
HARDWARE_ID = "8xV100-PCIE-32GB-PCIe"
WHEN = "2026-07-17"  # last day of the experiments (report header)

COLL = "perf/collectives/test_collectives.py"
DDP = "perf/training/test_ddp.py"
FSDP = "perf/training/test_fsdp.py"
MEGATRON = "perf/training/test_megatron.py"
SERVING_C = "perf/serving/test_concurrency_sweep.py"
SERVING_RATE = "perf/serving/test_poisson_goodput.py"  # expected name; see the lead's reconciliation list


@dataclass(frozen=True)
class SeedNumber:
    test_id: str
    metric: str
    value: float
    unit: str
    better: str
    section: str   # "§4.4"
    n: int         # runs the report averaged
    what: str      # the report's own words for the cell, for the reviewer

    @property
    def provenance(self) -> str:
        return f"imported: {SEED}, {self.section}"

    @property
    def source(self) -> str:
        return f"seed 000 {self.section}: {self.what}"


def _n(test_id, metric, value, unit, better, section, n, what) -> SeedNumber:
    return SeedNumber(test_id, metric, float(value), unit, better, section, n, what)


# -- §4.4 AllReduce and §4.7 AllGather / ReduceScatter / SendRecv, by placement ------------------
# Pair placements map to test ids with the link class (PIX (0,1), PHB (0,2), SYS (0,4));
# "4 卡 NUMA 0" is GPUs 0-3, which is what nccl-4gpu runs on.

def _collectives() -> list[SeedNumber]:
    out = []
    allreduce_44 = [  # placement id, 1 KiB latency us, 256 MiB busbw GB/s, row label
        ("nccl-2gpu-PIX", 15.06, 11.74, "2 卡 PIX (0,1)"),
        ("nccl-2gpu-PHB", 14.97, 7.07, "2 卡 PHB (0,2)"),
        ("nccl-2gpu-SYS", 14.79, 6.93, "2 卡 SYS (0,4)"),
        ("nccl-4gpu", 21.92, 7.38, "4 卡 NUMA 0"),
        ("nccl-8gpu", 48.65, 7.60, "8 卡 auto"),
    ]
    for place, lat, busbw, row in allreduce_44:
        out.append(_n(f"{COLL}::test_all_reduce[{place}-1KiB]", "time_us", lat, "us", "lower", "§4.4", 3,
                      f"AllReduce {row}, 1 KiB latency (us), nccl-tests"))
        out.append(_n(f"{COLL}::test_all_reduce[{place}-256MiB]", "busbw_gbps", busbw, "GB/s", "higher", "§4.4", 3,
                      f"AllReduce {row}, 256 MiB bus BW (GB/s), nccl-tests"))
    primitives_47 = {  # op: (PIX, PHB, SYS, 8 GPU) 256 MiB busbw, 8 GPU 1 KiB latency, report name
        "all_gather": ((11.66, 6.23, 6.08, 7.45), 58.86, "AllGather"),
        "reduce_scatter": ((9.47, 6.14, 6.07, 7.45), 59.40, "ReduceScatter"),
        "send_recv": ((12.16, 8.43, 8.10, 6.91), 62.91, "SendRecv"),
    }
    for op, (bws, lat8, name) in primitives_47.items():
        for place, bw, col in zip(("nccl-2gpu-PIX", "nccl-2gpu-PHB", "nccl-2gpu-SYS", "nccl-8gpu"), bws,
                                  ("PIX", "PHB", "SYS", "8 卡")):
            out.append(_n(f"{COLL}::test_{op}[{place}-256MiB]", "busbw_gbps", bw, "GB/s", "higher", "§4.7", 1,
                          f"{name} {col} 256 MiB bus BW (GB/s), nccl-tests; repeats not stated"))
        out.append(_n(f"{COLL}::test_{op}[nccl-8gpu-1KiB]", "time_us", lat8, "us", "lower", "§4.7", 1,
                      f"{name} 8 卡 1 KiB latency (us), nccl-tests; repeats not stated"))
    return out


# -- §5 DDP: strong (§5.3), weak (§5.4), bucket (§5.5), micro-batch (§5.7); 110M GPT -------------

def _ddp() -> list[SeedNumber]:
    out = []
    strong_53 = {2: (52_145, 0.1572, 2.19, 1.095), 4: (57_838, 0.1416, 2.43, 0.607), 8: (67_180, 0.1219, 2.82, 0.353)}
    for w, (tok, step_s, sp, eff) in strong_53.items():
        tid = f"{DDP}::test_ddp_strong_scaling[nccl-{w}rank-gpt-110m]"
        row = f"强扩展 {w} GPU (global batch 16)"
        out += [_n(tid, "tokens_per_s", tok, "tok/s", "higher", "§5.3", 3, f"{row}, token/s"),
                _n(tid, "step_ms", step_s * 1000, "ms", "lower", "§5.3", 3, f"{row}, Step {step_s} s"),
                _n(tid, "speedup_x", sp, "x", "higher", "§5.3", 3, f"{row}, Speedup {sp}x"),
                _n(tid, "scaling_efficiency", eff, "fraction", "higher", "§5.3", 3, f"{row}, 效率 {eff:.1%}")]
    weak_54 = {2: (32_875, 0.517), 4: (37_370, 0.294), 8: (67_377, 0.265)}
    for w, (tok, eff) in weak_54.items():
        tid = f"{DDP}::test_ddp_weak_scaling[nccl-{w}rank-gpt-110m]"
        row = f"弱扩展 {w} GPU (local batch 2)"
        out += [_n(tid, "tokens_per_s", tok, "tok/s", "higher", "§5.4", 3, f"{row}, aggregate token/s"),
                _n(tid, "weak_scaling_efficiency", eff, "fraction", "higher", "§5.4", 3,
                   f"{row}, 弱扩展效率 {eff:.1%}")]
    out.append(_n(f"{DDP}::test_ddp_weak_scaling[nccl-8rank-gpt-110m]", "step_ms", 121.6, "ms", "lower", "§5.4", 3,
                  "弱扩展: 8 卡 step 从 32.2 ms 增到 121.6 ms"))
    bucket_55 = {"bucket4MiB": (65_950, -1.83), "bucket25MiB": (67_180, None), "bucket100MiB": (65_752, -2.13)}
    for case, (tok, rel_pct) in bucket_55.items():
        tid = f"{DDP}::test_ddp_bucket_cap[nccl-8rank-gpt-110m-{case}]"
        out.append(_n(tid, "tokens_per_s", tok, "tok/s", "higher", "§5.5", 3, f"Bucket {case[6:]}, 8 卡 token/s"))
        if rel_pct is not None:
            out.append(_n(tid, "tokens_per_s_vs_bucket25MiB_x", 1 + rel_pct / 100, "x", "higher", "§5.5", 3,
                          f"Bucket {case[6:]}, 相对 25 MiB {rel_pct:+.2f}%"))
    micro_57 = {  # mb: (1 GPU tok/s, 8 GPU tok/s, 1->8 speedup, weak eff, 8 GPU peak GiB)
        1: (13_553, 34_589, 2.55, 0.319, 2.23), 2: (27_564, 67_306, 2.44, 0.305, 2.58),
        4: (44_285, 126_696, 2.86, 0.358, 3.25), 8: (55_566, 227_430, 4.09, 0.512, 4.63),
    }
    for mb, (tok1, tok8, sp, eff, peak) in micro_57.items():
        t1 = f"{DDP}::test_ddp_microbatch[nccl-1rank-gpt-110m-mb{mb}]"
        t8 = f"{DDP}::test_ddp_microbatch[nccl-8rank-gpt-110m-mb{mb}]"
        row = f"Microbatch/GPU {mb}"
        out += [_n(t1, "tokens_per_s", tok1, "tok/s", "higher", "§5.7", 3, f"{row}, 1 GPU token/s"),
                _n(t8, "tokens_per_s", tok8, "tok/s", "higher", "§5.7", 3, f"{row}, 8 GPU token/s"),
                _n(t8, "speedup_x", sp, "x", "higher", "§5.7", 3, f"{row}, 1->8 speedup {sp}x"),
                _n(t8, "weak_scaling_efficiency", eff, "fraction", "higher", "§5.7", 3,
                   f"{row}, 弱扩展效率 {eff:.1%}"),
                _n(t8, "peak_alloc_gib", peak, "GiB", "lower", "§5.7", 3, f"{row}, 8 GPU peak memory {peak} GiB")]
    return out


# -- §6.2 FSDP modes (368M GPT, 8 GPUs, micro-batch 1; FSDP reduces in fp16) ----------------------

def _fsdp() -> list[SeedNumber]:
    out = []
    modes_62 = {  # our mode label: (token/s, step s, GPU allocated GiB, report row)
        "ddp-fp32reduce": (5_274, 0.3883, 6.49, "DDP FP32 comm"),
        "ddp-fp16reduce": (8_280, 0.2474, 6.49, "DDP FP16 comm"),
        "fsdp1-SHARD_GRAD_OP-fp16reduce": (10_009, 0.2046, 1.55, "SHARD_GRAD_OP"),
        "fsdp1-FULL_SHARD-fp16reduce": (7_704, 0.2659, 1.06, "FULL_SHARD"),
    }
    for label, (tok, step_s, alloc, row) in modes_62.items():
        tid = f"{FSDP}::test_fsdp_throughput[nccl-8rank-gpt-368m-{label}]"
        out += [_n(tid, "tokens_per_s", tok, "tok/s", "higher", "§6.2", 3, f"{row}, token/s"),
                _n(tid, "step_ms", step_s * 1000, "ms", "lower", "§6.2", 3, f"{row}, Step {step_s} s"),
                _n(tid, "peak_alloc_gib", alloc, "GiB", "lower", "§6.2", 3, f"{row}, GPU allocated {alloc} GiB")]
    ratios_63 = [  # stated in §6.3 against the DDP mode with the same reduce dtype
        ("ddp-fp16reduce", "throughput_vs_ddp_fp32_x", 1.570,
         "只改变 DDP 梯度通信精度，就把吞吐提高 57.0%"),
        ("fsdp1-SHARD_GRAD_OP-fp16reduce", "throughput_vs_ddp_x", 1.209,
         "SHARD_GRAD_OP 相对 FP16-comm DDP 仍快约 20.9%"),
        ("fsdp1-FULL_SHARD-fp16reduce", "throughput_vs_ddp_x", 0.930, "FULL_SHARD 只比 FP16-comm DDP 慢约 7.0%"),
    ]
    for label, metric, value, what in ratios_63:
        out.append(_n(f"{FSDP}::test_fsdp_throughput[nccl-8rank-gpt-368m-{label}]", metric, value, "x", "higher",
                      "§6.3", 3, what))
    return out


# -- §7 Megatron-Core TP/SP (§7.2, §7.3) and long-sequence recompute (§7.5), 8 GPUs --------------

def _megatron_tp() -> list[SeedNumber]:
    out = []
    tid = f"{MEGATRON}::test_megatron_tp_sp[8gpu-seq512]"
    cases_72 = {  # metric tag: (token/s, peak allocated GiB, row)
        "tp1_dp8_sp_off": (84_626, 2.85, "TP1 DP8 SP off"), "tp2_dp4_sp_off": (51_322, 1.61, "TP2 DP4 SP off"),
        "tp2_dp4_sp_on": (43_155, 1.56, "TP2 DP4 SP on"), "tp4_dp2_sp_off": (29_053, 0.88, "TP4 DP2 SP off"),
        "tp4_dp2_sp_on": (23_455, 0.80, "TP4 DP2 SP on"), "tp8_dp1_sp_off": (14_667, 0.47, "TP8 DP1 SP off"),
    }
    for tag, (tok, alloc, row) in cases_72.items():
        out += [_n(tid, f"{tag}_tokens_per_s", tok, "tok/s", "higher", "§7.2", 3, f"{row}, token/s"),
                _n(tid, f"{tag}_peak_alloc_gib", alloc, "GiB", "lower", "§7.2", 3, f"{row}, Peak allocated/GPU")]
    for tp, rel in ((2, 0.606), (4, 0.343), (8, 0.173)):
        out.append(_n(tid, f"tp{tp}_vs_tp1_throughput", rel, "x", "higher", "§7.2", 3,
                      f"TP{tp} SP off, 相对 TP1 {rel:.1%}"))
    for tp, mem, loss in ((2, 0.030, 0.159), (4, 0.093, 0.193)):
        out += [_n(tid, f"tp{tp}_sp_memory_saving", mem, "fraction", "higher", "§7.3", 3,
                   f"SP 在 TP={tp} 时再省 {mem:.1%} allocated memory"),
                _n(tid, f"tp{tp}_sp_throughput_ratio", 1 - loss, "x", "higher", "§7.3", 3,
                   f"SP 在 TP={tp} 时损失 {loss:.1%} 吞吐")]
    rc = f"{MEGATRON}::test_megatron_recompute[8gpu-tp2-seq4096]"
    # TP2 seq 4096, SP off/on: (baseline GiB, recompute GiB, baseline tok/s, recompute tok/s, saved, cost)
    recompute_75 = {
        "off": (26.28, 5.77, 54_134, 38_040, 0.781, 0.297),
        "on": (25.95, 5.68, 52_125, 36_876, 0.781, 0.293),
    }
    for sp, (mem0, mem1, tok0, tok1, saved, cost) in recompute_75.items():
        row = f"TP2 SP {sp} seq=4096"
        for rcs, mem, tok in (("off", mem0, tok0), ("on", mem1, tok1)):
            tag = f"tp2_dp4_sp_{sp}_recompute_{rcs}"
            which = "Recompute" if rcs == "on" else "Baseline"
            out += [_n(rc, f"{tag}_tokens_per_s", tok, "tok/s", "higher", "§7.5", 3, f"{row}, {which} token/s"),
                    _n(rc, f"{tag}_peak_alloc_gib", mem, "GiB", "lower", "§7.5", 3, f"{row}, {which} memory")]
        out += [_n(rc, f"recompute_memory_saving_sp_{sp}", saved, "fraction", "higher", "§7.5", 3,
                   f"{row}, Memory saved {saved:.1%}"),
                _n(rc, f"recompute_throughput_ratio_sp_{sp}", 1 - cost, "x", "higher", "§7.5", 3,
                   f"{row}, Throughput cost {cost:.1%}")]
    out.append(_n(rc, "sp_memory_saving_long_seq", 0.013, "fraction", "higher", "§7.5", 3,
                  "SP 结果 TP2 seq 4096, SP memory saving 1.3%"))
    return out


# -- §8 Megatron-Core 1F1B pipeline (163M GPT, TP=1, DP=1, micro-batch 2) -------------------------

def _megatron_pp() -> list[SeedNumber]:
    out = []
    pp_83 = {  # (PP, M): (token/s, speedup over PP1 at the same M)
        (2, 1): (11_304, 0.95), (4, 1): (10_456, 0.88), (8, 1): (9_627, 0.81),
        (2, 4): (18_211, 1.24), (4, 4): (20_916, 1.43), (8, 4): (25_137, 1.72),
        (2, 16): (19_912, 1.22), (4, 16): (27_128, 1.66), (8, 16): (42_522, 2.59),
    }
    imbalance_84 = {2: 1.00, 4: 1.88, 8: 2.76}
    for (pp, m), (tok, sp) in pp_83.items():
        tid = f"{MEGATRON}::test_megatron_pipeline_bubble[megatron-1f1b-nccl-pp{pp}-m{m}]"
        out += [_n(tid, "tokens_per_s", tok, "tok/s", "higher", "§8.3", 3, f"PP={pp} M={m}, token/s"),
                _n(tid, "speedup_vs_pp1", sp, "x", "higher", "§8.3", 3, f"PP={pp} M={m}, 相对 PP1 speedup {sp}x"),
                _n(tid, "stage_param_imbalance", imbalance_84[pp], "x", "lower", "§8.4", 1,
                   f"PP={pp} stage 参数 Max/Min {imbalance_84[pp]}x (a property of the split, not averaged)")]
    return out


# -- §10 vLLM continuous batching (7B dummy, TP1) and §12.2 Poisson goodput ----------------------

def _serving() -> list[SeedNumber]:
    out = []
    # Our GPU profile starts `vllm serve` without --enforce-eager, i.e. vLLM's default
    # compile + CUDA graph path: the §10.3 "Compiled" column is the matching number.
    compiled_103 = {1: 41.3, 4: 148.9, 16: 511.9, 32: 699.9}
    for c, tok in compiled_103.items():
        out.append(_n(f"{SERVING_C}::test_concurrency_sweep[gpu-C={c}]", "output_tok_s", tok, "tok/s", "higher",
                      "§10.3", 1, f"C={c}, Compiled output tok/s (7B dummy, input 128, output 32)"))
    poisson_122 = {2: (1.94, 1.94), 5: (4.65, 4.65), 10: (8.63, 5.06), 15: (11.93, 4.38), 20: (14.41, 1.13),
                   25: (16.46, 0.40)}
    for qps, (done, good) in poisson_122.items():
        tid = f"{SERVING_RATE}::test_poisson_goodput[gpu-{qps}qps]"
        out += [_n(tid, "request_rps", done, "req/s", "higher", "§12.2", 2,
                   f"Offered {qps} QPS (Poisson), Completed request/s"),
                _n(tid, "goodput_rps", good, "req/s", "higher", "§12.2", 2,
                   f"Offered {qps} QPS (Poisson), SLO goodput (TTFT<250 ms and TPOT<40 ms)")]
    return out


NUMBERS: tuple[SeedNumber, ...] = tuple(_collectives() + _ddp() + _fsdp() + _megatron_tp() + _megatron_pp()
                                        + _serving())

# What the report measured that no test of ours measures the same way (reviewer's list).
NOT_IMPORTED: tuple[tuple[str, str], ...] = (
    ("§4.4", "256 MiB algorithm bandwidth: our tests record bus bandwidth and time; algbw is attached only"),
    ("§4.4", "4 卡跨 NUMA and 8 卡 Ring/Tree rows: no test pins GPUs across NUMA or forces NCCL_ALGO"),
    ("§5.3/§5.4", "1-GPU reference rows: world 1 is measured inside the scaling tests, not recorded as a test"),
    ("§5.7", "profiler step times and NCCL kernel totals: single profiled steps of rank 0, not our step_ms"),
    ("§6.2", "Host RSS/rank: attached as rss_mib, not a metric"),
    ("§6.3", "memory savings vs fp32 DDP (76.1 %, 83.7 %): our saving metrics compare with DDP of the same reduce "
             "dtype, and memory tests id modes without the dtype"),
    ("§7.5", "SP table at seq 2048/4096 for TP4, and TP4 recompute: our tests run TP/SP at seq 512 and recompute "
             "at TP2 only"),
    ("§8.3", "PP=1 rows and the theoretical bubble: PP=1 is the in-session reference, theory is not a measurement"),
    ("§9", "engine init, KV capacity, real-weights smoke test: no test records them"),
    ("§10.2", "eager-mode table (request/s, total token/s, TTFT, TPOT): our GPU profile serves compiled; the "
              "latencies are means while our metrics are medians of per-request values"),
    ("§10.4, §11, §12.1", "long prefill, TP/DP replicas, prefix cache: no matching GPU test ids yet"),
    ("§12.2", "P95 TTFT/TPOT: our metrics summarise per-request samples by their median"),
)

# The machine as §3 describes it, in the shape of perfgate.hardware.fingerprint().
_PIX = {(0, 1), (2, 3), (4, 5), (6, 7)}


def _link(i: int, j: int) -> str:
    if i == j:
        return "X"
    if (min(i, j), max(i, j)) in _PIX:
        return "PIX"
    return "PHB" if (i < 4) == (j < 4) else "SYS"


FINGERPRINT = {
    "gpus": [{"index": i, "name": "Tesla V100-PCIE-32GB", "memory_gib": 32.0, "pci_bus_id": None} for i in range(8)],
    "links": [[_link(i, j) for j in range(8)] for i in range(8)],
    "cpu": {"model": "2x Intel Xeon E5-2680 v4", "cores": 33, "numa_nodes": 2, "arch": "x86_64"},
    "disks": [],
    "hostname": None,
    "software": {"python": "3.10.12", "torch": "2.5.0a0+nv24.10", "nccl": "2.22.3", "driver": "580.159.03",
                 "cuda_driver": "13.0", "cuda_toolkit": "12.6.77", "megatron_core": "0.9.0", "vllm": "0.19.1",
                 "perfgate": None},
    "source": f"{SEED} §3.1-§3.3",
}

SOFTWARE_BY_AREA = {
    "collectives": {"nccl": "2.22.3", "driver": "580.159.03", "cuda_toolkit": "12.6.77", "tool": "nccl-tests"},
    "training": {"torch": "2.5.0a0+nv24.10", "nccl": "2.22.3", "driver": "580.159.03", "cuda_toolkit": "12.6.77",
                 "megatron_core": "0.9.0", "python": "3.10.12"},
    "serving": {"vllm": "0.19.1", "torch": "2.10.0+cu128", "cuda_runtime": "12.8", "driver": "580.159.03"},
}
