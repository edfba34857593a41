"""The baseline lifecycle as a user and CI live it, end to end, in fresh processes.

Scenario (issue 7 acceptance): record a baseline on machine A; plant a regression; the
nightly-style run fails and its Markdown summary names the test, the metric, the change
and the verdict; then the machine changes (a new hardware id): refreshing writes a new
baseline folder and leaves machine A's untouched.

The perf test here is synthetic (its samples are made up and scaled by an environment
variable): that is the harness-logic case. Everything else is real: pytest sessions
with the installed plugin (pytester, in-process for speed), the `perfgate` CLI, files on disk.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import textwrap

import pytest

from perfgate.cli import main

SYNTHETIC = textwrap.dedent('''
    import os
    import pytest

    @pytest.mark.cpu
    @pytest.mark.parametrize("size", ["1MiB", "256MiB"])
    def test_copy(perf, size):
        base = {"1MiB": 8.0, "256MiB": 11.7}[size]
        planted = float(os.environ.get("PLANTED_SLOWDOWN", "1.0"))  # 1.25: every sample 25 % slower
        slow = planted if size == "256MiB" else 1.0
        samples = [base / slow * f for f in (1.0, 1.01, 0.99, 1.005, 0.995, 1.002, 0.998)]
        perf.record("busbw_gbps", samples, unit="GB/s", better="higher")
        perf.record("overlap_x", [1.8 / slow * f for f in (1.0, 1.01, 0.99, 1.0, 1.0)], unit="x", better="higher")
''')


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.delenv("PERFGATE_HARDWARE_ID", raising=False)
    monkeypatch.delenv("PLANTED_SLOWDOWN", raising=False)
    tmp_path = pytester.path
    (tmp_path / "pyproject.toml").write_text(textwrap.dedent('''
        [tool.pytest.ini_options]
        addopts = "-p no:cacheprovider"
        [tool.perfgate]
        baselines = "baselines"
        retries = 0
    '''))
    (tmp_path / "perf" / "demo").mkdir(parents=True)
    (tmp_path / "perf" / "demo" / "test_demo.py").write_text(SYNTHETIC)
    return tmp_path


class Run:
    def __init__(self, result):
        self.returncode = int(result.ret)
        self.stdout = "\n".join(result.outlines)
        self.stderr = "\n".join(result.errlines)


def pytest_run(pytester, monkeypatch, *args, env=None):
    """One nightly-style session: `pytest -m cpu perf/ ...` in the project folder."""
    with monkeypatch.context() as m:
        for key, value in (env or {}).items():
            m.setenv(key, value)
        return Run(pytester.runpytest("-m", "cpu", "perf/", "--perf-preflight=off", *args))


def digest(folder):
    return {p.name: (hashlib.sha256(p.read_bytes()).hexdigest(), p.stat().st_mtime_ns)
            for p in sorted(folder.iterdir())}


def test_record_regress_fail_then_refresh_on_new_hardware(project, pytester, monkeypatch, capsys):
    # 1. record a baseline on machine A: a saved run, reviewed and written by `perfgate refresh --yes`
    rec = pytest_run(pytester, monkeypatch, "--perf-hardware-id", "lab-A", "--perf-save", "base.json")
    assert rec.returncode == 0, rec.stdout + rec.stderr
    assert main(["refresh", str(project / "base.json"), "--yes", "--root", str(project)]) == 0
    folder_a = project / "baselines" / "lab-A"
    assert (folder_a / "demo.json").exists()
    before_a = digest(folder_a)

    # 2. nightly-style run with a planted 25 % slowdown of one case: fails, and the summary says why
    bad = pytest_run(pytester, monkeypatch, "--perf-hardware-id", "lab-A", "--perf-save", "results.json",
                     "--perf-markdown", "summary.md", "--perf-history", "history", env={"PLANTED_SLOWDOWN": "1.25"})
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert "2 failed" not in bad.stdout and "1 failed" in bad.stdout  # only the slowed case
    summary = (project / "summary.md").read_text()
    assert "### Regressions" in summary
    regressions = summary.split("### Regressions", 1)[1].split("|", 1)[0]
    assert "perf/demo/test_demo.py::test_copy[256MiB]" in regressions
    assert "busbw_gbps" in regressions and "overlap_x" in regressions
    assert "worse by +20.0%" in regressions  # 1/1.25 = -20 % of a higher-is-better number
    row = next(line for line in summary.splitlines() if line.startswith("| `test_copy[256MiB]` | busbw_gbps"))
    assert "-20.0%" in row and "regression" in row
    assert "1MiB" not in regressions
    doc = json.loads((project / "results.json").read_text())
    outcomes = {(r["test_id"].split("[")[1][:-1], r["metric"]): r["verdict"]["outcome"] for r in doc["results"]}
    assert outcomes[("256MiB", "busbw_gbps")] == "regression" and outcomes[("1MiB", "busbw_gbps")] == "pass"
    # --perf-history pushed this run to the history store (a folder here), the same bytes as --perf-save's
    [kept] = (project / "history" / "lab-A").glob("*.json.gz")
    assert gzip.decompress(kept.read_bytes()) == (project / "results.json").read_bytes()

    # 3. the machine changes: a new hardware id has no baseline, so nothing can regress
    env_b = {"PERFGATE_HARDWARE_ID": "lab-B"}
    new = pytest_run(pytester, monkeypatch, "--perf-save", "b.json", env={**env_b, "PLANTED_SLOWDOWN": "1.25"})
    assert new.returncode == 0, new.stdout + new.stderr
    doc_b = json.loads((project / "b.json").read_text())
    assert doc_b["hardware_id"] == "lab-B" and {r["verdict"]["outcome"] for r in doc_b["results"]} == {"new"}

    # without a terminal and without --yes, refresh shows the diff and writes nothing
    capsys.readouterr()
    assert main(["refresh", str(project / "b.json"), "--root", str(project)]) == 1
    assert not (project / "baselines" / "lab-B").exists()
    assert "lab-B" in capsys.readouterr().out

    # 4. refresh with --yes: a new folder for lab-B; lab-A byte-for-byte untouched, no .prev made there
    assert main(["refresh", str(project / "b.json"), "--yes", "--root", str(project)]) == 0
    written_b = json.loads((project / "baselines" / "lab-B" / "demo.json").read_text())
    assert written_b["hardware_id"] == "lab-B"
    median_b = written_b["entries"]["perf/demo/test_demo.py::test_copy[256MiB]"]["busbw_gbps"]["summary"]["median"]
    assert median_b == pytest.approx(11.7 / 1.25, rel=0.01)
    assert digest(folder_a) == before_a
    assert sorted(p.name for p in (project / "baselines").iterdir()) == ["lab-A", "lab-B"]
