"""The MoE all-to-all area and the NCCL tuner crossover area: routing, specs, the reduces' invariants
and metrics on hand-made per-rank results, one real in-process MoE step (world 1, gloo), and the
tuner's gate on synthetic numbers (no GPU here): a planted bad default must read ``regression``."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
import torch

from perfgate import mutations
from perfgate.judge import gate
from perfgate.judge.baseline_choice import Choice
from perfgate.store.settings import load_settings
from perfgate.judge.metrics import Metric, summarize
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.workloads import moe
from perfgate.workloads.area import CheckFailed, Measured
from perfgate.workloads.collectives import tuner
from perfgate.workloads.moe import routing, step

ROOT = Path(__file__).resolve().parents[1]


def _route(name, *, tokens=4096, k=2, experts=8, per_rank=2, rank=0, seed=0):
    return routing.route(torch, name, tokens=tokens, k=k, experts=experts, experts_per_rank=per_rank, rank=rank,
                         seed=seed)


@pytest.fixture
def no_mutation(monkeypatch):
    monkeypatch.delenv(mutations.ENV, raising=False)


# -- routing --------------------------------------------------------------------------------------

def test_balanced_routing_gives_every_expert_exactly_its_share(no_mutation):
    for rank in range(4):
        r = _route("balanced", tokens=512, rank=rank)
        assert torch.bincount(r.experts.reshape(-1), minlength=8).tolist() == [128] * 8
        assert all(len(set(row)) == 2 for row in r.experts.tolist())  # top-k: k distinct experts


def test_skewed_routings_are_seeded_distinct_and_exact(no_mutation):
    hot = _route("hot0.5")
    counts = torch.bincount(hot.experts.reshape(-1), minlength=8)
    assert 0.70 < counts[0].item() / 4096 < 0.85  # ~77 % of tokens pick the hot expert (top-2 of 8)
    assert all(len(set(row)) == 2 for row in hot.experts.tolist())
    zipf = torch.bincount(_route("zipf1.2").experts.reshape(-1), minlength=8)
    assert zipf.argmax().item() == 0 and zipf[2].item() > zipf[1].item()  # popularity round-robin over ranks
    assert torch.equal(_route("uniform", rank=1).experts, _route("uniform", rank=1).experts)
    assert not torch.equal(_route("uniform", rank=1).experts, _route("uniform", rank=2).experts)
    gates = _route("uniform").weights
    assert torch.equal(gates * 8, (gates * 8).round()) and gates.min() >= 0.125 and gates.max() <= 1.0


def test_unknown_distribution_is_refused():
    for bad in ("zipf", "hot1.5", "skewed"):
        with pytest.raises(routing.RoutingError, match="balanced, uniform, zipf<s>"):
            routing.check_distribution(bad)


def test_hot_expert_mutation_routes_only_the_uniform_case(monkeypatch):
    monkeypatch.setenv(mutations.ENV, "moe_hot_expert")
    assert routing.effective("uniform") == routing.PLANTED_HOT
    assert routing.effective("zipf1.2") == "zipf1.2" and routing.effective("balanced") == "balanced"
    assert torch.equal(_route("uniform").experts, _route(routing.PLANTED_HOT).experts)


def test_spec_refuses_what_cannot_be_checked_exactly():
    with pytest.raises(ValueError, match="would not be exact in float32"):
        step.MoESpec(world=2, distributions=("balanced", "uniform"), hidden=4096, ffn=4096)
    with pytest.raises(ValueError, match="divisible by the 8 experts"):
        step.MoESpec(world=4, distributions=("balanced",), tokens=510)
    with pytest.raises(ValueError, match="must start with the reference"):
        step.MoESpec(world=2, distributions=("uniform",))


# -- one real step, world 1 (in process) ------------------------------------------------------------

class _Ctx:
    rank, world_size, device = 0, 1, torch.device("cpu")

    def phase(self, text):
        pass


def test_a_real_step_matches_the_reference_without_communication(tmp_path, no_mutation):
    import torch.distributed as dist

    spec = step.MoESpec(world=1, distributions=("balanced", "uniform", "hot0.5"), tokens=64, hidden=32, ffn=64,
                        k=2, experts_per_rank=4, warmup_steps=0, measured_steps=5)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1,
                            timeout=timedelta(seconds=30))
    try:
        out = step.run(spec, _Ctx())
    finally:
        dist.destroy_process_group()
    for name, r in out.items():
        assert r["wrong"] == 0 and sum(r["sent_per_expert"]) == 64 * 2 == sum(r["received_per_local_expert"])
        assert len(r["step_ms"]) == 5 and all(t > 0 for t in r["step_ms"])


# -- the reduce on hand-made results --------------------------------------------------------------

def _moe_case(distribution="hot0.5", world=2):
    return next(c for c in moe.AREA.all_cases() if c.values.distribution == distribution
                and c.values.backend == "gloo" and c.values.spec.world == world)


def _moe_rank(spec, received, *, expert_ms, combine_ms, step_ms, wrong=0):
    sent = [spec.tokens * spec.k // spec.experts] * spec.experts  # what each rank sends: balanced
    n = len(step_ms)
    return {"permute_ms": [0.1] * n, "dispatch_ms": [1.0] * n, "expert_ms": expert_ms, "expert_work_ms": expert_ms,
            "combine_ms": combine_ms, "unpermute_ms": [0.1] * n, "step_ms": step_ms, "wrong": wrong,
            "sent_per_expert": sent, "received_per_local_expert": received, "routed_as": "x"}


def _launch(case, *, hot_wrong=0, hot_received=None):
    spec = case.values.spec
    share = spec.tokens * spec.k // spec.experts * spec.world   # slots per expert, every rank's summed
    even = [[share] * spec.experts_per_rank for _ in range(spec.world)]
    per_rank = []
    for rank in range(spec.world):
        r = {d: _moe_rank(spec, even[rank], expert_ms=[10.0, 10.0], combine_ms=[2.0, 2.0], step_ms=[20.0, 22.0])
             for d in spec.distributions}
        r["hot0.5"] = _moe_rank(spec, (hot_received or even)[rank], expert_ms=[30.0 if rank == 0 else 10.0] * 2,
                                combine_ms=[1.0 if rank == 0 else 21.0] * 2, step_ms=[40.0, 33.0], wrong=hot_wrong)
        per_rank.append(r)
    return per_rank


def test_moe_reduce_pairs_steps_and_measures_the_wait_in_the_combine():
    case = _moe_case()
    out = {r.name: r for r in moe.reduce(case, _launch(case))}
    assert out["step_over_balanced"].samples == [2.0, 1.5] and out["step_over_uniform"].samples == [2.0, 1.5]
    assert out["expert_slowest_over_fastest"].samples == [3.0, 3.0]
    assert out["combine_wait_share"].samples == [pytest.approx(20.0 / 22.0)] * 2   # rank 1 waited 20 of 21 ms
    assert out["combine_rank1"].samples == [21.0, 21.0] and out["dispatch_rank0"].unit == "ms"
    assert out["tokens_per_s"].samples[0] == pytest.approx(2 * 512 / 0.040)
    assert out["rank_load_max_over_mean"].samples == [1.0]
    gated = {r.name for r in out.values() if isinstance(r, Measured) and r.unit in ("x", "fraction")}
    assert gated == {"step_over_balanced", "step_over_uniform", "expert_slowest_over_fastest", "combine_wait_share",
                     "rank_load_max_over_mean"}
    assert "step_over_uniform" not in {r.name for r in moe.reduce(_moe_case("uniform"), _launch(case))}


def test_on_cpu_the_step_ratios_depend_on_the_exact_id_and_the_load_ratio_on_nothing():
    """The hot rank's extra expert compute runs at the host ISA's speed on CPU (area.cpu_ratio_depends): the
    step ratios are judged against this id's own baseline only; on GPUs they keep the family default. The
    seeded load ratio depends on nothing either way, the timing ratios of like with like on the family."""
    gpu = next(c for c in moe.AREA.all_cases() if c.values.distribution == "hot0.5" and c.values.backend == "nccl"
               and c.values.spec.world == 2)
    for case, step in ((_moe_case(), "id"), (gpu, None)):
        out = {r.name: r for r in moe.reduce(case, _launch(case)) if isinstance(r, Measured)}
        assert {n: out[n].depends for n in ("step_over_balanced", "step_over_uniform", "rank_load_max_over_mean",
                                            "expert_slowest_over_fastest")} == {
            "step_over_balanced": step, "step_over_uniform": step, "rank_load_max_over_mean": "nothing",
            "expert_slowest_over_fastest": None}, case.id


def test_moe_reduce_refuses_wrong_outputs_and_lost_tokens():
    case = _moe_case()
    with pytest.raises(CheckFailed, match=r"hot0.5 routing differs from the reference .* in 12 elements \(per rank: \[6, 6\]\)"):
        moe.reduce(case, _launch(case, hot_wrong=6))
    with pytest.raises(CheckFailed, match=r"hot0.5 routing sent .* the experts received"):
        moe.reduce(case, _launch(case, hot_received=[[512, 511], [512, 512]]))


def test_moe_cases_have_unique_ids_and_gpu_markers():
    every = moe.AREA.all_cases()
    assert len({c.id for c in every}) == len(every)
    assert {c.id for c in every if "cpu" in c.marks} == {f"gloo-{w}rank-{d}" for w in (2, 4) for d in moe.DISTRIBUTIONS}
    assert {c.marks for c in every if c.values.backend == "nccl"} == {("2gpu",), ("4gpu",), ("8gpu",)}


# -- the NCCL tuner: the gate on synthetic numbers ---------------------------------------------------

def _tuner_case(size_label="256MiB", op="all_reduce", world=8):
    return next(c for c in tuner.AREA.all_cases() if c.id == f"nccl-{world}gpu-{op}-{size_label}")


def _nccl_rank(case, busbw_gbps):
    """One rank's collectives-engine result whose slowest-rank busbw reads ``busbw_gbps``."""
    c = case.values
    factor = 2 * (c.world - 1) / c.world
    times = [c.size / (b / factor * 1e9) * 1e6 for b in busbw_gbps]
    return {"size_bytes": c.size, "count": c.size // 4, "iters": 5, "graph": False, "bus_factor": factor,
            "time_us": times, "call_us": times, "ref_us": times, "wrong": 0}


# busbw (GB/s) per setting at 256 MiB on 8 GPUs, 5 samples each: the default picks well, one channel
# and the LL protocols lose most of the bandwidth (the shape of the seed's §16.3, not its numbers).
SYNTHETIC = {"default": [101, 99, 100, 102, 98], "algo-ring": [100, 99, 98, 101, 100], "algo-tree": [80, 81, 79, 80, 80],
             "proto-ll": [30, 31, 29, 30, 30], "proto-ll128": [95, 96, 94, 95, 95], "proto-simple": [99, 100, 98, 99, 99],
             "channels-1": [22, 23, 21, 22, 22], "channels-2": [60, 61, 59, 60, 60], "channels-4": [90, 89, 91, 90, 90],
             "channels-8": [100, 101, 99, 100, 100]}


def _tuner_raw(case, default_like: str = "default"):
    raw = {s: [_nccl_rank(case, SYNTHETIC[s])] * case.values.world for s in case.values.settings}
    raw["default"] = [_nccl_rank(case, SYNTHETIC[default_like])] * case.values.world
    raw["algo-tree"] = {"unavailable": "NCCL WARN no algorithm/protocol available"}
    return raw


def _ratio(case, raw):
    out = {r.name: r for r in tuner.reduce(case, raw)}
    return out["default_over_best_busbw"], out


def test_tuner_reduce_divides_the_default_by_the_best_forced_setting():
    case = _tuner_case()
    ratio, out = _ratio(case, _tuner_raw(case))
    assert ratio.better == "higher" and ratio.unit == "x"
    assert ratio.samples == pytest.approx([b / 100.0 for b in SYNTHETIC["default"]])  # best forced: median 100
    assert out["tuner"].data["best_forced"] in ("algo-ring", "channels-8")
    assert out["tuner"].data["unavailable"] == {"algo-tree": "NCCL WARN no algorithm/protocol available"}
    assert out["busbw_gbps_channels_1"].samples == pytest.approx(SYNTHETIC["channels-1"])
    bad = _tuner_raw(case)
    bad["proto-ll"] = [dict(_nccl_rank(case, SYNTHETIC["proto-ll"]), wrong=3)] * case.values.world
    with pytest.raises(CheckFailed, match=r"under proto-ll \(\{'NCCL_NVLS_ENABLE': '0', 'NCCL_PROTO': 'LL'\}\): all_reduce returned 24 wrong"):
        tuner.reduce(case, bad)


@pytest.mark.parametrize("planted", ["channels-1", "proto-ll"])
def test_tuner_gate_fails_a_planted_bad_default(planted):
    """The real gate, this repository's tolerance files, a GPU hardware id: a default that behaves
    like one channel (or LL) at 256 MiB reads ``regression``; the healthy default ``pass``."""
    case = _tuner_case()
    test_id = f"perf/collectives/test_nccl_tuner.py::test_nccl_tuner_default_vs_best[{case.id}]"
    healthy, _ = _ratio(case, _tuner_raw(case))
    hw = "8xV100-PCIE-32GB-PCIe"
    settings = load_settings(ROOT, hardware_id=hw)
    entry = BaselineEntry(unit="x", better="higher", summary=summarize(healthy.samples), tol=None, provenance="measured")
    for default_like, outcome in (("default", "pass"), (planted, "regression")):
        now, _ = _ratio(case, _tuner_raw(case, default_like))
        metric = Metric(now.name, now.unit, now.better, summarize(now.samples))
        r = gate.evaluate(test_id, metric, Choice(entry, hw, False, None), gate.Context.of(settings, hw))
        assert r.gated and r.verdict["outcome"] == outcome, (default_like, r.verdict)


def test_tuner_launch_env_keeps_nvls_off_and_plants_the_bad_default(monkeypatch):
    monkeypatch.delenv(mutations.ENV, raising=False)
    assert tuner.launch_env("default", "all_reduce") == {"NCCL_NVLS_ENABLE": "0"}
    assert tuner.launch_env("channels-2", "all_gather") == {"NCCL_NVLS_ENABLE": "0", "NCCL_MIN_NCHANNELS": "2",
                                                            "NCCL_MAX_NCHANNELS": "2"}
    monkeypatch.setenv(mutations.ENV, "nccl_bad_default")
    assert tuner.launch_env("default", "all_reduce") == {"NCCL_NVLS_ENABLE": "0", **tuner.PLANTED_BAD_DEFAULT}
    every = tuner.AREA.all_cases()
    assert len({c.id for c in every}) == len(every) and all(c.marks[0].endswith("gpu") for c in every)
    assert "algo-tree" not in _tuner_case(op="all_gather").values.settings
