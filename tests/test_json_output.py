"""``--json`` on `perfgate compare`, `perfgate trends` and `perfgate verify-baselines`: the table's content as
one JSON document, numbers as numbers, the exit status unchanged; and `perfgate compare RESULTS` judging
one results file against the committed baselines, as the run's own gate would.

Real files and the real CLI entry point; the results documents are small ones built here with the
real writer.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.judge.metric_result import MetricResult
from perfgate.judge.metrics import summarize
from perfgate.report.run_report import fmt_number
from perfgate.store import results as results_mod

HW = "1xH200"  # a GPU id: its absolute figures are gated (a cpu-* id only records them)
BW = "perf/a/test_t.py::test_bw"
LAT = "perf/a/test_t.py::test_lat"


def _run(path: Path, *, bw: float, lat: float, created: str, seed: int = 0) -> Path:
    """A results file of two metrics, 7 samples each, ~1 % noise around the given levels."""
    rng = random.Random(seed)

    def samples(level):
        return [level * (1 + rng.gauss(0, 0.01)) for _ in range(7)]

    results = [MetricResult(test_id=BW, area="a", metric="bw", unit="GB/s", better="higher", tol=0.05, gated=True,
                            summary=summarize(samples(bw)), verdict={}),
               MetricResult(test_id=LAT, area="a", metric="lat_ms", unit="ms", better="lower", tol=0.10, gated=True,
                            summary=summarize(samples(lat)), verdict={})]
    doc = results_mod.make_document(results, hardware_id=HW, fingerprint={"software": {"torch": "x"}}, commit="c")
    doc["created"] = created
    results_mod.save(path, doc)
    return path


@pytest.fixture
def project(tmp_path):
    """A reference run and a run whose bandwidth halved (latency unchanged), in a project folder."""
    (tmp_path / "pyproject.toml").write_text("[tool.perfgate]\n")
    before = _run(tmp_path / "before.json", bw=100.0, lat=2.0, created="2026-01-01T00:00:00+00:00")
    after = _run(tmp_path / "after.json", bw=50.0, lat=2.0, created="2026-01-02T00:00:00+00:00", seed=1)
    return tmp_path, before, after


def _json(argv: list[str], capsys) -> tuple[int, dict]:
    code = main(argv)
    out = capsys.readouterr().out
    return code, json.loads(out)  # nothing but the document on stdout


def test_compare_json_holds_every_row_of_the_table_with_its_numbers(project, capsys):
    root, before, after = project
    code, doc = _json(["compare", str(before), str(after), "--root", str(root), "--json"], capsys)
    assert code == 1 and doc["exit_status"] == 1
    assert doc["kind"] == "perfgate-compare" and doc["schema_version"] == 1 and doc["hardware_id"] == HW
    assert doc["reference"] == {"results": str(before)}
    assert doc["summary"]["gated"] == {"metrics": 2, "pass": 1, "regression": 1}
    by_metric = {m["metric"]: m for m in doc["metrics"]}
    bw, lat = by_metric["bw"], by_metric["lat_ms"]
    assert (bw["outcome"], bw["fails"], lat["outcome"], lat["fails"]) == ("regression", True, "pass", False)
    assert bw["change"] == pytest.approx(-0.5, abs=0.03)  # the value's change, as the table's "-50.0%"
    # the same content as the table: each record formats to the table's row
    code = main(["compare", str(before), str(after), "--root", str(root), "--table", "all"])
    table = capsys.readouterr().out
    for m in doc["metrics"]:
        row = [m["test_id"].split("::")[1], m["metric"], fmt_number(m["baseline"]), fmt_number(m["current"]),
               m["unit"], f"{m['change'] * 100:+.1f}%", f"{m['tol'] * 100:.0f}%", m["verdict"]]
        assert all(cell in table for cell in row), (row, table)
    assert code == 1


def test_compare_against_the_committed_baselines_judges_as_the_gate_would(project, capsys):
    """`perfgate compare RESULTS`: the baselines written from the reference run find the same regression
    as comparing the two files."""
    root, before, after = project
    baselines = root / "baselines"
    assert main(["refresh", str(before), "--root", str(root), "--baselines", str(baselines), "--yes"]) == 0
    capsys.readouterr()
    code, doc = _json(["compare", str(after), "--baselines", str(baselines), "--root", str(root), "--json"], capsys)
    assert code == 1 and doc["reference"] == {"baselines": str(baselines)}
    outcomes = {m["metric"]: (m["outcome"], m["baseline_hardware_id"]) for m in doc["metrics"]}
    assert outcomes == {"bw": ("regression", HW), "lat_ms": ("pass", HW)}
    assert main(["compare", str(before), "--baselines", str(baselines), "--root", str(root)]) == 0
    assert "0 regressions in 2 gated metrics" in capsys.readouterr().out
    # a run of a machine without baselines: every metric new, nothing fails
    other = json.loads(after.read_text()) | {"hardware_id": "1xH100-80GB-HBM3"}
    (root / "other.json").write_text(json.dumps(other))
    code, doc = _json(["compare", str(root / "other.json"), "--baselines", str(baselines), "--root", str(root),
                       "--json"], capsys)
    assert code == 0 and {m["outcome"] for m in doc["metrics"]} == {"new"}


def test_compare_refuses_a_baselines_folder_beside_a_reference_file(project, capsys):
    root, before, after = project
    assert main(["compare", str(before), str(after), "--baselines", str(root / "baselines"), "--root", str(root)]) == 2
    assert "--baselines" in capsys.readouterr().err


def _history(folder: Path, levels: list[float]) -> None:
    for i, level in enumerate(levels):
        _run(folder / f"run-{i:02d}.json", bw=level, lat=2.0, created=f"2026-11-{i + 1:02d}T02:00:00+00:00", seed=i)


def test_trends_json_lists_the_change_points_of_the_table(tmp_path, capsys):
    _history(tmp_path, [100.0] * 6 + [80.0] * 5)
    code = main(["trends", str(tmp_path), "--fail-on-worse"])
    table = capsys.readouterr().out
    json_code, doc = _json(["trends", str(tmp_path), "--fail-on-worse", "--json"], capsys)
    assert code == json_code == 1 and doc["exit_status"] == 1 and doc["alarm"] is True
    assert doc["kind"] == "perfgate-trends" and (doc["runs"], doc["series"]) == (11, 2)
    assert doc["left_out"]["says"] in table.splitlines()[0]
    (c,) = doc["change_points"]
    assert (c["test_id"], c["metric"], c["direction"], c["runs_before"], c["runs_after"]) == (BW, "bw", "worse", 6, 5)
    assert c["change"] == pytest.approx(-0.2, abs=0.02) and c["p_value"] < doc["rule"]["max_pvalue"]
    assert f"{c['change']:+.1%}" in table and f"{c['runs_before']}/{c['runs_after']}" in table
    assert c["from_run"] == "2026-11-07T02:00:00+00:00"


def test_verify_baselines_json_counts_and_names_every_problem(project, capsys):
    root, before, after = project
    store, baselines = root / "store", root / "baselines"
    assert main(["refresh", str(before), str(after), "--force", "--root", str(root), "--baselines", str(baselines),
                 "--yes"]) == 0
    assert main(["store", "add", str(before), str(after), "--store", str(store)]) == 0
    capsys.readouterr()
    code, doc = _json(["verify-baselines", str(store), "--baselines", str(baselines), "--root", str(root), "--json"],
                      capsys)
    assert code == 0 and doc["kind"] == "perfgate-verify-baselines"
    assert (doc["checked"], doc["not_equal"], doc["problems"], doc["exit_status"]) == (4, 0, [], 0)
    (store / HW / "after.json.gz").unlink()
    code, doc = _json(["verify-baselines", str(store), "--baselines", str(baselines), "--root", str(root), "--json"],
                      capsys)
    assert code == 1 and (doc["checked"], doc["not_equal"], doc["exit_status"]) == (2, 2, 1)
    assert all(f"missing: {HW}/after.json.gz" in p for p in doc["problems"])
