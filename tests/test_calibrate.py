"""`perfgate calibrate`: the spread arithmetic, pooling of runs, and one real end-to-end pass.

The end-to-end pass runs a tiny synthetic perf test three times in fresh pytest
processes (harness logic: the numbers are made up, the processes, files and baseline
writes are real).
"""
from __future__ import annotations

import json
import math
import textwrap

import pytest
from scipy.stats import norm

from perfgate.store import results as results_mod
from perfgate.cli import main
from perfgate.commands import calibrate as cal
from perfgate.judge.config import Settings
from perfgate.judge.metrics import summarize
from perfgate.judge.metric_result import MetricResult


def test_robust_spread_is_scaled_mad_over_median():
    # medians 98, 100, 101, 103, 100 -> median 100, |dev| 2,0,1,3,0 -> MAD 1
    assert cal.robust_spread([98, 100, 101, 103, 100]) == pytest.approx(0.014826)
    assert cal.robust_spread([0.70, 0.72, 0.69], absolute=True) == pytest.approx(0.01 * 1.4826)
    assert cal.robust_spread([5.0]) is None
    assert cal.robust_spread([0.0, 0.0, 0.0]) is None  # relative spread of zero is undefined


def test_proposal_respects_floor_and_k():
    assert cal.propose(0.01, k=3, floor=0.02) == pytest.approx(0.03)
    assert cal.propose(0.002, k=3, floor=0.02) == 0.02
    assert cal.propose(None, k=3, floor=0.02) is None


def test_false_alarm_rate_and_detectable_regression():
    s = 0.02
    # a tolerance of 3 spreads: one run vs one-run baseline differ by N(0, s*sqrt2)
    assert cal.false_alarm_rate(3 * s, s) == pytest.approx(norm.sf(3 / math.sqrt(2)))
    assert cal.false_alarm_rate(0.05, 0.0) == 0.0
    # at alpha = 0.01 and power 0.5 the detectable change is the alpha threshold itself
    assert cal.detectable(s, alpha=0.01, power=0.5) == pytest.approx(norm.isf(0.01) * s * math.sqrt(2))
    assert cal.detectable(s, alpha=0.01, power=0.8) > cal.detectable(s, alpha=0.05, power=0.8)
    assert cal.detectable(None, alpha=0.01, power=0.8) is None


def _doc(medians_by_metric, tainted=False, boot_id=None, factors=(0.99, 1.0, 1.01)):
    res = []
    for (test, metric, unit), med in medians_by_metric.items():
        res.append(MetricResult(test_id=test, area="demo", metric=metric, unit=unit, better="higher", tol=0.1,
                                gated=True, summary=summarize([med * f for f in factors]),
                                verdict={"outcome": "new"}, tainted=["busy"] if tainted else []))
    fingerprint = {"software": {"torch": "x"}, **({"boot_id": boot_id} if boot_id else {})}
    return results_mod.make_document(res, hardware_id="cpu-Test-2c", fingerprint=fingerprint, commit="abc")


def test_calibrate_docs_pools_runs_and_reads_configured_tolerance(tmp_path):
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    docs = [_doc({key: m}) for m in (98, 100, 101, 103, 100)] + [_doc({key: 50}, tainted=True)]
    settings = Settings(baselines=tmp_path)
    settings.overrides["perf/demo/*@speedup"] = 0.07
    (c,) = cal.calibrate_docs(docs, settings, k=3, floor=0.02, fraction_floor=0.01)
    assert c.run_medians == (98, 100, 101, 103, 100)  # the tainted run is left out
    assert len(c.pooled) == 15
    assert c.spread == pytest.approx(0.014826)
    assert c.proposed == pytest.approx(3 * 0.014826)
    assert c.configured == 0.07
    (with_tainted,) = cal.calibrate_docs(docs, settings, k=3, floor=0.02, fraction_floor=0.01, include_tainted=True)
    assert len(with_tainted.run_medians) == 6


def test_fewer_than_three_runs_propose_nothing(tmp_path):
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    (c,) = cal.calibrate_docs([_doc({key: 1.0}), _doc({key: 1.1})], Settings(baselines=tmp_path), k=3,
                              floor=0.02, fraction_floor=0.01)
    assert c.spread is None and c.proposed is None
    assert cal.entries([c], [_doc({key: 1.0})], k=3, floor=0.02, fraction_floor=0.01) == {}


def test_options_after_the_tests_are_refused(capsys):
    assert main(["calibrate", "perf/", "--runs", "4"]) == 2
    assert "put perfgate options first" in capsys.readouterr().err
    assert main(["calibrate", "--runs", "2", "--", "perf/"]) == 2


SYNTHETIC = textwrap.dedent('''
    import random
    import pytest

    @pytest.mark.cpu
    def test_speed(perf):
        rng = random.Random()  # a new level every run: run-to-run spread of about 3 %
        level = 4.0 * (1 + rng.gauss(0, 0.03))
        perf.record("speedup", [level * (1 + rng.gauss(0, 0.005)) for _ in range(6)], unit="x", better="higher")
        perf.record("hit_rate", [0.7 + rng.gauss(0, 0.002) for _ in range(6)], unit="fraction", better="higher")
''')


def test_calibrate_end_to_end_writes_spread_into_the_baseline(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    (tmp_path / "perf" / "demo").mkdir(parents=True)
    (tmp_path / "perf" / "demo" / "test_demo.py").write_text(SYNTHETIC)
    keep = tmp_path / "runs"
    code = main(["calibrate", "--runs", "3", "--root", str(tmp_path), "--hardware-id", "cpu-Test-2c", "--write",
                 "--yes", "--include-tainted", "--keep", str(keep), "--", "perf/demo"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "perfgate calibrate: cpu-Test-2c, 3 runs" in out and "proposed" in out
    assert sorted(p.name for p in keep.glob("*.json")) == ["run1.json", "run2.json", "run3.json"]
    doc = json.loads((tmp_path / "baselines" / "cpu-Test-2c" / "demo.json").read_text())
    speed = doc["entries"]["perf/demo/test_demo.py::test_speed"]["speedup"]
    assert speed["summary"]["n"] == 18  # 3 runs x 6 samples, pooled
    assert speed["provenance"].startswith("measured: calibrate")
    spread = speed["spread"]
    assert spread["runs"] == 3 and len(spread["run_medians"]) == 3
    assert spread["proposed_tol"] == pytest.approx(max(0.02, 3 * spread["run_to_run"]))
    assert speed["tol"] == spread["proposed_tol"]
    hit = doc["entries"]["perf/demo/test_demo.py::test_speed"]["hit_rate"]
    assert hit["spread"]["absolute"] is True and hit["spread"]["proposed_tol"] >= 0.01
    # each fresh run is kept in the results store (here the embedded default) under its own name and hash:
    # `perfgate verify-baselines` re-derives the entries of calibrate as it does refresh's (issue 50)
    assert [f"-run{i + 1}-{r['sha256'][:12]}.json.gz" in r["file"] for i, r in enumerate(speed["runs"])] == [True] * 3
    assert main(["verify-baselines", "--root", str(tmp_path)]) == 0
    assert "6 run reference(s) re-derived and equal, 0 not; 0 without a hash" in capsys.readouterr().out


def _saved(tmp_path, name, medians_by_metric):
    path = tmp_path / f"{name}.json"
    results_mod.save(path, _doc(medians_by_metric))
    return path


def test_calibrate_from_saved_runs_judges_each_run_against_the_others(tmp_path, capsys):
    """Three saved runs (say, three leases) of which one reads 20 % lower: calibrate --from proposes
    from their spread and says which held-out run the gate would fail, under the id's own tolerances."""
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    files = [_saved(tmp_path, f"lease{i}", {key: m}) for i, m in enumerate((100, 101, 80))]
    code = main(["calibrate", "--root", str(tmp_path), "--from", *map(str, files)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "perfgate calibrate: cpu-Test-2c, 3 saved runs" in out
    assert "1 would fail" in out and "lease2.json: test_a speedup: worse by +20.4%" in out
    assert "gated: 1 of 1 metrics judged held out (100 %)" in out
    assert "!+20.4%" in out  # the held-out column: lease 2 (80) against leases 0 and 1 pooled (100.5)
    # the id's own tolerances.toml is what the runs are held to (calibrate read only the shared one before)
    (tmp_path / "baselines" / "cpu-Test-2c").mkdir(parents=True)
    (tmp_path / "baselines" / "cpu-Test-2c" / "tolerances.toml").write_text(
        '[overrides]\n"perf/demo/*@speedup" = 0.25\n')
    assert main(["calibrate", "--root", str(tmp_path), "--from", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "0 would fail" in out and "25.0%" in out


def test_a_lease_that_ran_twice_is_held_out_whole_and_weighs_once(tmp_path, capsys):
    """Two leases, the second of which saved two runs (a call cut short, then the rest): holding out one
    of its runs with its twin left in the pool hid most of the move between the leases (-11.6 % against
    the pool of lease A and the twin, inside a 15 % tolerance, where the leases differ by 20 %); it is
    held out with its twin since, against lease A alone."""
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    (tmp_path / "baselines" / "cpu-Test-2c").mkdir(parents=True)
    (tmp_path / "baselines" / "cpu-Test-2c" / "tolerances.toml").write_text(
        '[overrides]\n"perf/demo/*@speedup" = 0.15\n')
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    runs = (("a", 100, "boot-A"), ("b1", 80, "boot-B"), ("b2", 81, "boot-B"))
    six = (0.985, 0.99, 0.995, 1.005, 1.01, 1.015)
    files = [tmp_path / f"{name}.json" for name, _, _ in runs]

    def calibrate(boots: bool) -> str:
        for (name, median, boot), path in zip(runs, files):
            results_mod.save(path, _doc({key: median}, boot_id=boot if boots else None, factors=six))
        assert main(["calibrate", "--root", str(tmp_path), "--from", *map(str, files)]) == 0
        return capsys.readouterr().out

    out = calibrate(boots=False)  # each run held out alone: b1 against a and its twin b2
    assert "sittings" not in out and "0 would fail" in out
    out = calibrate(boots=True)
    assert "the 3 runs come from 2 sittings (boots and days): each run is held out with the others of its sitting" in out
    assert "2 would fail" in out and "b1.json: test_a speedup: worse by +20.0%" in out


def test_calibrate_from_refuses_what_it_cannot_use(tmp_path, capsys):
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    one, two = _saved(tmp_path, "a", {key: 1.0}), _saved(tmp_path, "b", {key: 1.0})
    for argv, says in ((["--from", str(one)], "at least 2 runs"),
                       (["--from", str(one), str(one)], "names a run twice"),
                       (["--runs", "3", "--from", str(one), str(two)], "--runs is for calibrating by running"),
                       (["--from", str(one), str(two), str(tmp_path / "missing.json")], "no such results file")):
        assert main(["calibrate", "--root", str(tmp_path), *argv]) == 2
        assert says in capsys.readouterr().err


def test_calibrate_from_takes_a_copy_once_and_refuses_an_ab_comparison(tmp_path, capsys):
    """A copy of a run under another name is one run (held out against itself it would hide its spread);
    an A/B comparison file holds per-round medians of two environments, not a run."""
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    files = [_saved(tmp_path, f"lease{i}", {key: m}) for i, m in enumerate((100, 101))]
    copy = tmp_path / "copy-of-lease0.json"
    copy.write_bytes(files[0].read_bytes())
    assert main(["calibrate", "--root", str(tmp_path), "--from", *map(str, files), str(copy)]) == 0
    captured = capsys.readouterr()
    assert "has the same content as" in captured.err and ", 2 saved runs," in captured.out
    ab = json.loads(files[1].read_text())
    ab["ab"] = {"rounds": 4}
    (tmp_path / "ab.json").write_text(json.dumps(ab))
    assert main(["calibrate", "--root", str(tmp_path), "--from", str(files[0]), str(tmp_path / "ab.json")]) == 2
    assert "is a `perfgate ab` comparison" in capsys.readouterr().err


def test_calibrate_from_write_names_each_stored_run_as_refresh_does(tmp_path, capsys):
    """--from --write: the pooled entry's run summaries carry each file's store name and content hash,
    so `perfgate verify-baselines` re-derives them from the results store (as it does refresh's)."""
    from perfgate.store import run_store

    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    files = [_saved(tmp_path, f"lease{i}", {key: m}) for i, m in enumerate((100, 101, 99))]
    store = tmp_path / "results-store"
    for f in files:
        run_store.add(store, f)
    stored = sorted((store / "cpu-Test-2c").glob("*.json.gz"))
    assert main(["calibrate", "--root", str(tmp_path), "--from", *map(str, stored), "--write", "--yes"]) == 0
    capsys.readouterr()
    entry = json.loads((tmp_path / "baselines" / "cpu-Test-2c" / "demo.json").read_text())["entries"][key[0]][key[1]]
    assert [r["file"] for r in entry["runs"]] == [f"cpu-Test-2c/lease{i}.json.gz" for i in range(3)]
    assert all(len(r["sha256"]) == 64 for r in entry["runs"])
    assert main(["verify-baselines", str(store), "--root", str(tmp_path)]) == 0
    assert "3 run reference(s) re-derived and equal, 0 not" in capsys.readouterr().out


def test_a_tests_own_tolerance_travels_in_the_results_and_is_what_a_held_out_run_is_judged_at(tmp_path, capsys):
    """perf.record(..., tol=0.25): the results file keeps it (declared_tol) beside the tolerance the run was
    judged at, so calibrate --from, perfgate compare RESULTS and the guard replay judge at 0.25, not the unit's 10 %."""
    from perfgate.judge.gate import Context, evaluate
    from perfgate.judge.baseline_choice import Choice
    from perfgate.judge.metrics import Metric

    judged = evaluate("perf/demo/test_a.py::test_a", Metric("speedup", "x", "higher", summarize([1.0]), tol=0.25),
                      Choice(None, None, False, None), Context.of(Settings(baselines=tmp_path), "cpu-Test-2c"))
    assert judged.declared_tol == 0.25 and judged.to_dict()["declared_tol"] == 0.25
    back = MetricResult.from_dict(judged.to_dict())
    assert back.declared_tol == 0.25 and back.measured().tol == 0.25
    plain = MetricResult.from_dict({k: v for k, v in judged.to_dict().items() if k != "declared_tol"})
    assert plain.declared_tol is None and "declared_tol" not in plain.to_dict()  # older files read as before

    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    key = ("perf/demo/test_a.py::test_a", "speedup", "x")
    files = []
    for i, m in enumerate((100, 101, 80)):
        doc = _doc({key: m})
        doc["results"][0]["declared_tol"] = 0.25
        files.append(tmp_path / f"lease{i}.json")
        results_mod.save(files[-1], doc)
    assert main(["calibrate", "--root", str(tmp_path), "--from", *map(str, files)]) == 0
    out = capsys.readouterr().out
    assert "0 would fail" in out, out  # lease 2 reads -20.4 %: inside the test's own 25 %


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.1, 11.0, True, "0.1"])
def test_a_declared_tolerance_read_back_is_checked(bad):
    d = MetricResult(test_id="perf/demo/test_a.py::test_a", area="demo", metric="speedup", unit="x",
                     better="higher", tol=0.1, gated=True, summary=summarize([1.0]), verdict={}).to_dict()
    d["declared_tol"] = bad
    with pytest.raises(Exception, match="declared_tol is the tolerance the test gave"):
        MetricResult.from_dict(d)
