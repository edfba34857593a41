"""Issue 27, items 2-5: what a hostile user tried beyond the numbers (tests/test_hostile_numbers.py).

2. Inputs that were tracebacks, hangs or out-of-memory kills: a baseline entry with ``runs: [5]``,
   results ``runs`` of the wrong type, ``fingerprint.gpus = 5``, a nesting bomb as a seed file,
   ``/dev/zero``, a FIFO, a huge or a deeply nested file. Each is one line naming the file.
3. Names holding ESC, CR/LF or BEL are printed escaped (perfgate.report.textable.printable).
4. Smaller: --perf-progress, a string schema version, perf.record's booleans and overflowing
   samples, PERFGATE_HARDWARE_ID in `perfgate fingerprint`, `perfgate ab --help`, `python -m perfgate`.
5. The report's baseline column shows the figure the change was computed from.
Real files, the real CLI (in-process through cli.main, or a subprocess where a hang is the risk),
real pytest sessions through pytester.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import gzip
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from perfgate import cli
from perfgate.judge.config import Settings
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import Metric, MetricError, summarize
from perfgate.recorder import PerfRecorder
from perfgate.report import run_report
from perfgate.report.textable import Column, printable, render
from perfgate.store import readers, results as results_mod
from perfgate.judge import pooling
from perfgate.judge.metric_result import MetricResult
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from test_hostile_numbers import (CURRENT_SAMPLES, HW, METRIC, TEST, VALID_BASELINE, VALID_CURRENT,
                                  VALID_REFERENCE, _result)

REPO = Path(__file__).resolve().parents[1]
CONTROL = ("\x1b", "\r", "\x07")


def quiet_main(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def write(path: Path, doc) -> Path:
    path.write_text(json.dumps(doc))
    return path


# ================================================================ 2. tracebacks, hangs, memory


def test_baseline_entry_with_runs_5_stops_the_session_with_one_line(pytester):
    pytester.makepyfile(test_x="""
import pytest

@pytest.mark.cpu
def test_ratio(perf):
    perf.record("speedup", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")
""")
    entry = BaselineEntry(unit="x", better="higher", summary=summarize([1.0] * 5), tol=0.1, provenance="measured")
    path = BaselineStore(pytester.path / "baselines").write(HW, "misc", {"test_x.py::test_ratio": {"speedup": entry}})
    doc = json.loads(path.read_text())
    doc["entries"]["test_x.py::test_ratio"]["speedup"]["runs"] = [5]
    write(path, doc)
    res = pytester.runpytest(f"--perf-hardware-id={HW}", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    line = one_line(res.stderr.str())
    assert f"{path}: entries['test_x.py::test_ratio']['speedup'].runs[0]: must be a table/object, got 5" in line
    assert "INTERNALERROR" not in res.stdout.str() + res.stderr.str()


@pytest.mark.parametrize("command", ["compare", "refresh"])
@pytest.mark.parametrize("damage, key", [
    (lambda d: d["results"][0].__setitem__("runs", "x"), "results[0].runs: must be a list, got 'x'"),
    (lambda d: d["results"][0].__setitem__("runs", [5]), "results[0].runs[0]: must be a table/object, got 5"),
    (lambda d: d["results"][0].__setitem__("runs", [{"median": True}]), "results[0].runs[0].median: must be a "
                                                                         "finite number, got True"),
    (lambda d: d["fingerprint"].__setitem__("gpus", 5), "fingerprint.gpus: must be a list, got 5"),
    (lambda d: d["fingerprint"]["gpus"].__setitem__(0, 5), "fingerprint.gpus[0]: must be a table/object, got 5"),
    (lambda d: d["fingerprint"].__setitem__("cpu", []), "fingerprint.cpu: must be a table/object, got []"),
], ids=["runs-string", "runs-5", "run-median-bool", "gpus-5", "gpu-5", "cpu-list"])
def test_results_of_the_wrong_shape_are_one_line(tmp_path, command, damage, key):
    doc = copy.deepcopy(VALID_REFERENCE)
    damage(doc)
    bad = write(tmp_path / "bad.json", doc)
    good = write(tmp_path / "good.json", VALID_CURRENT)
    argv = ["compare", str(bad), str(good)] if command == "compare" else ["refresh", str(bad), "--yes"]
    rc, _, err = quiet_main(argv + ["--root", str(tmp_path)])
    assert rc == 2
    assert one_line(err).startswith(f"perfgate {command}: error: {bad}: {key}; "), err
    assert not (tmp_path / "baselines").exists()


def test_import_seed_nesting_bomb_is_one_line(tmp_path):
    bomb = tmp_path / "seed.json"
    bomb.write_text("[" * 200_000 + "]" * 200_000)
    rc, _, err = quiet_main(["import", "seed", str(bomb), "--baselines", str(tmp_path / "b"), "--dry-run"])
    assert rc == 2
    assert one_line(err).startswith(f"perfgate import: error: {bomb}: not usable JSON (RecursionError"), err


def test_a_seed_value_that_is_not_finite_is_refused(tmp_path):
    from perfgate.importers.seed import DEFAULT_SEED

    doc = json.loads(DEFAULT_SEED.read_text())
    doc["numbers"][3]["value"] = float("nan")
    seed = write(tmp_path / "seed.json", doc)
    rc, _, err = quiet_main(["import", "seed", str(seed), "--baselines", str(tmp_path / "b"), "--dry-run"])
    assert rc == 2 and f"{seed}: numbers[3].value: must be a finite number, got nan" in one_line(err), err


def test_refresh_of_dev_zero_is_refused_before_reading(tmp_path):
    rc, _, err = quiet_main(["refresh", "/dev/zero", "--yes", "--root", str(tmp_path)])
    assert rc == 2
    assert one_line(err).startswith("perfgate refresh: error: /dev/zero: is a character device, not a regular "
                                    "file; give the path of a file")


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    # a subprocess (a regression would hang the test, not end it), through `python -m perfgate`
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    out = subprocess.run([sys.executable, "-m", "perfgate", "compare", str(fifo), str(fifo), "--root", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert one_line(out.stderr).startswith(f"perfgate compare: error: {fifo}: is a named pipe (FIFO), not a "
                                           f"regular file")


def test_a_folder_is_refused(tmp_path):
    rc, _, err = quiet_main(["compare", str(tmp_path), str(tmp_path), "--root", str(tmp_path)])
    assert rc == 2 and f"{tmp_path}: is a directory, not a regular file" in one_line(err)


def test_files_over_the_size_cap_are_refused(tmp_path, monkeypatch):
    # the cap is 128 MiB (25x the largest real file); a small one here proves the mechanism
    doc = json.dumps(VALID_CURRENT).encode()
    monkeypatch.setattr(readers, "MAX_FILE_BYTES", len(doc) - 1)
    plain = tmp_path / "big.json"
    plain.write_bytes(doc)
    packed = tmp_path / "bomb.json.gz"
    packed.write_bytes(gzip.compress(doc))  # small on disk, over the cap unpacked
    for path, says in ((plain, "is larger than"), (packed, "unpacks to larger than")):
        with pytest.raises(results_mod.ResultsError, match=f"{path}: {says} 0 MiB"):
            results_mod.load(path)
    monkeypatch.setattr(readers, "MAX_FILE_BYTES", len(doc))
    assert results_mod.load(plain)["hardware_id"] == HW


def test_the_size_cap_is_generous_for_every_real_file():
    def size(p: Path) -> int:  # a gzip member ends with its unpacked size (mod 4 GiB)
        return p.stat().st_size if p.suffix != ".gz" else int.from_bytes(p.read_bytes()[-4:], "little")

    largest = max(size(p) for p in [*REPO.glob("tests/data/runs/**/*.json*"), *REPO.glob("baselines/*/*.json")])
    assert largest > 3_000_000  # the files are there (a 3.5 MB CI run of the CPU suite; larger runs: the store)
    assert largest * 10 < readers.MAX_FILE_BYTES


def test_deep_nesting_within_the_recursion_limit_is_refused(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text(json.dumps(dict(VALID_CURRENT, attachments={"x": json.loads("[" * 40 + "]" * 40)})))
    with pytest.raises(results_mod.ResultsError, match="nested deeper than 32 levels"):
        results_mod.load(path)


# ================================================================ 3. names printed escaped


def test_printable_escapes_control_characters_and_keeps_the_rest():
    assert printable("a\x1b[2Jb\r\nc\x07d\u202ee\x7f ok é 中") == "a\\x1b[2Jb\\r\\nc\\x07d\\u202ee\\x7f ok é 中"
    assert printable(printable("\x1b")) == "\\x1b"  # idempotent: nothing it writes needs escaping again


def test_render_escapes_every_cell_header_and_title():
    lines = render([Column("te\x1bst", fold=True, group=True), Column("metric")], [["id\r\n", "m\x07"]],
                   width=40, title="title \x1b[31m")
    text = "\n".join(line.text for line in lines)
    assert not any(c in text for c in CONTROL) and text.count("\n") == len(lines) - 1
    assert "\\x1b[31m" in text and "id\\r\\n" in text and "m\\x07" in text


def _hostile_names(doc: dict) -> dict:
    doc = copy.deepcopy(doc)
    r = doc["results"][0]
    r["test_id"] = "perf/serving/test_x.py::test_\x1b[2Jdecode\r\nFAKE pass"
    r["metric"] = "decode\x07_ms\x1b]0;title\x07"
    r["baseline"]["provenance"] = "measured\x1b[8m hidden"
    return doc


def test_compare_prints_names_escaped(tmp_path):
    a = write(tmp_path / "a.json", _hostile_names(VALID_REFERENCE))
    b = write(tmp_path / "b.json", _hostile_names(VALID_CURRENT))
    md = tmp_path / "summary.md"
    rc, out, err = quiet_main(["compare", str(a), str(b), "--root", str(tmp_path), "--gate", "all", "--strict",
                               "--table", "all", "--markdown", str(md)])
    assert rc == 1, err
    for text in (out, err, md.read_text()):
        assert not any(c in text for c in CONTROL), repr(text)
    assert "test_\\x1b[2Jdecode\\r\\nFAKE pass" in out and "decode\\x07_ms\\x1b]0;title\\x07" in out
    assert "test_\\x1b[2Jdecode\\r\\nFAKE pass" in md.read_text()


def test_refresh_review_table_prints_names_escaped(tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # wide: no name folded at a joint, so each is found whole
    store = BaselineStore(tmp_path / "baselines")
    old = pooling.baseline_entries(_hostile_names(VALID_REFERENCE))["serving"]
    old = {t: {m: dataclasses.replace(e, provenance="measured\x1b[8m hidden") for m, e in ms.items()}
           for t, ms in old.items()}
    store.write(HW, "serving", old)
    new = write(tmp_path / "new.json", _hostile_names(VALID_CURRENT))
    rc, out, err = quiet_main(["refresh", str(new), "--yes", "--root", str(tmp_path)])
    assert rc == 0, err
    assert not any(c in out + err for c in CONTROL), repr(out)
    assert "test_\\x1b[2Jdecode\\r\\nFAKE" in out and "measured\\x1b[8m hidden" in out  # the review a person reads


def test_a_pytest_session_prints_names_escaped(pytester):
    pytester.makepyfile(test_x="""
import pytest

@pytest.mark.cpu
def test_ratio(perf):
    perf.record("speed\\x1b[2J\\x07up\\r\\n", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")
""")
    md = pytester.path / "summary.md"
    res = pytester.runpytest(f"--perf-hardware-id={HW}", "--color=no", "--perf-table=all", "--perf-preflight=off",
                             f"--perf-markdown={md}", "-p", "no:cacheprovider")
    assert res.ret == 0
    text = res.stdout.str()
    assert "speed\\x1b[2J\\x07up\\r\\n" in text and not any(c in text for c in CONTROL)
    # shown escaped, and as Markdown text: its backslashes and [ are literal characters (run_report.md_text)
    assert "speed\\\\x1b\\[2J\\\\x07up\\\\r\\\\n" in md.read_text() and not any(c in md.read_text() for c in CONTROL)


# ================================================================ 4. smaller


@pytest.mark.parametrize("value", ["-1", "soon", "nan", "inf"])
def test_perf_progress_says_what_is_allowed(pytester, value):
    res = pytester.runpytest(f"--perf-progress={value}", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    err = res.stderr.str()
    assert (f"argument --perf-progress: {value!r} is not allowed: give seconds between progress lines as a number "
            f">= 0 (0: after every test), or 'off'") in err
    assert "_progress_interval" not in err


@pytest.mark.parametrize("schema, says", [("1", "'1' (a string; the version is a bare integer such as 1)"),
                                          (True, "True (a boolean; the version is a bare integer such as 1)"),
                                          (1.0, "1.0 (a fractional number; the version is a bare integer such as 1)")])
def test_schema_version_of_the_wrong_type_says_so(tmp_path, schema, says):
    bad = write(tmp_path / "r.json", dict(VALID_CURRENT, schema_version=schema))
    with pytest.raises(results_mod.ResultsError) as info:
        results_mod.load(bad)
    assert str(info.value) == f"{bad}: results schema version {says}, this perfgate reads 1; re-run the suite with " \
                              f"this perfgate"
    base = BaselineStore(tmp_path / "b").path(HW, "serving")
    base.parent.mkdir(parents=True)
    write(base, dict(VALID_BASELINE, schema_version=schema))
    with pytest.raises(ValueError, match=r"schema version .* this perfgate reads 1 and 2"):
        BaselineStore(tmp_path / "b").load(HW, "serving")


@pytest.mark.parametrize("samples, says", [
    (True, "sample True is not a number"), ([1.0, False], "sample False is not a number"),
    (["1.5"], "sample '1.5' is not a number"), ("12", "samples must be a list of numbers"),
    ([1e308, 1e308], "beyond any real measurement"), ([float("nan")], "non-finite sample nan"),
    ([None], "sample None is not a number"),
])
def test_perf_record_refuses_what_is_not_a_measurement(samples, says):
    with pytest.raises(MetricError, match=f"t::x: metric 'm': .*{re.escape(says)}"):
        PerfRecorder("t::x").record("m", samples, unit="ms", better="lower")


def test_perf_record_takes_numpy_scalars_and_refuses_numpy_booleans():
    import numpy as np

    m = PerfRecorder("t::x").record("m", np.array([1.5, 2.5], dtype=np.float32), unit="ms", better="lower")
    assert m.summary.median == 2.0
    assert PerfRecorder("t::x").record("m", np.float32(3.0), unit="ms", better="lower").summary.n == 1
    with pytest.raises(MetricError, match="is not a number"):
        PerfRecorder("t::x").record("m", [np.bool_(True)], unit="ms", better="lower")
    with pytest.raises(MetricError, match="tol must be a non-negative number, got True"):
        PerfRecorder("t::x").record("m", [1.0], unit="ms", better="lower", tol=True)
    with pytest.raises(MetricError, match="tol must be at most 10"):
        PerfRecorder("t::x").record("m", [1.0], unit="ms", better="lower", tol=1e300)


def test_fingerprint_checks_the_id_from_the_environment(monkeypatch):
    monkeypatch.setenv("PERFGATE_HARDWARE_ID", "../x")
    rc, out, err = quiet_main(["fingerprint"])
    assert rc == 2 and out == ""
    assert one_line(err).startswith("perfgate fingerprint: error: PERFGATE_HARDWARE_ID: '../x' is not a valid "
                                    "hardware id")


def test_ab_and_power_help_say_what_the_code_does(capsys):
    for command in ("ab", "power"):
        assert cli.main([command, "--help"]) == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "bootstrap" not in text and "at least 3" not in text
        assert "even" in text and "at least 4" in text, text
    assert cli.main(["ab", "--help"]) == 0
    assert "Student t interval" in " ".join(capsys.readouterr().out.split())


def test_python_dash_m_perfgate_is_the_console_script(tmp_path, monkeypatch):
    # (the FIFO test above runs a command through `python -m perfgate` too)
    monkeypatch.setenv("COLUMNS", "120")
    out = subprocess.run([sys.executable, "-m", "perfgate", "--help"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert out.returncode == 0 and out.stdout == cli.build_parser().format_help()


# ================================================================ 5. the baseline column


def test_report_shows_the_baseline_median_the_change_was_computed_from(tmp_path):
    # pooled samples whose median (483) is not the median of the run medians (427): the change of a
    # current 387.5 is computed from 427, so the row must show 427, not 483
    pooled = [483.0] * 9 + [420.0, 427.0, 440.0]
    runs = tuple({"median": m, "n": 4} for m in (420.0, 427.0, 440.0))
    entry = BaselineEntry(unit="tok/s", better="higher", summary=summarize(pooled), tol=0.05, provenance="measured",
                          runs=runs)
    metric = Metric(name="decode_tok_s", unit="tok/s", better="higher", summary=summarize([387.5] * 7))
    r = evaluate(TEST, metric, Choice(entry, HW, False, None), Context.of(Settings(baselines=tmp_path, gate="all"), HW))
    assert r.baseline["median"] == 483.0 and r.verdict["baseline_median"] == 427.0
    assert r.outcome == "regression" and abs(r.verdict["change"] - (427.0 - 387.5) / 427.0) < 1e-12
    row = run_report.metric_row(r)
    assert row[2:6] == ["427.0", "387.5", "tok/s", "-9.3%"], row
    assert "baseline 427.0 tok/s" in run_report.regression_line(r, None)
    assert any("baseline 427.0 tok/s" in line for line in run_report.regression_detail(r, None, 100))
    assert "| 427.0 | 387.5 | tok/s | -9.3% |" in run_report.markdown([r], hardware_id=HW, commit="c",
                                                                       current_software=None)
    # it travels in the results file, and a saved result without it shows the baseline's median as before
    saved = MetricResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert run_report.metric_row(saved)[2] == "427.0"
    del saved.verdict["baseline_median"]
    assert run_report.metric_row(saved)[2] == "483.0"


def test_results_of_a_run_carry_the_baseline_median(tmp_path):
    a, b = write(tmp_path / "a.json", VALID_REFERENCE), write(tmp_path / "b.json", VALID_CURRENT)
    md = tmp_path / "s.md"
    assert quiet_main(["compare", str(a), str(b), "--root", str(tmp_path), "--gate", "all", "--markdown", str(md)])[0] == 1
    row = next(line for line in md.read_text().splitlines() if f"| {METRIC} |" in line)
    assert "| 0.400 | 2.830 | ms |" in row, row
    assert _result(CURRENT_SAMPLES, runs=False)["results"][0]["summary"]["median"] == 2.83


@pytest.mark.parametrize("value", ["nan", "inf", "0", "-5"])
def test_perf_budget_must_be_a_positive_finite_number(pytester, value):
    res = pytester.runpytest(f"--perf-budget={value}", f"--perf-hardware-id={HW}", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR  # refused as the options are parsed (options.number)
    assert (f"argument --perf-budget: {value!r} is not allowed: give the budget in minutes as a number > 0"
            in res.stderr.str())
