"""Bad input, end to end: one clear message naming the file and the fix, a non-zero exit, nothing overwritten.

Every case writes a real bad file (a typo'd marker, a malformed tolerance, a truncated or
future-schema baseline, a results file of another machine, a file that is not GGUF) and
runs the real entry point: a pytest session with the plugin, or the `perfgate` CLI in a
subprocess. Before and after, every file of the project is fingerprinted (bytes and
mtime): a bad input must never cost a baseline or an earlier results file.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import perfgate.machine.preflight  # noqa: F401  (imported here so that in-process pytester runs keep psutil loaded)
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metrics import summarize
from perfgate.store.results import make_document

HW = "cpu-Test-2c"
HWOPT = f"--perf-hardware-id={HW}"

TEST_FILE = """
import pytest

@pytest.mark.cpu
def test_ratio(perf):
    perf.record("speedup", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")
"""


def snapshot(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under root with its mtime and content hash."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and "__pycache__" not in p.parts:
            out[str(p.relative_to(root))] = (p.stat().st_mtime_ns, hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def good_baseline(root: Path) -> Path:
    entry = BaselineEntry(unit="x", better="higher", summary=summarize([1.0, 1.01, 0.99, 1.0, 1.02]), tol=0.1,
                          provenance="measured", when="2026-11-30T00:00:00+00:00", commit="abc")
    return BaselineStore(root / "baselines").write(HW, "test_project", {"test_x.py::test_ratio": {"speedup": entry}})


@pytest.fixture
def project(pytester):
    """A project with a good baseline and an earlier results file, both of which must survive."""
    pytester.makepyfile(test_x=TEST_FILE)
    good_baseline(pytester.path)
    (pytester.path / "earlier.json").write_text('{"kind": "perfgate-results", "earlier": true}\n')
    return pytester


def run_pytest(pytester, *args):
    before = snapshot(pytester.path)
    res = pytester.runpytest(HWOPT, "--perf-save=earlier.json", "--perf-refresh", "-p", "no:cacheprovider", *args)
    return res, before


def assert_untouched(pytester, before, *, allow_new: tuple[str, ...] = ()):
    after = snapshot(pytester.path)
    changed = [k for k in before if after.get(k) != before[k]]
    new = [k for k in after if k not in before and not k.startswith(allow_new)]
    assert changed == [] and new == [], f"changed: {changed}, new: {new}"


def first_error_line(text: str) -> str:
    return next(ln for ln in text.splitlines() if "perfgate" in ln and ("error" in ln.lower() or "ERROR" in ln))


# ---------------------------------------------------------------- pytest sessions


def test_unknown_marker(project):
    project.makepyfile(test_typo="import pytest\n@pytest.mark.gpu8\ndef test_x(perf):\n    pass\n")
    res, before = run_pytest(project, "--strict-markers")
    assert res.ret == pytest.ExitCode.INTERRUPTED  # a collection error: nothing runs
    res.stdout.fnmatch_lines(["*ERROR collecting test_typo.py*", "*'gpu8' not found in `markers`*",
                              "*unknown marker 'gpu8' in test_typo.py; did you mean '8gpu'?*",
                              "*perfgate's markers: cpu, 1gpu, 2gpu*",
                              "*register a marker of your own under [[]tool.pytest.ini_options[]] markers*"])
    assert_untouched(project, before)


@pytest.mark.parametrize("where, text, match", [
    ("pyproject.toml", '[tool.perfgate.tolerances]\nlatency = "fast"\n',
     "*pyproject.toml [[]tool.perfgate[]].tolerances.latency: tolerance must be a number like 0.05, got 'fast'*"),
    ("pyproject.toml", "[tool.perfgate.overrides]\n\"*gloo*\" = -0.1\n",
     "*pyproject.toml [[]tool.perfgate[]].overrides.'[*]gloo[*]': tolerance must be a non-negative finite number*"),
    ("baselines/tolerances.toml", "[tolerances]\nbandwidth = 0.05\nlatency = 0.1.5\n",
     "*baselines/tolerances.toml: not valid TOML*fix the syntax*"),
], ids=["non-numeric", "negative", "unparseable"])
def test_malformed_tolerance_config(project, where, text, match):
    (project.path / where).write_text(text)
    res, before = run_pytest(project)
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"ERROR: perfgate: {match}"])
    assert_untouched(project, before)


@pytest.mark.parametrize("tol, match", [("'5%'", "tol must be a non-negative number, got '5%'"),
                                        ("-0.05", "tol must be a non-negative number, got -0.05")])
def test_bad_tolerance_in_a_test_fails_that_test(project, tol, match):
    project.makepyfile(test_x=TEST_FILE.replace('better="higher")', f'better="higher", tol={tol})'))
    res, before = run_pytest(project)
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["test_x.py:5: *", f"E *MetricError: metric 'speedup': {match}"])
    assert_untouched(project, before)  # nothing was measured: earlier results and baselines stay


@pytest.mark.parametrize("corrupt, match", [
    (lambda text: text[: len(text) // 2], "*not valid JSON*perhaps truncated; restore it from git*"),
    (lambda text: text.replace('"schema_version": 2', '"schema_version": 99'),
     "*schema version 99, this perfgate reads 1 and 2; upgrade perfgate or re-create the file with `perfgate refresh`*"),
], ids=["truncated", "wrong-schema-version"])
def test_bad_baseline_file_stops_the_session_and_is_not_overwritten(project, corrupt, match):
    path = project.path / "baselines" / HW / "test_project.json"
    path.write_text(corrupt(path.read_text()))
    res, before = run_pytest(project)  # --perf-refresh is on: it must not "repair" the file by overwriting it
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"ERROR: perfgate: {path}: {match}"])
    assert_untouched(project, before)


def _write_gguf(path: Path, moe: bool) -> None:
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen3moe")
    w.add_expert_used_count(2)
    if moe:
        for kind in ("gate", "up", "down"):
            w.add_tensor(f"blk.0.ffn_{kind}_exps.weight", np.ones((4, 8, 16), dtype=np.float32))
    else:
        w.add_tensor("blk.0.ffn_down.weight", np.ones((8, 16), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.mark.parametrize("make, match", [
    (lambda p: p.write_text("model weights, honest\n" * 50), "not a readable GGUF file (ValueError: GGUF magic invalid)"),
    (lambda p: (_write_gguf(p, True), p.write_bytes(p.read_bytes()[:-400])), "not a readable GGUF file"),
    (lambda p: _write_gguf(p, False), "GGUF file has no MoE expert tensors"),
], ids=["not-gguf", "truncated-gguf", "dense-gguf"])
def test_expert_file_that_is_not_a_moe_gguf(project, make, match):
    bad = project.path / "model.gguf"
    make(bad)
    res, before = run_pytest(project, "-p", "fixtures.offload_option", f"--perf-expert-file={bad}")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines([f"ERROR: perfgate: --perf-expert-file: {bad}: *"])
    err = res.stderr.str()
    assert match in err and "Pass a GGUF MoE model file" in err and "leave the option out" in err
    assert_untouched(project, before)


def test_a_good_expert_file_is_accepted(project):
    good = project.path / "model.gguf"
    _write_gguf(good, True)
    res, _ = run_pytest(project, "-p", "fixtures.offload_option", f"--perf-expert-file={good}")
    res.assert_outcomes(passed=1)


# ---------------------------------------------------------------- the perfgate CLI


def cli(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "perfgate.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, COLUMNS="200"))


def results_file(path: Path, hardware_id: str, median: float = 1.0) -> Path:
    from perfgate.judge.metric_result import MetricResult

    r = MetricResult(test_id="test_x.py::test_ratio", area="test_project", metric="speedup", unit="x",
                     better="higher", tol=0.1, gated=True, summary=summarize([median * k for k in (1, 1.01, 0.99, 1, 1)]),
                     verdict={"outcome": "new"})
    path.write_text(json.dumps(make_document([r], hardware_id=hardware_id, fingerprint={"software": {}}, commit="c")))
    return path


def test_compare_refuses_results_from_another_machine(tmp_path):
    a = results_file(tmp_path / "a.json", HW)
    b = results_file(tmp_path / "b.json", "2xH200-NV18")
    (tmp_path / "summary.md").write_text("earlier summary\n")
    before = snapshot(tmp_path)
    out = cli(tmp_path, "compare", str(a), str(b), "--markdown", str(tmp_path / "summary.md"))
    assert out.returncode == 2, out
    line = first_error_line(out.stderr)
    assert line.startswith(f"perfgate compare: error: {b} is from hardware id '2xH200-NV18' but {a} is from "
                           f"'{HW}'"), out.stderr
    assert "pass --allow-hardware-mismatch to compare anyway" in line
    assert out.stderr.count("\n") == 1, "one message, not a traceback"
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("command", ["refresh", "compare"])
def test_truncated_results_file(tmp_path, command):
    good = results_file(tmp_path / "good.json", HW)
    bad = tmp_path / "bad.json"
    bad.write_text(good.read_text()[:200])
    good_baseline(tmp_path)
    before = snapshot(tmp_path)
    args = ["refresh", str(bad), "--yes", "--root", str(tmp_path)] if command == "refresh" else \
        ["compare", str(good), str(bad), "--root", str(tmp_path)]
    out = cli(tmp_path, *args)
    assert out.returncode == 2, out
    line = first_error_line(out.stderr)
    assert line.startswith(f"perfgate {command}: error: {bad}: not valid JSON ("), out.stderr
    assert line.endswith("perhaps truncated; re-run with --perf-save"), out.stderr
    assert out.stderr.count("\n") == 1, "one message, not a traceback"
    assert snapshot(tmp_path) == before


def test_refresh_into_a_corrupted_baseline_does_not_overwrite_it(tmp_path):
    path = good_baseline(tmp_path)
    path.write_text(path.read_text().replace('"schema_version": 2', '"schema_version": 3'))
    new = results_file(tmp_path / "new.json", HW, median=2.0)
    before = snapshot(tmp_path)
    out = cli(tmp_path, "refresh", str(new), "--yes", "--root", str(tmp_path))
    assert out.returncode == 2, out
    assert f"{path}: schema version 3, this perfgate reads 1 and 2" in out.stderr and out.stderr.count("\n") == 1
    assert snapshot(tmp_path) == before


# ---------------------------------------------------------------- a machine not fit to measure


def start_detached_burners(n: int) -> list[int]:
    """n busy-looping processes re-parented away from this test (double fork), niced so that
    their CPU time counts as busy without slowing the sessions under test much."""
    code = ("import subprocess, sys\n"
            "burn = 'import os\\nos.nice(19)\\nwhile True: pass'\n"
            f"ps = [subprocess.Popen([sys.executable, '-c', burn], start_new_session=True, stdin=subprocess.DEVNULL, "
            f"stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for _ in range({n})]\n"
            "print(' '.join(str(p.pid) for p in ps))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return [int(p) for p in out.stdout.split()]


def test_busy_machine_taints_results_which_are_then_not_gated(pytester, monkeypatch):
    # Two real CPU burners that are not the session's own processes: the preflight check
    # (perfgate/machine/preflight.py) must see them, label the results tainted, and not fail on them.
    pytester.makepyfile(test_r="""
import os, pytest
@pytest.mark.cpu
def test_ratio(perf):
    k = float(os.environ.get("RATIO_SCALE", "1"))
    perf.record("speedup", [k * x for x in (1.0, 1.01, 0.99, 1.0, 1.02)], unit="x", better="higher")
""")
    pytester.runpytest(HWOPT, "--perf-refresh", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    monkeypatch.setenv("RATIO_SCALE", "0.5")  # a 50 % regression of a gated ratio
    burners = start_detached_burners(2)  # not descendants of this process: "not ours" to the preflight
    try:
        tainted = pytester.runpytest(HWOPT, "--perf-preflight=on", "--perf-save=t.json", "-p", "no:cacheprovider")
        gated = pytester.runpytest(HWOPT, "--perf-preflight=on", "--perf-allow-tainted", "-p", "no:cacheprovider")
    finally:
        for pid in burners:
            os.kill(pid, 9)
    tainted.assert_outcomes(passed=1)  # a regression on a busy machine is reported, not failed
    tainted.stdout.fnmatch_lines(["*machine tainted, metrics not gated (--perf-allow-tainted to gate anyway): *",
                                  "*speedup*worse (tainted)*"])
    doc = json.loads((pytester.path / "t.json").read_text())
    assert doc["results"][0]["tainted"] and doc["results"][0]["gated"] is False
    gated.assert_outcomes(failed=1)  # --perf-allow-tainted: gated anyway, still labelled
    gated.stdout.fnmatch_lines(["*machine tainted, metrics gated anyway (--perf-allow-tainted)*"])
