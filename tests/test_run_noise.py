"""Noise by run: the arithmetic (property tests), pooling with per-run summaries, the gate's
effective tolerance, and refresh refusing runs that disagree or come from a dirty tree."""
from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from perfgate.judge import pooling
from perfgate.judge import run_noise
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.cli import main
from perfgate.judge.config import Settings
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import Metric, summarize
from perfgate.judge.run_noise import RunSummary

positive = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False)
run_medians = st.lists(positive, min_size=1, max_size=10)


def runs(medians):
    return [RunSummary(median=m, spread=None, n=5) for m in medians]


@given(run_medians, st.floats(min_value=0, max_value=1), st.floats(min_value=0.5, max_value=5))
def test_effective_tolerance_never_below_configured(medians, configured, k):
    eff = run_noise.effective_tolerance(configured, runs(medians), k=k)
    assert eff >= configured
    if len(medians) < run_noise.MIN_RUNS:
        assert eff == configured  # two points make no spread


@given(st.lists(positive, min_size=3, max_size=10), st.floats(min_value=1e-3, max_value=1e3))
def test_relative_noise_does_not_depend_on_the_unit(medians, scale):
    a = run_noise.effective_tolerance(0.05, runs(medians))
    b = run_noise.effective_tolerance(0.05, runs([m * scale for m in medians]))
    assert a == pytest.approx(b, rel=1e-6)
    assert run_noise.disagreement(medians) == pytest.approx(run_noise.disagreement([m * scale for m in medians]),
                                                           rel=1e-6)


@given(st.lists(positive, min_size=2, max_size=10), st.floats(min_value=0, max_value=2), st.randoms())
def test_disagreement_ignores_order_and_equal_runs_agree(medians, tol, rnd):
    shuffled = list(medians)
    rnd.shuffle(shuffled)
    assert run_noise.disagree(medians, tol) == run_noise.disagree(shuffled, tol)
    assert not run_noise.disagree([medians[0]] * len(medians), tol)
    # a run outside the band of another disagrees; the band edge itself does not
    m = medians[0]
    assert not run_noise.disagree([m, m * (1 + tol)], tol)
    assert run_noise.disagree([m, m * (1 + tol) * 1.01 + 1e-9], tol)


def test_center_is_the_median_of_run_medians_not_of_samples():
    # a run with many samples must not outweigh the others
    assert run_noise.center(runs([100.0, 101.0, 300.0])) == 101.0
    assert run_noise.between_run_spread(runs([100.0, 101.0, 99.0])) == pytest.approx(0.014826, rel=1e-3)


def test_a_sitting_that_ran_twice_weighs_once_in_the_center():
    """Two leases, the second ran twice: its runs are one sitting (one boot id), and the reference level
    is the median of the two leases (10 and 20.25: 15.125), not the twin-heavy median of three runs (20)."""
    def run(median, boot, when="2026-12-05T06:00:00+00:00"):
        return RunSummary(median=median, spread=None, n=5, when=when, host={"boot_id": boot} if boot else {})
    assert run_noise.center([run(10.0, "a"), run(20.0, "b"), run(20.5, "b")]) == pytest.approx(15.125)
    # one boot, another day (a machine up for weeks): another sitting
    assert run_noise.center([run(10.0, "a"), run(20.0, "b"), run(20.5, "b", "2026-12-06T06:00:00+00:00")]) == 20.0
    assert run_noise.center([run(10.0, None), run(20.0, None), run(20.5, None)]) == 20.0  # none recorded: as before
    assert run_noise.center([run(10.0, "a"), run(20.0, None), run(30.0, "a")]) == 20.0  # (20, 20): one sitting + one run


def test_host_identity_reads_what_the_fingerprint_has():
    fp = {"hostname": "node7", "boot_id": "b-1", "gpus": [{"index": 0, "uuid": "GPU-aa"}, {"index": 1}]}
    assert run_noise.host_identity(fp) == {"hostname": "node7", "boot_id": "b-1", "gpu_uuids": ["GPU-aa"]}
    assert run_noise.host_identity(None) == {}


def _doc(created, samples, *, commit="c1", tainted=False, unit="GB/s", gated=True):
    return {"kind": "perfgate-results", "schema_version": 1, "hardware_id": "cpu-Test-2c", "created": created,
            "commit": commit, "fingerprint": {"software": {"torch": "x"}, "hostname": "vm"},
            "results": [{"test_id": "perf/a/test_t.py::t", "area": "a", "metric": "bw", "unit": unit,
                         "better": "higher", "tol": 0.05, "gated": gated,
                         "summary": summarize(samples).to_dict(), "verdict": {},
                         "tainted": ["load 9"] if tainted else []}]}


def test_pool_keeps_one_summary_per_run_and_drops_tainted_runs():
    docs = [_doc("d1", [10.0, 10.2, 9.8]), _doc("d2", [50.0, 51.0, 49.0], tainted=True),
            _doc("d3", [10.1, 10.0, 10.3], commit="c2")]
    pooled = pooling.pool(docs, ["r1.json", "r2.json", "r3.json"])
    (r,) = pooled["results"]
    assert [x["file"] for x in r["runs"]] == ["r1.json", "r3.json"]
    assert r["left_out"] == ["r2.json"] and r["tainted"] == []
    assert max(r["summary"]["samples"]) < 11  # the tainted run's samples are not pooled
    entry = pooling.baseline_entries(pooled)["a"]["perf/a/test_t.py::t"]["bw"]
    assert "pooled over 2 runs" in entry.provenance and "commit c2" in entry.provenance
    assert [x["commit"] for x in entry.runs] == ["c1", "c2"]
    # every run tainted: the metric stays tainted and refresh leaves it out
    all_bad = pooling.pool([_doc("d1", [1.0], tainted=True), _doc("d2", [1.0], tainted=True)], ["a", "b"])
    assert pooling.baseline_entries(all_bad) == {}


def test_baseline_file_keeps_runs_and_reads_schema_1(tmp_path):
    store = BaselineStore(tmp_path)
    entry = pooling.baseline_entries(pooling.pool([_doc("d1", [1.0, 1.1]), _doc("d2", [1.2, 1.0])], ["a", "b"]))
    store.write("hw", "a", entry["a"])
    loaded = store.lookup("hw", "a", "perf/a/test_t.py::t", "bw")
    assert len(loaded.runs) == 2 and loaded.runs[1]["file"] == "b"
    old = json.loads((tmp_path / "hw" / "a.json").read_text())
    assert old["schema_version"] == 2
    old["schema_version"] = 1
    for e in old["entries"].values():
        for m in e.values():
            del m["runs"]
    (tmp_path / "hw" / "a.json").write_text(json.dumps(old))
    assert BaselineStore(tmp_path).lookup("hw", "a", "perf/a/test_t.py::t", "bw").runs == ()


def _entry(run_meds, tol=0.05):
    samples = [m * f for m in run_meds for f in (0.99, 1.0, 1.01)]
    return BaselineEntry(unit="GB/s", better="higher", summary=summarize(samples), tol=tol, provenance="measured",
                         runs=tuple(RunSummary(median=m, spread=0.01, n=3).to_dict() for m in run_meds))


def _metric(samples):
    return Metric(name="bw", unit="GB/s", better="higher", summary=summarize(samples), tol=0.05)


def test_gate_widens_tolerance_to_the_between_run_spread(tmp_path):
    settings = Settings(baselines=tmp_path, gate="all")
    cur = [90.0, 90.5, 89.5, 90.2, 89.8, 90.1, 89.9]  # -10 %, tight within the run
    # runs at 100, 110, 92: between-run spread ~8 %, effective tolerance ~24 %: a -10 % run is normal
    context = Context.of(settings, "cpu-Test-2c")
    r = evaluate("perf/a/test_t.py::t", _metric(cur), Choice(_entry([100.0, 110.0, 92.0]), None, False, None), context)
    assert r.verdict["outcome"] == "pass" and r.tol > 0.2
    # runs that agree (100, 100.5, 99.5): the configured 5 % holds and -10 % is a regression
    r = evaluate("perf/a/test_t.py::t", _metric(cur), Choice(_entry([100.0, 100.5, 99.5]), None, False, None), context)
    assert r.verdict["outcome"] == "regression" and r.tol == 0.05
    assert r.baseline["run_medians"] == [100.0, 100.5, 99.5]


def _project(tmp_path):
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    return tmp_path


def _save(path, doc):
    path.write_text(json.dumps(doc))
    return str(path)


def test_refresh_refuses_runs_that_disagree_unless_forced(tmp_path, capsys):
    root = _project(tmp_path)
    a = _save(tmp_path / "r1.json", _doc("d1", [10.0, 10.1, 9.9]))
    b = _save(tmp_path / "r2.json", _doc("d2", [20.0, 20.1, 19.9]))
    assert main(["refresh", a, b, "--root", str(root), "--yes"]) == 1
    out = capsys.readouterr()
    assert "disagree beyond their tolerance" in out.err and "--force" in out.err
    assert "r1.json" in out.out and "20.0" in out.out  # the runs side by side
    assert not (root / "baselines").exists()
    assert main(["refresh", a, b, "--root", str(root), "--yes", "--force"]) == 0
    # ungated metrics (e.g. absolute timings on CPU) may scatter: no refusal
    c = _save(tmp_path / "r3.json", _doc("d3", [10.0], gated=False))
    d = _save(tmp_path / "r4.json", _doc("d4", [20.0], gated=False))
    assert main(["refresh", c, d, "--root", str(root), "--yes"]) == 0


def test_refresh_refuses_runs_of_machines_that_differ_unless_allowed(tmp_path, capsys):
    """A pooled baseline keeps the newest run's fingerprint: a 32-core run pooled under a 16-core
    fingerprint would be judged as a 16-core one. Runs that differ where the gate compares machines
    are refused, naming the field; a software difference is not one."""
    root = _project(tmp_path)
    big, small = _doc("d1", [10.0, 10.1, 9.9]), _doc("d2", [10.0, 10.1, 9.9])
    big["fingerprint"]["cpu"], small["fingerprint"]["cpu"] = {"cores": 32}, {"cores": 16}
    small["fingerprint"]["software"] = {"torch": "y"}
    a, b = _save(tmp_path / "r1.json", big), _save(tmp_path / "r2.json", small)
    assert main(["refresh", a, b, "--root", str(root), "--yes"]) == 2
    err = capsys.readouterr().err
    assert "machines that differ" in err and "cpu.cores: 32 -> 16 (" in err and "--allow-other-machines" in err
    assert not (root / "baselines").exists()
    assert main(["refresh", a, b, "--root", str(root), "--yes", "--allow-other-machines"]) == 0
    big["fingerprint"]["cpu"] = {"cores": 16}  # the same machine kind, another torch: pooled
    assert main(["refresh", _save(tmp_path / "r1.json", big), b, "--root", str(root), "--yes"]) == 0


def test_refresh_from_a_dirty_tree_needs_a_flag(tmp_path, capsys):
    root = _project(tmp_path)
    a = _save(tmp_path / "r1.json", _doc("d1", [10.0, 10.1], commit="abc-dirty-0123456789"))
    assert main(["refresh", a, "--root", str(root), "--yes"]) == 2
    assert "--allow-dirty" in capsys.readouterr().err
    assert main(["refresh", a, "--root", str(root), "--yes", "--allow-dirty"]) == 0
    doc = json.loads((root / "baselines" / "cpu-Test-2c" / "a.json").read_text())
    assert doc["entries"]["perf/a/test_t.py::t"]["bw"]["commit"] == "abc-dirty-0123456789"


def test_refresh_refuses_an_ab_comparison(tmp_path, capsys):
    root = _project(tmp_path)
    doc = _doc("d1", [10.0, 10.1])
    doc["ab"] = {"rounds": 3}
    assert main(["refresh", _save(tmp_path / "ab.json", doc), "--root", str(root), "--yes"]) == 2
    assert "perfgate ab" in capsys.readouterr().err
