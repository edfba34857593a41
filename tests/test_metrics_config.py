"""Metric summaries and tolerance configuration."""
from __future__ import annotations

import random
from pathlib import Path

import pytest

from perfgate.judge.config import ConfigError, Settings
from perfgate.store.settings import load_settings
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.gate import Context, evaluate, tolerance
from perfgate.judge.policy import GatePolicy
from perfgate.judge.metrics import MAX_STORED_SAMPLES, Metric, MetricError, Summary, stored_samples, summarize


def test_summary_is_robust():
    s = summarize([1, 2, 3, 4, 100])
    assert s.median == 3 and s.mad == 1 and s.n == 5 and s.min == 1 and s.max == 100
    assert s.iqr == pytest.approx(2.0)


def test_summary_stores_quantiles_of_every_sample():
    """Issue 47: what is stored is a faithful summary of all samples (never the first N), and every
    statistic counts all of them; in memory the verdict still has every sample."""
    values = [10.0] * 200 + [1.0] * 799  # a slow first 200 rounds (no warm-up), then the real speed
    s = summarize(values)
    assert s.n == 999 and s.median == 1.0 and len(s.samples) == 999
    stored = s.to_dict()["samples"]
    assert len(stored) == MAX_STORED_SAMPLES and stored == sorted(stored)
    assert stored[0] == 1.0 and stored[-1] == 10.0  # min and max kept
    assert abs(stored.count(10.0) / MAX_STORED_SAMPLES - 200 / 999) < 0.01  # the slow share as in the run
    assert Summary.from_dict(s.to_dict()).n == 999 and stored_samples(values) == tuple(stored)
    assert stored_samples([3.0, 1.0, 2.0]) == (3.0, 1.0, 2.0)  # a short run is stored whole, in its order


@pytest.mark.parametrize("bad", [[], [float("nan")], [1.0, float("inf")]])
def test_bad_samples_are_refused(bad):
    with pytest.raises(MetricError):
        summarize(bad)


def test_metric_validation():
    s = summarize([1.0])
    with pytest.raises(MetricError, match="unknown unit"):
        Metric("x", "furlongs", "higher", s)
    with pytest.raises(MetricError, match="better"):
        Metric("x", "GB/s", "up", s)
    with pytest.raises(MetricError, match="tol"):
        Metric("x", "GB/s", "higher", s, tol=-1)


def write(tmp_path, text):
    (tmp_path / "pyproject.toml").write_text(text)
    return tmp_path


def test_tolerance_precedence(tmp_path):
    root = write(tmp_path, """
[tool.perfgate.tolerances]
latency = 0.2
[tool.perfgate.overrides]
"perf/a/*::test_x*" = 0.3
"perf/a/*::test_x*@busbw_gbps" = 0.4
""")
    s = load_settings(root)
    lat = Metric("time_us", "us", "lower", summarize([1.0]))
    bw = Metric("busbw_gbps", "GB/s", "higher", summarize([1.0]), tol=0.01)
    own = Metric("time_us", "us", "lower", summarize([1.0]), tol=0.07)
    assert tolerance(s, "perf/b/t.py::test_y", lat) == 0.2          # family, from config
    assert tolerance(s, "perf/b/t.py::test_y", own) == 0.07         # the test's own tol
    assert tolerance(s, "perf/a/t.py::test_x[1]", own) == 0.3       # test-id override beats the test
    assert tolerance(s, "perf/a/t.py::test_x[1]", bw) == 0.4        # metric override is most specific


@pytest.mark.parametrize("text, match", [
    ('[tool.perfgate.tolerances]\nlatency = "ten"', "must be a number"),
    ('[tool.perfgate.tolerances]\nlatency = -0.1', "non-negative"),
    ('[tool.perfgate.tolerances]\nspeed = 0.1', "unknown unit family"),
    ('[tool.perfgate]\ngate = "sometimes"', "gate"),
    ('[tool.perfgate]\nretries = -1', "retries"),
    ('[tool.perfgate]\ncolour = 1', "unknown key"),
    ('[tool.perfgate\n', "not valid TOML"),
])
def test_malformed_config_names_file_and_key(tmp_path, text, match):
    root = write(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as info:
        load_settings(root)
    assert str(root / "pyproject.toml") in str(info.value)


def test_tolerances_toml_in_baselines_folder(tmp_path):
    root = write(tmp_path, "[tool.perfgate]\nretries = 2\n")
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "tolerances.toml").write_text('[overrides]\n"*gloo*" = 0.5\n')
    s = load_settings(root)
    assert s.retries == 2 and s.overrides == {"*gloo*": 0.5}


def test_gating_modes():
    def gates(dependency, hw, mode):
        return GatePolicy(hw, mode).gates("perf/a/test_t.py::t", "m", dependency)
    assert gates("family", "cpu-AMD-EPYC-2c", "auto") and gates("nothing", "cpu-AMD-EPYC-2c", "auto")
    assert not gates("host", "cpu-AMD-EPYC-2c", "auto") and not gates("device", "cpu-AMD-EPYC-2c", "auto")
    assert gates("host", "2xH200-NV18", "auto") and gates("device", "2xH200-NV18", "auto")
    assert gates("host", "cpu-AMD-EPYC-2c", "all")
    assert not gates("host", "2xH200-NV18", "ratios") and gates("nothing", "2xH200-NV18", "ratios")


def test_calibrated_baseline_tolerance_beats_the_tests_own(tmp_path):
    from perfgate.judge.baseline_entry import BaselineEntry

    s = load_settings(write(tmp_path, ""))
    own = Metric("time_us", "us", "lower", summarize([1.0]), tol=0.07)
    plain = BaselineEntry(unit="us", better="lower", summary=summarize([1.0]), tol=0.3, provenance="measured")
    calibrated = BaselineEntry(unit="us", better="lower", summary=summarize([1.0]), tol=0.3, provenance="measured",
                               spread={"run_to_run": 0.1, "proposed_tol": 0.3})
    assert tolerance(s, "perf/b/t.py::test_y", own, plain) == 0.07       # a plain refresh does not change tol
    assert tolerance(s, "perf/b/t.py::test_y", own, calibrated) == 0.3   # a calibrated one does
    assert BaselineEntry.from_dict(calibrated.to_dict()).spread == calibrated.spread


def test_hardware_specific_tolerances_apply_only_to_that_hardware(tmp_path):
    root = write(tmp_path, "")
    hw = tmp_path / "baselines" / "cpu-Noisy-2c"
    hw.mkdir(parents=True)
    (hw / "tolerances.toml").write_text("[tolerances]\nratio = 0.35\n")
    assert load_settings(root, hardware_id="cpu-Noisy-2c").tolerances["ratio"] == 0.35
    assert load_settings(root, hardware_id="2xH200-NV18").tolerances["ratio"] == 0.10


def test_record_only_metrics_are_kept_but_never_gated(tmp_path):

    root = write(tmp_path, "")
    hw = tmp_path / "baselines" / "cpu-Noisy-2c"
    hw.mkdir(parents=True)
    (hw / "tolerances.toml").write_text('[record_only]\n"perf/s/*::test_rate*@slo_*" = "moves by whole requests"\n')
    s = load_settings(root, hardware_id="cpu-Noisy-2c")
    m = Metric("slo_attainment@0.5x", "fraction", "higher", summarize([0.5] * 5))
    other = Metric("speedup", "x", "higher", summarize([0.5] * 5))
    tid = "perf/s/t.py::test_rate[cpu]"
    assert s.record_only_reason(tid, m.name) == "moves by whole requests"
    assert s.record_only_reason(tid, other.name) is None
    assert not evaluate(tid, m, Choice.none(), Context.of(s, "cpu-Noisy-2c")).gated
    assert evaluate(tid, other, Choice.none(), Context.of(s, "cpu-Noisy-2c")).gated
    s.gate = "all"  # --perf-gate=all gates everything, record_only included
    assert evaluate(tid, m, Choice.none(), Context.of(s, "cpu-Noisy-2c")).gated
    assert load_settings(root, hardware_id="2xH200-NV18").record_only == {}


def test_record_only_needs_a_reason(tmp_path):
    root = write(tmp_path, '[tool.perfgate.record_only]\n"perf/*" = ""\n')
    with pytest.raises(ConfigError, match="reason"):
        load_settings(root)


def _judged(baseline_values, current_values, unit="s", floor=None):
    """The verdict of a metric of ``current_values`` against a baseline written from ``baseline_values`` and
    read back as a file holds it (its stored summary), on an id where absolute timings gate."""
    from perfgate.judge.baseline_entry import BaselineEntry

    stored = Summary.from_dict(summarize(baseline_values).to_dict())
    entry = BaselineEntry(unit=unit, better="lower", summary=stored, tol=None, provenance="measured")
    metric = Metric("time_s", unit, "lower", summarize(current_values), floor=floor)
    return evaluate("bench/t.py::test_x", metric, Choice(entry, "1xH200", False, None),
                    Context.of(Settings(baselines=Path("baselines")), "1xH200"))


def test_a_run_is_judged_by_every_sample_not_its_first_200():
    """Issue 47: pytest-benchmark ran 700-199,000 rounds and perfgate judged the first 200 (the least
    warmed up). 200 slow rounds then 1,800 at the baseline's speed is the baseline's speed; the same run
    with the slow rounds last and the first 1,800 slow is a regression, on every sample."""
    rng = random.Random(0)
    fast = lambda n: [1e-3 * (1 + 0.02 * rng.random()) for _ in range(n)]  # noqa: E731
    slow = lambda n: [2e-3 * (1 + 0.02 * rng.random()) for _ in range(n)]  # noqa: E731
    warm_up_then_fast = _judged(fast(2000), slow(200) + fast(1800))
    assert warm_up_then_fast.outcome == "pass", warm_up_then_fast.verdict
    assert "2,000 sample(s) here, 2,000 in the baseline (200 stored)" in warm_up_then_fast.verdict["explanation"]
    slow_after_200 = _judged(fast(2000), fast(200) + slow(1800))
    assert slow_after_200.outcome == "regression", slow_after_200.verdict
    assert slow_after_200.summary.median == pytest.approx(2e-3, rel=0.03)


def test_a_baseline_written_before_quantiles_is_judged_by_its_median_of_every_sample():
    """Files written before issue 47 stored a run's first 200 samples (here its slow warm-up) beside the
    median of all of them; they load as they are, and the level a run is judged against is that median."""
    from perfgate.judge.baseline_entry import BaselineEntry

    old = {"median": 1e-3, "mad": 1e-5, "n": 5000, "samples": [2e-3 + i * 1e-7 for i in range(200)]}
    entry = BaselineEntry(unit="s", better="lower", summary=Summary.from_dict(old), tol=None, provenance="measured")
    same_speed = Metric("time_s", "s", "lower", summarize([1e-3 * (1 + 0.001 * (i % 7)) for i in range(3000)]))
    got = evaluate("bench/t.py::test_x", same_speed, Choice(entry, "1xH200", False, None),
                   Context.of(Settings(baselines=Path("baselines")), "1xH200"))
    assert got.outcome in ("pass", "improved") and got.verdict["baseline_median"] == 1e-3, got.verdict
    assert "5,000 in the baseline (200 stored)" in got.verdict["explanation"]
