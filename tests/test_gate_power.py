"""`perfgate power --against-baselines`: the gate's own false alarms and detections, counted over real runs.

One real pytest run per repeat and condition, judged against a baseline refreshed here, as CI judges
a run; the knob is an environment variable the demo test reads. The CPU collectives' table made
with it is in docs/lifecycle.md.
"""
from __future__ import annotations

import json
import textwrap

from perfgate.cli import main
from perfgate.judge.metrics import summarize
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry

RATIO_TEST = textwrap.dedent('''
    import os

    def test_ratio(perf):
        k = float(os.environ.get("RATIO_K", "1"))  # the planted slowdown of this demo
        perf.record("time_over_ref", [k * x for x in (1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.0)], unit="x",
                    better="lower")
''')


def test_power_against_baselines_counts_failed_runs_per_condition(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    (tmp_path / "perf" / "demo").mkdir(parents=True)
    (tmp_path / "perf" / "demo" / "test_ratio.py").write_text(RATIO_TEST)
    args = ["perf/demo/test_ratio.py", "-q", "-p", "no:hypothesispytest"]
    BaselineStore(tmp_path / "baselines").write("cpu-Test-2c", "demo", {"perf/demo/test_ratio.py::test_ratio": {
        "time_over_ref": BaselineEntry(unit="x", better="lower", summary=summarize([1.0, 1.01, 0.99, 1.0, 1.02]),
                                       tol=None, provenance="measured")}})
    save = tmp_path / "gate-power.json"
    code = main(["power", "--against-baselines", "--knob", "RATIO_K", "--slowdowns", "2", "--repeats", "1",
                 "--aa-repeats", "1", "--root", str(tmp_path), "--hardware-id", "cpu-Test-2c", "--save", str(save),
                 "--keep", str(tmp_path / "runs"), "--", *args])
    assert code == 0, capsys.readouterr().err
    doc = json.loads(save.read_text())
    assert doc["mode"] == "against-baselines" and doc["complete"]
    assert doc["runs_failed"] == {"A = A": {"failed": 0, "runs": 1}, "x2": {"failed": 1, "runs": 1}}
    (m,) = doc["metrics"]
    assert (m["test"], m["metric"]) == ("test_ratio", "time_over_ref")
    assert (m["A = A"]["regressed"], m["x2"]["regressed"], m["x2"]["tainted"]) == (0, 1, 0)
    assert m["x2"]["worst_change"] == [m["x2"]["worst_change"][0]] and m["x2"]["worst_change"][0] > 0.9
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["repeat1-AeqA.json", "repeat1-x2.json"]
    out = capsys.readouterr().out
    assert "(whole run)" in out and "0/1" in out and "1/1" in out
