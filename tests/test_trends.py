"""History -> series -> change points (Apache Otava), and `perfgate report` / `perfgate trends`.

The histories here are synthetic results documents (harness logic: what a change point is,
what the report shows); the documents are the real format, written with the real writer.
tests/test_report_html.py builds the HTML page from real histories in tests/data/runs/.
"""
from __future__ import annotations

import json
import random

import matplotlib.image
import pytest

from perfgate.store import results as results_mod
from perfgate.report import changepoints, trends
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.cli import main
from perfgate.judge.metrics import summarize
from perfgate.judge.metric_result import MetricResult

AR = "perf/collectives/test_collectives.py::test_all_reduce[nccl-2gpu-PIX-{}]"


def result(test_id, metric, samples, *, unit="GB/s", better="higher", tol=0.05, tainted=(), baseline=None,
           outcome="pass"):
    return MetricResult(test_id=test_id, area="collectives", metric=metric, unit=unit, better=better, tol=tol,
                        gated=True, summary=summarize(samples), verdict={"outcome": outcome, "change": 0.0},
                        baseline=baseline, tainted=list(tainted))


def write_history(folder, levels_by_test, *, hardware_id="2xV100-PCIe", noise=0.01, seed=0, tainted_runs=(),
                  unit="GB/s", better="higher", tol=0.05, metric="busbw_gbps", start_day=1):
    """One results JSON per run; ``levels_by_test`` maps test id -> list of per-run true levels."""
    rng = random.Random(seed)
    n_runs = len(next(iter(levels_by_test.values())))
    for i in range(n_runs):
        res = [result(t, metric, [lv[i] * (1 + rng.gauss(0, noise)) for _ in range(7)], unit=unit, better=better,
                      tol=tol, tainted=["load average 9 on 2 cores"] if i in tainted_runs else (),
                      baseline={"median": lv[0], "provenance": "measured"})
               for t, lv in levels_by_test.items()]
        doc = results_mod.make_document(res, hardware_id=hardware_id, fingerprint={}, commit=f"{i:04d}beef")
        doc["created"] = f"2026-11-{start_day + i:02d}T02:00:00+00:00"
        # file names deliberately out of time order: the history is ordered by 'created'
        results_mod.save(folder / f"{hardware_id}-{(n_runs - i):02d}.json", doc)


def series_of(folder, test_id, metric="busbw_gbps"):
    runs = trends.load_history(folder)
    return next(s for s in trends.build_series(runs) if s.test_id == test_id and s.metric == metric)


def test_history_is_ordered_by_time_not_file_name(tmp_path):
    write_history(tmp_path, {AR.format("1KiB"): [1, 2, 3, 4, 5]}, noise=0)
    runs = trends.load_history(tmp_path)
    assert [r.created[:10] for r in runs] == [f"2026-11-0{d}" for d in range(1, 6)]
    s = series_of(tmp_path, AR.format("1KiB"))
    assert [p.median for p in s.points] == [1, 2, 3, 4, 5]
    assert s.family == "test_all_reduce busbw_gbps"


def test_sustained_drop_is_one_worse_change_point_at_the_right_run(tmp_path):
    levels = [11.7] * 6 + [10.0] * 4
    write_history(tmp_path, {AR.format("256MiB"): levels, AR.format("1MiB"): [80.0] * 10})
    found = changepoints.all_change_points(trends.build_series(trends.load_history(tmp_path)))
    assert len(found) == 1
    c = found[0]
    assert c.series.test_id == AR.format("256MiB")
    assert c.at == 6 and c.worse and c.p_value < changepoints.MAX_PVALUE
    assert c.change == pytest.approx(10.0 / 11.7 - 1, abs=0.02)
    assert "worse" in c.describe() and "0006beef" in c.describe() and "p=" in c.describe()


def test_single_outliers_are_not_change_points(tmp_path):
    levels = [100.0] * 6 + [70.0] + [100.0] * 6 + [130.0] + [100.0] * 6
    write_history(tmp_path, {AR.format("1KiB"): levels}, noise=0.01)
    assert changepoints.find_change_points(series_of(tmp_path, AR.format("1KiB"))) == []


def test_drift_below_min_magnitude_is_not_a_change_point(tmp_path):
    write_history(tmp_path, {AR.format("1KiB"): [100.0] * 8 + [98.8] * 8}, noise=0.001)  # -1.2 % < 2 %
    s = series_of(tmp_path, AR.format("1KiB"))
    assert changepoints.find_change_points(s) == []
    assert [c.at for c in changepoints.find_change_points(s, min_magnitude=0.005)] == [8]  # real, but small


def test_improvement_then_regression_are_two_change_points(tmp_path):
    levels = [10.0] * 10 + [12.0] * 10 + [10.0] * 10  # up 20 %, then down 17 % from the new level
    write_history(tmp_path, {AR.format("1KiB"): levels}, noise=0.005)
    found = changepoints.find_change_points(series_of(tmp_path, AR.format("1KiB")))
    assert [(c.at, c.worse) for c in found] == [(10, False), (20, True)]
    assert found[1].before == pytest.approx(12.0, rel=0.02)


def test_every_injected_step_of_10_percent_or_more_is_found_and_flat_runs_give_none():
    """Synthetic histories: 2 % run-to-run noise, steps of 10 and 20 % (up and down) between flat stretches
    of 15 runs; every step found within two runs of where it was injected, nothing anywhere else."""
    rng = random.Random(7)
    for k in range(20):
        steps = {15: 1.10 if k % 2 else 0.90, 30: 1.20 if k % 3 else 0.80}
        level, s = 100.0, trends.Series("h", f"t::test_{k}", "busbw_gbps", "GB/s", "higher", 0.05)
        for i in range(45):
            level *= steps.get(i, 1.0)
            m = level * (1 + rng.gauss(0, 0.02))
            s.points.append(trends.Point(i, f"run{i}", None, m, m, m, 7, False, "pass"))
        found = [c.at for c in changepoints.find_change_points(s)]
        assert len(found) == 2 and all(any(abs(f - at) <= 2 for f in found) for at in steps), (k, found)
    flat = trends.Series("h", "t::flat", "busbw_gbps", "GB/s", "higher", 0.05)
    for i in range(60):
        m = 100 * (1 + rng.gauss(0, 0.02))
        flat.points.append(trends.Point(i, f"run{i}", None, m, m, m, 7, False, "pass"))
    assert changepoints.find_change_points(flat) == []


def test_ids_are_ordered_as_a_reader_expects():
    ids = ["t[gloo-2rank-16KiB]", "t[gloo-16rank-1KiB]", "t[gloo-2rank-1MiB]", "t[gloo-2rank-1KiB]", "t[gpu-C=16]",
           "t[gpu-C=2]", "t[nccl-8gpu-1GiB]", "t[nccl-8gpu-256MiB]"]
    assert sorted(ids, key=trends.natural_key) == [
        "t[gloo-2rank-1KiB]", "t[gloo-2rank-16KiB]", "t[gloo-2rank-1MiB]", "t[gloo-16rank-1KiB]", "t[gpu-C=2]",
        "t[gpu-C=16]", "t[nccl-8gpu-256MiB]", "t[nccl-8gpu-1GiB]"]


def test_error_bars_are_the_quartiles_of_the_samples():
    q1, q3 = trends.quartiles(summarize([1.0, 2.0, 3.0, 4.0, 100.0]))
    assert (q1, q3) == (2.0, 4.0)


def test_tainted_runs_do_not_make_a_change_point(tmp_path):
    levels = [10.0] * 8 + [5.0] * 4  # the four low runs were tainted
    write_history(tmp_path, {AR.format("1KiB"): levels}, noise=0.005, tainted_runs=(8, 9, 10, 11))
    s = series_of(tmp_path, AR.format("1KiB"))
    assert changepoints.find_change_points(s) == []
    assert [c.at for c in changepoints.find_change_points(s, include_tainted=True)] == [8]


def test_fractions_change_absolutely(tmp_path):
    tid = "perf/offload/test_cache.py::test_hit_rate[lru]"
    write_history(tmp_path, {tid: [0.70] * 6 + [0.60] * 6}, unit="fraction", tol=0.03, metric="hit_rate",
                  noise=0.002)
    (c,) = changepoints.find_change_points(series_of(tmp_path, tid, "hit_rate"))
    assert c.worse and c.change == pytest.approx(-0.10, abs=0.005) and c.shown_change.startswith("-0.1")


def test_hardware_ids_are_separate_series(tmp_path):
    write_history(tmp_path, {AR.format("1KiB"): [10.0] * 5}, hardware_id="A")
    write_history(tmp_path, {AR.format("1KiB"): [20.0] * 5}, hardware_id="B", start_day=10)
    series = trends.build_series(trends.load_history(tmp_path))
    assert sorted((s.hardware_id, len(s.points)) for s in series) == [("A", 5), ("B", 5)]
    assert changepoints.all_change_points(series) == []  # 10 -> 20 between machines is not a change


def test_unreadable_history_file_names_the_file(tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    with pytest.raises(ValueError, match="broken.json"):  # a history folder is read as a results store
        trends.load_history(tmp_path)


def test_report_writes_pngs_and_a_page_listing_change_points(tmp_path, capsys):
    hist = tmp_path / "history"
    hist.mkdir()
    write_history(hist, {AR.format("256MiB"): [11.7] * 6 + [9.9] * 4, AR.format("1KiB"): [15.0] * 10},
                  tainted_runs=(3,))
    # the committed baseline for the band: 11.74 GB/s (imported from a report, say)
    store = BaselineStore(tmp_path / "baselines")
    store.write("2xV100-PCIe", "collectives", {AR.format("256MiB"): {"busbw_gbps": BaselineEntry(
        unit="GB/s", better="higher", summary=summarize([11.74]), tol=None, provenance="imported: test")}})
    out = tmp_path / "report"
    code = main(["report", str(hist), "--out", str(out), "--baselines", str(tmp_path / "baselines"),
                 "--root", str(tmp_path), "--fail-on-worse"])
    assert code == 1  # a worse change was found and asked to fail
    pngs = sorted(out.glob("*.png"))
    assert [p.name for p in pngs] == ["2xV100-PCIe__test_all_reduce_busbw_gbps.png"]
    image = matplotlib.image.imread(pngs[0])
    assert image.shape[0] > 200 and image.shape[1] > 400
    page = (out / "index.md").read_text()
    assert f"({pngs[0].name})" in page
    assert "nccl-2gpu-PIX-256MiB" in page and "**worse**" in page and "0006beef" in page
    assert "| 3 |" in page and "| 10 | 0 | 7 |" not in page  # the run table lists every run
    assert "WORSE" in capsys.readouterr().out
    # the band comes from the store when it has the metric
    s = series_of(hist, AR.format("256MiB"))
    from perfgate.commands.report import baseline_for
    assert baseline_for(store, s) == (11.74, "imported: test")
    assert baseline_for(None, s)[0] == pytest.approx(11.7)


def test_report_splits_large_families_and_passes_without_change_points(tmp_path):
    hist = tmp_path / "h"
    hist.mkdir()
    sizes = [f"{1 << i}KiB" for i in range(17)]
    write_history(hist, {AR.format(s): [10.0] * 5 for s in sizes}, noise=0.002)
    assert main(["report", str(hist), "--root", str(tmp_path), "--fail-on-worse"]) == 0
    out = hist / "report"
    assert len(list(out.glob("*-part*.png"))) == 2  # 17 panels, 16 per image
    assert "None found." in (out / "index.md").read_text()


def test_report_on_empty_folder_says_how_to_make_history(tmp_path, capsys):
    assert main(["report", str(tmp_path), "--root", str(tmp_path)]) == 2
    assert "--perf-history" in capsys.readouterr().err


def test_results_json_round_trips_tainted_flag(tmp_path):
    write_history(tmp_path, {AR.format("1KiB"): [1.0] * 3}, tainted_runs=(1,))
    docs = [json.loads(p.read_text()) for p in sorted(tmp_path.glob("*.json"))]
    assert sum(bool(d["results"][0]["tainted"]) for d in docs) == 1


def test_trends_command_lists_change_points_with_run_commit_and_p_value(tmp_path, capsys):
    write_history(tmp_path, {AR.format("256MiB"): [11.7] * 6 + [9.9] * 4, AR.format("1KiB"): [15.0] * 10})
    assert main(["trends", str(tmp_path), "--fail-on-worse"]) == 1
    out = capsys.readouterr().out
    assert "10 runs, 2 series; 1 change point(s)" in out
    assert "256MiB" in out and "0006beef" in out and "-15.5%" in out and "worse" in out
    assert main(["trends", str(tmp_path), "-k", "1KiB", "--fail-on-worse"]) == 0


# Issue 47: a gated ratio at 2.49 for 6 runs, then a planted 4x collective: run medians 23.2 (the first
# run after the step, +833 %), then about 9 (the new level, +260 % by the median of the five).
PLANTED_4X = [23.22, 8.97, 9.40, 8.60, 8.30]
P2P = "perf/collectives/test_collectives.py::test_all_reduce[gloo-2rank-64KiB]"


def test_a_4x_step_after_5_runs_is_a_change_point_with_the_defaults_sized_by_the_new_level(tmp_path, capsys):
    """0 change points with the defaults before (a t-test on the raw medians, the new level's spread
    dwarfing the old one's); the size was the first run after the step, not the new level."""
    write_history(tmp_path, {P2P: [2.49] * 5 + PLANTED_4X}, unit="x", better="lower", metric="time_over_p2p",
                  tol=0.5, noise=0.02)
    (c,) = changepoints.find_change_points(series_of(tmp_path, P2P, "time_over_p2p"))
    assert c.at == 5 and c.worse and c.p_value < changepoints.MAX_PVALUE
    assert (c.runs_before, c.runs_after) == (5, 5)
    assert c.after == pytest.approx(8.97, rel=0.03) and c.before == pytest.approx(2.49, rel=0.03)
    assert c.change == pytest.approx(8.97 / 2.49 - 1, rel=0.05)  # +260 %, not +833 %
    assert main(["trends", str(tmp_path), "--fail-on-worse"]) == 1
    out = capsys.readouterr().out
    assert "10 runs, 1 series; 1 change point(s)" in out and "nothing left out" in out
    assert "+2" in out and "5/5" in out and "+833" not in out and "+832" not in out, out


def test_runs_left_out_as_tainted_are_counted_in_the_output(tmp_path, capsys):
    """"11 runs, 3 series; 0 change point(s)" was printed when every one of the 11 runs was tainted."""
    write_history(tmp_path, {P2P: [2.49] * 6 + PLANTED_4X, AR.format("1KiB"): [15.0] * 11}, unit="x",
                  better="lower", metric="time_over_p2p", tainted_runs=range(11))
    assert main(["trends", str(tmp_path), "--fail-on-worse"]) == 0
    out = capsys.readouterr().out
    assert ("11 runs, 2 series; 0 change point(s)" in out and "left out: 22 tainted run median(s) (11 run(s) "
            "tainted throughout), --include-tainted counts them; 2 series with fewer than 4 runs to compare") in out
    assert main(["trends", str(tmp_path), "--include-tainted", "--fail-on-worse"]) == 1
    assert "nothing left out" in capsys.readouterr().out


def test_fail_on_worse_alarms_while_the_series_sits_at_the_worse_level(tmp_path):
    """A change point stays in the history for good: the nightly alarm is the latest change of a series
    being for the worse, so the job goes green again once a fix brings the level back."""
    write_history(tmp_path, {P2P: [2.49] * 8 + [9.0] * 8}, unit="x", better="lower", metric="time_over_p2p")
    assert main(["trends", str(tmp_path), "--fail-on-worse"]) == 1
    fixed = tmp_path / "fixed"
    fixed.mkdir()
    write_history(fixed, {P2P: [2.49] * 8 + [9.0] * 8 + [2.49] * 8}, unit="x", better="lower",
                  metric="time_over_p2p")
    found = changepoints.find_change_points(series_of(fixed, P2P, "time_over_p2p"))
    assert [(c.at, c.worse) for c in found] == [(8, True), (16, False)]
    assert main(["trends", str(fixed), "--fail-on-worse"]) == 0
