"""The report a person reads, rendered from real results files of the whole CPU suite.

tests/data/runs/cpu-AMD-EPYC-isaunknown-2c/ci-4e77f1c.json.gz is a CI run of the whole CPU suite (743 metrics) with
one real gated regression (the C=8 concurrency-sweep throughput ratio against the
tolerance of that day) and 17 recorded-only gloo timings beyond tolerance; the other ci-*
files are clean runs. Expected counts are computed here from the raw JSON, not through
perfgate.judge.outcomes, so the test checks the report against the data.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate.judge import outcomes
from perfgate.store import results as results_mod
from perfgate.judge.metric_result import metric_results, short_id
from perfgate.report import run_report
from perfgate.report.textable import DEFAULT_LOG_WIDTH, cells, resolve_width

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "tests" / "data" / "runs" / "cpu-AMD-EPYC-isaunknown-2c"
WITH_REGRESSION = RUNS / "ci-4e77f1c.json.gz"
CLEAN = RUNS / "ci-d75f473-no-crosscheck.json.gz"
FIRST_RUN = RUNS / "collectives-training-offload-2026-11-30.json.gz"  # every metric new
WIDTHS = (80, 100, 200)
HEADERS = ("metric", "baseline", "current", "unit", "change", "tol", "verdict")


def load(path: Path):
    doc = results_mod.load(path)
    return doc, metric_results(doc)


def raw_counts(doc: dict) -> dict:
    """Counts straight from the JSON: gated metrics and regressions, recorded-only metrics."""
    rs = doc["results"]
    out = {"gated": sum(1 for r in rs if r["gated"]),
           "gated_regressions": sum(1 for r in rs if r["gated"] and r["verdict"]["outcome"] == "regression"),
           "recorded": sum(1 for r in rs if not r["gated"]),
           "recorded_regression_verdicts": sum(1 for r in rs if not r["gated"]
                                               and r["verdict"]["outcome"] == "regression"), "areas": {}}
    for r in rs:
        a = out["areas"].setdefault(r["area"], {"gated": 0, "recorded": 0})
        a["gated" if r["gated"] else "recorded"] += 1
    return out


def row_pattern(r) -> re.Pattern:
    """The whole cells of one row, in order, on one line: numbers and verdict never split."""
    row = run_report.metric_row(r)
    return re.compile(r"(^|\s)" + r"\s+".join(re.escape(c) for c in row[2:]) + r"$")


def assert_readable(lines: list[str], width: int, shown) -> None:
    for line in lines:
        if line.startswith("    Re-run: pytest '"):
            continue  # a command to copy is never folded
        assert cells(line) <= width, f"{cells(line)} cells > {width}: {line!r}"
        assert "…" not in line
    # a header line carrying every header whole
    assert any(re.search(r"\s+".join(HEADERS), line) for line in lines), "no intact header line"
    # each shown row: its numbers, unit, change, tolerance and verdict whole on one line
    patterns: dict[str, int] = {}
    for r in shown:
        patterns[row_pattern(r).pattern] = patterns.get(row_pattern(r).pattern, 0) + 1
    for pattern, n in patterns.items():
        found = sum(1 for line in lines if re.search(pattern, line))
        assert found >= n, f"{n} row(s) {pattern!r} expected whole on a line, found {found}"
    flat = "".join(line.strip() for line in lines)
    for r in shown:
        sid = short_id(r.test_id)
        assert any(sid in line for line in lines) or sid in flat, sid


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("path", [WITH_REGRESSION, CLEAN], ids=lambda p: p.stem)
def test_terminal_opens_with_verdict_and_area_counts(path, width):
    doc, results = load(path)
    expect = raw_counts(doc)
    lines = [ln.text for ln in run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=width,
                                                            full_table_at="results/summary.md")]
    n = expect["gated_regressions"]
    head = " ".join(lines[:2])
    assert lines[0].startswith(f"perfgate: {n} regression{'' if n == 1 else 's'}")
    assert f"in {expect['gated']} gated metrics;" in head
    assert f"{expect['recorded']} recorded only (not gated on cpu-*)" in head
    # one line (or clause group) per area, right after the verdict, with its own counts
    area_block = "\n".join(lines[1:12])
    for area, c in expect["areas"].items():
        m = re.search(rf"^  {area}\s+gated {c['gated']}\b", area_block, re.M)
        assert m, f"{area} line missing:\n{area_block}"
        if c["recorded"]:
            assert f"recorded only {c['recorded']}:" in area_block
    assert_readable(lines, width, outcomes.attention(results))
    assert lines[-1].startswith("full table: results/summary.md; --perf-table=all")


@pytest.mark.parametrize("width", WIDTHS)
def test_whole_table_never_splits_a_number_at_any_width(width):
    doc, results = load(WITH_REGRESSION)
    lines = [ln.text for ln in run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=width,
                                                            table="all")]
    assert_readable(lines, width, results)


def test_gated_regression_is_in_the_first_lines_and_recorded_changes_are_not_regressions():
    doc, results = load(WITH_REGRESSION)
    expect = raw_counts(doc)
    assert expect["gated_regressions"] == 1 and expect["recorded_regression_verdicts"] > 0
    regressed = next(r for r in results if r.gated and r.outcome == "regression")
    lines = [ln.text for ln in run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=100)]
    top = "\n".join(lines[:12])
    assert short_id(regressed.test_id) in top and regressed.metric in top
    assert re.search(r"\s-37\.3%\s+35%\s+regression$", top, re.M)
    # ungated changes beyond tolerance: their own word, never "regression"
    worse = [r for r in results if not r.gated and r.outcome == "regression"]
    assert {outcomes.label(r) for r in worse} == {"worse (recorded)"}
    full = [ln.text for ln in run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=200,
                                                           table="all")]
    assert sum(1 for line in full if line.endswith("  regression")) == 1
    assert sum(1 for line in full if line.endswith("  worse (recorded)")) == len(worse)


def test_json_summary_counts_recorded_only_apart():
    doc, results = load(WITH_REGRESSION)
    expect = raw_counts(doc)
    s = outcomes.summary(results)
    assert s["gated"]["metrics"] == expect["gated"] and s["gated"]["regression"] == 1
    assert s["recorded_only"]["metrics"] == expect["recorded"]
    assert "regression" not in s["recorded_only"]
    assert s["recorded_only"]["worse"] == expect["recorded_regression_verdicts"]
    assert sum(v for k, v in s["recorded_only"].items() if k != "metrics") == expect["recorded"]
    for area, c in expect["areas"].items():
        assert s["areas"][area]["gated"]["metrics"] == c["gated"]
    json.dumps(s)  # stored in the results JSON as it is


@pytest.mark.parametrize("path", [WITH_REGRESSION, CLEAN, FIRST_RUN], ids=lambda p: p.stem)
def test_markdown_order_and_size(path):
    doc, results = load(path)
    expect = raw_counts(doc)
    md = run_report.markdown(results, hardware_id=doc["hardware_id"], commit=doc["commit"],
                             current_software=(doc.get("fingerprint") or {}).get("software"))
    assert len(md.encode()) < 1024 * 1024  # GitHub's job-summary limit, for the whole suite
    lines = md.splitlines()
    n = expect["gated_regressions"]
    assert lines[0] == f"## perfgate: {doc['hardware_id']}"
    assert lines[2].startswith(f"**perfgate: {n} regression{'' if n == 1 else 's'}") and \
        f"in {expect['gated']} gated metrics; {expect['recorded']} recorded only" in lines[2]
    for area, c in expect["areas"].items():
        assert any(line.startswith(f"| {area} | {c['gated']}") for line in lines[:20]), area
    details = md.index("<details>")
    assert md.index("| area | gated | recorded only |") < details
    if outcomes.attention(results):
        assert md.index("### Needs attention") < details
    full_rows = [line for line in md[details:].splitlines() if line.startswith("| `")]
    assert len(full_rows) == len(results)
    verdict_cells = [line.rsplit("|", 2)[1].strip() for line in md.splitlines() if line.startswith("| `")]
    assert verdict_cells.count("regression") == 2 * n  # attention table + full table, gated only


def test_markdown_shows_the_regression_before_the_full_table():
    doc, results = load(WITH_REGRESSION)
    md = run_report.markdown(results, hardware_id=doc["hardware_id"], commit=doc["commit"], current_software=None)
    before = md[:md.index("<details>")]
    assert "`test_concurrency_sweep[cpu-C=8]` | output_tok_s_vs_c1" in before
    assert "### Regressions" in before and "Re-run: `pytest 'perf/serving/test_concurrency_sweep.py::test_concurrency_sweep[cpu-C=8]'`" in before
    assert before.count("\n") < 30  # first lines: verdict, areas, one attention row, its detail


def test_width_honours_columns_and_a_log_gets_the_default(monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    assert resolve_width(isatty=False, tty_width=None) == DEFAULT_LOG_WIDTH
    assert resolve_width(isatty=True, tty_width=97) == 97
    monkeypatch.setenv("COLUMNS", "80")
    assert resolve_width(isatty=True, tty_width=97) == 80 and resolve_width(isatty=False) == 80


def _cli(*args: str, columns: str | None):
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PYTHONPATH"] = str(ROOT)
    if columns:
        env["COLUMNS"] = columns
    return subprocess.run([sys.executable, "-m", "perfgate.cli", *args, "--root", str(ROOT)], capture_output=True,
                          text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("columns", [None, "80", "100", "200"])
def test_compare_of_a_whole_suite_run_fits_the_width(columns):
    """`perfgate compare` in a pipe (no TTY): was 3950 lines with one-character number columns."""
    old, new = RUNS / "ci-114feea-no-crosscheck.json.gz", WITH_REGRESSION
    out = _cli("compare", str(old), str(new), columns=columns)
    assert out.returncode in (0, 1), out.stderr
    lines = out.stdout.splitlines()
    width = int(columns) if columns else DEFAULT_LOG_WIDTH
    assert lines[0].startswith("perfgate compare:")
    verdict = next(k for k, line in enumerate(lines) if line.startswith("perfgate: "))
    # only the title (folded, its continuation lines indented; long paths fold more) comes before the verdict
    assert all(line.startswith("    ") for line in lines[1:verdict])
    assert re.match(r"perfgate: \d+ regressions? ", lines[verdict])
    assert len(lines) < 120
    for line in lines:
        if not line.startswith("    Re-run: "):
            assert cells(line) <= width, line
    assert any(re.search(r"\s+".join(HEADERS), line) for line in lines)
    same = _cli("compare", str(new), str(new), columns=columns)
    assert same.returncode == 0 and "no metric needs attention (743 recorded)" in same.stdout


def test_compare_into_a_pipe_its_reader_closed_ends_quietly():
    """`perfgate compare A B | head -3`: the reader leaves early. No traceback and no
    'Broken pipe' error, SIGPIPE's exit status (141) as any pipeline writer's."""
    env = dict(os.environ, COLUMNS="200")
    proc = subprocess.Popen([sys.executable, "-m", "perfgate.cli", "compare", str(RUNS / "ci-114feea-no-crosscheck.json.gz"),
                             str(WITH_REGRESSION), "--root", str(ROOT)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env, cwd=ROOT)
    proc.stdout.close()  # the reader is gone before the first line is written
    stderr = proc.stderr.read().decode()
    assert proc.wait(60) == 141, stderr
    assert stderr == "", stderr


def test_refresh_into_a_pipe_that_closes_writes_all_areas_or_none(tmp_path):
    """`perfgate refresh --yes RESULTS | head`: a reader that leaves before the writes ends the
    command before any (SIGPIPE's 141, as any pipeline writer); one that leaves after the first
    'wrote' line must not stop the other areas' writes half way (interrupts.say_while_writing)."""
    run = RUNS / "ci-114feea-no-crosscheck.json.gz"
    doc = results_mod.load(run)
    areas = {r["area"] for r in doc["results"]}
    assert len(areas) > 1

    def refresh(out: Path) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "perfgate.cli", "refresh", str(run), "--yes", "--root",
                                 str(ROOT), "--baselines", str(out)], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, COLUMNS="200"), cwd=ROOT)

    def written(out: Path) -> set[str]:
        return {f.stem for f in (out / doc["hardware_id"]).glob("*.json")}

    early = refresh(tmp_path / "early")
    early.stdout.close()  # gone before the diff table
    assert early.wait(60) == 141, early.stderr.read().decode()
    assert written(tmp_path / "early") == set()
    late = refresh(tmp_path / "late")
    for line in late.stdout:
        if line.startswith(b"wrote "):
            break
    late.stdout.close()  # gone after the first 'wrote' line
    assert late.wait(60) in (0, 141), late.stderr.read().decode()
    assert written(tmp_path / "late") == areas


PROJECT = """
import os, pytest

@pytest.mark.cpu
def test_bw(perf):
    k = float(os.environ.get("BW_SCALE", "1"))
    perf.record("busbw_gbps", [k * x for x in (10.0, 10.1, 9.9, 10.05, 9.95, 10.02)], unit="GB/s", better="higher")

@pytest.mark.cpu
def test_ratio(perf):
    k = float(os.environ.get("RATIO_SCALE", "1"))
    perf.record("speedup", [k * x for x in (2.0, 2.02, 1.98, 2.01, 1.99)], unit="x", better="higher")
"""


def test_plugin_section_opens_with_the_verdict(pytester, monkeypatch):
    pytester.makepyfile(test_synth=PROJECT)
    hw = "--perf-hardware-id=cpu-Test-2c"
    pytester.runpytest(hw, "--perf-refresh", "-p", "no:cacheprovider").assert_outcomes(passed=2)
    monkeypatch.setenv("BW_SCALE", "0.5")   # recorded only on cpu-*: worse, not a regression
    monkeypatch.setenv("RATIO_SCALE", "0.5")  # gated: a regression
    monkeypatch.setenv("COLUMNS", "80")
    res = pytester.runpytest(hw, "--perf-save=r.json", "--perf-markdown=s.md", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1, failed=1)
    out = res.stdout.lines
    start = next(k for k, line in enumerate(out) if re.match(r"=+ perfgate =+$", line))
    assert out[start + 1] == "perfgate: 1 regression in 1 gated metric; 1 recorded only (not gated on cpu-*)"
    assert out[start + 2].split() == ["misc", "gated", "1:", "1", "regression;", "recorded", "only",
                                      "1:", "1", "worse"]
    section = "\n".join(out[start:])
    assert "speedup" in section and "busbw_gbps" not in section.split("full table:")[0].split("REGRESSION")[0]
    assert "full table: s.md; --perf-table=all prints it here" in section
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["summary"]["gated"] == {"metrics": 1, "regression": 1}
    assert doc["summary"]["recorded_only"] == {"metrics": 1, "worse": 1}
    assert {r["verdict"]["outcome"] for r in doc["results"]} == {"regression"}  # verdicts kept as they are
    assert (pytester.path / "s.md").read_text().splitlines()[2].startswith("**perfgate: 1 regression in 1 gated")
    every = pytester.runpytest(hw, "--perf-table=all", "-p", "no:cacheprovider")
    every.stdout.fnmatch_lines(["*all 2 metrics of cpu-Test-2c:*", "*busbw_gbps*worse (recorded)",
                                "*speedup*regression"])


def _check_table_lines(lines: list[str], width: int, headers: tuple[str, ...], rows: list[list[str]],
                       whole_from: int) -> None:
    """Every line within width; headers whole on one line (or as ``header:`` items of cards);
    the whole cells of every row (from column ``whole_from``) together on one line."""
    for line in lines:
        assert cells(line) <= width, f"{cells(line)} > {width}: {line!r}"
    text = "\n".join(lines)
    table_header = any(re.search(r"\s+".join(map(re.escape, headers)), line) for line in lines)
    assert table_header or all(f"{h}: " in text for h in headers)
    for row in rows:
        tail = row[whole_from:]
        as_table = re.compile(r"\s+".join(re.escape(c) for c in tail) + r"$", re.M)
        as_cards = [f"{h}: {c}" for h, c in zip(headers[-len(tail):], tail)]
        assert as_table.search(text) or all(item in text for item in as_cards), row


@pytest.mark.parametrize("width", WIDTHS)
def test_calibrate_table_from_ten_real_runs(width):
    from perfgate.commands import calibrate as cal
    from perfgate.store.settings import load_settings

    docs = [results_mod.load(p) for p in sorted(RUNS.glob("ten-run-check-r*.json.gz"))]
    assert len(docs) == 10
    settings = load_settings(ROOT, hardware_id=docs[0]["hardware_id"])
    cals = cal.calibrate_docs(docs, settings, k=3, floor=0.02, fraction_floor=0.01)
    lines = [ln.text for ln in cal.table(cals, alpha=0.01, power=0.8, title="calibrate", width=width)]
    headers = tuple(c.header for c in cal.COLUMNS[2:])
    rows, _ = cal.table_rows(cals, alpha=0.01, power=0.8)
    _check_table_lines(lines, width, headers, rows, 2)


@pytest.mark.parametrize("width", WIDTHS)
def test_refresh_diff_of_a_whole_suite_run(width, tmp_path):
    """`perfgate refresh` of a whole-suite run against the committed CPU baselines, in a pipe."""
    out = subprocess.run([sys.executable, "-m", "perfgate.cli", "refresh", str(WITH_REGRESSION), "--root", str(ROOT),
                          "--baselines", str(ROOT / "baselines")], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": str(width)}, stdin=subprocess.DEVNULL)
    assert out.returncode == 1 and "not written: pass --yes" in out.stderr  # no terminal: shows, writes nothing
    lines = out.stdout.splitlines()
    doc = results_mod.load(WITH_REGRESSION)
    rows = [[run_report.fmt_number(r["summary"]["median"]), r["unit"]] for r in doc["results"]]
    for line in lines:
        assert cells(line) <= width, line
    text = "\n".join(lines)
    assert any(re.search(r"metric\s+old\s+new\s+unit\s+change", line) for line in lines)
    for new, unit in rows:  # the new value and its unit, whole and side by side
        assert re.search(rf"\s{re.escape(new)}\s+{re.escape(unit)}\s", text + " "), (new, unit)


def test_the_report_guide_shows_the_render_of_its_named_results_file():
    """docs/reading-the-report.md's example is this file's render at 100 columns, not a sketch."""
    guide = (ROOT / "docs" / "reading-the-report.md").read_text()
    section = guide.split("## An example", 1)[1]
    assert "tests/data/runs/cpu-AMD-EPYC-isaunknown-2c/ci-4e77f1c.json.gz" in section.split("```", 1)[0]
    block = section.split("```\n", 2)[1].rstrip("\n").split("\n```")[0]
    doc, results = load(WITH_REGRESSION)
    lines = run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=100,
                                      full_table_at="results/summary.md",
                                      current_software=doc["fingerprint"]["software"])
    assert block == "\n".join(ln.text for ln in lines)


def test_an_outcome_added_later_is_counted_listed_and_never_capped():
    """Outcomes other helpers add (identity's not-comparable, say) need no change here."""
    import dataclasses

    doc, results = load(CLEAN)
    k = next(i for i, r in enumerate(results) if r.gated and r.outcome == "pass")
    results[k] = dataclasses.replace(results[k], verdict=dict(results[k].verdict, outcome="not-comparable"))
    s = outcomes.summary(results)
    assert s["gated"]["not-comparable"] == 1
    lines = [ln.text for ln in run_report.terminal_lines(results, hardware_id=doc["hardware_id"], width=80)]
    assert "1 not-comparable" in lines[0] + lines[1]
    assert any(line.endswith("  not-comparable") for line in lines)
    att = outcomes.attention(results)
    assert outcomes.may_fail(results[k])
    assert [r.outcome for r in att if r.gated][:3] == ["noisy", "not-comparable", "improved"]  # after noisy


def test_markdown_notes_follow_the_verdict():
    doc, results = load(CLEAN)
    md = run_report.markdown(results, hardware_id=doc["hardware_id"], commit=doc["commit"], current_software=None,
                             notes=["machine tainted, metrics not gated (--perf-allow-tainted to gate anyway): load"])
    assert md.splitlines()[4] == "> machine tainted, metrics not gated (--perf-allow-tainted to gate anyway): load"


def test_markdown_of_a_suite_twenty_times_larger_stays_within_the_limit():
    """The GPU suites may grow past the CPU suite: the collapsed table is cut, never the head."""
    import dataclasses

    doc, results = load(WITH_REGRESSION)
    many = [dataclasses.replace(r, test_id=f"{r.test_id}-copy{k}") for k in range(20) for r in results]
    md = run_report.markdown(many, hardware_id=doc["hardware_id"], commit=doc["commit"], current_software=None)
    assert len(md.encode()) <= run_report.MARKDOWN_LIMIT_BYTES
    assert md.splitlines()[2].startswith("**perfgate: 20 regressions in 4020 gated metrics")
    assert "more rows left out to stay within GitHub's job-summary size limit" in md
    assert md.rstrip().endswith("</details>")
