"""Interrupts, for real: SIGINT/SIGTERM into a running pytest session and into `perfgate refresh`,
a SIGKILLed launcher, and concurrent refreshes of one baseline file.

What must hold: results of the tests that finished are saved and marked interrupted; a
baseline file is always either the old one or the complete new one; no rank of a running
job survives; parallel refreshes lose no entry (the file lock in baselines.py).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metrics import summarize
from perfgate.store.results import make_document
from perfgate.judge.metric_result import MetricResult
from test_faults_launch import leftovers, report_row

HERE = Path(__file__).resolve().parent
HW = "cpu-Test-2c"
# The ranks import test_faults_launch from here, and the same perfgate as this test (not another checkout's).
RANK_PYTHONPATH = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)


def wait_for(predicate, timeout_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if proc is not None and proc.poll() is not None:
            out = proc.stdout.read() if proc.stdout else ""
            raise AssertionError(f"process ended (code {proc.returncode}) before {what}:\n{out[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.05)


def _ctrl_c_enabled() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def entry(median: float) -> BaselineEntry:
    return BaselineEntry(unit="x", better="higher", summary=summarize([median * k for k in (1, 1.01, 0.99, 1, 1)]),
                         tol=0.1, provenance="measured", when="2026-11-30T00:00:00+00:00", commit="old")


# ---------------------------------------------------------------- a running pytest session

SESSION = """
import os, pytest
from pathlib import Path
from perfgate.launch.jobs import launch

@pytest.mark.cpu
@pytest.mark.parametrize("i", range(3))
def test_quick(perf, i):
    perf.record("speedup", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")

@pytest.mark.cpu
def test_long(perf):
    if {with_job}:
        # a real 2-rank job that never finishes (rank 1 stops at step 3): running when the signal comes
        launch("test_faults_launch:allreduce_steps", {{"pid_dir": {pid_dir!r}, "steps": 10**9}}, world_size=2,
               timeout_s=300, env={{"PYTHONPATH": {tests!r}, "PERFGATE_TEST_FAULT": "hang@1:step 3"}})
    else:
        Path({pid_dir!r}, "sleeping").write_text("")
        import time
        time.sleep(300)
    perf.record("never", [1.0] * 5, unit="x", better="higher")
"""


@pytest.mark.parametrize("sig, with_job", [(signal.SIGINT, False), (signal.SIGTERM, True)],
                         ids=["SIGINT-in-a-sleeping-test", "SIGTERM-during-a-2-rank-job"])
def test_signal_during_a_run_saves_results_so_far_and_kills_the_job(pytester, sig, with_job):
    pid_dir = pytester.path / "pids"
    pid_dir.mkdir()
    pytester.makepyfile(test_session=SESSION.format(pid_dir=str(pid_dir), tests=RANK_PYTHONPATH, with_job=with_job))
    # an old baseline that a refresh from a partial run must not replace
    store = BaselineStore(pytester.path / "baselines")
    old = store.write(HW, "misc",  # the area of tests outside perf/<area>/
                      {"test_session.py::test_quick[0]": {"speedup": entry(2.0)}})
    old_bytes = old.read_bytes()
    # preexec_fn: Ctrl-C enabled in the session whatever this process inherited. A shell script's
    # background job (`cmd &`) starts with SIGINT ignored, children inherit that, and Python then
    # installs no KeyboardInterrupt handler: the session would sleep through the signal (seen when
    # CI itself was started as such a job). That is the caller's choice, not perfgate's to test.
    proc = subprocess.Popen([sys.executable, "-m", "pytest", f"--perf-hardware-id={HW}", "--perf-save=r.json",
                             "--perf-refresh", "-p", "no:cacheprovider", "-q", "test_session.py"],
                            cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=_ctrl_c_enabled)
    try:
        # the last test is running (both ranks of its job are up and stuck in the collective): interrupt now
        wait_for(lambda: len(list(pid_dir.glob("rank*.pids"))) == 2 if with_job else (pid_dir / "sleeping").exists(),
                 120, "the long test to start", proc)
        rank_pids = [int(f.read_text().split()[0]) for f in pid_dir.glob("rank*.pids")]
        time.sleep(0.5)
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, out
    doc = json.loads((pytester.path / "r.json").read_text())
    assert doc["interrupted"] is True
    assert sorted(r["test_id"] for r in doc["results"]) == [f"test_session.py::test_quick[{i}]" for i in range(3)]
    assert "run interrupted: results of the 3 finished test(s) saved to r.json" in out, out
    assert "run was interrupted: baselines NOT refreshed" in out, out
    assert old.read_bytes() == old_bytes  # the partial run did not touch the baseline
    left = leftovers(pid_dir, rank_pids)
    report_row(f"{sig.name} to pytest " + ("during a 2-rank job" if with_job else "in a running test"), took,
               next(ln for ln in out.splitlines() if "run interrupted" in ln), left)
    assert left == []


def test_launcher_killed_with_sigkill_takes_its_ranks_along(tmp_path):
    # SIGKILL skips every finally clause: the ranks notice their launcher is gone and kill their groups
    script = tmp_path / "launcher.py"
    script.write_text(textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(HERE)!r})
        from perfgate.launch.jobs import launch
        launch("test_faults_launch:allreduce_steps", {{"pid_dir": {str(tmp_path)!r}, "steps": 10**9}},
               world_size=2, timeout_s=300, env={{"PYTHONPATH": {RANK_PYTHONPATH!r}, "PERFGATE_TEST_FAULT": "hang@1:step 3"}})
    """))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for(lambda: len(list(tmp_path.glob("rank*.pids"))) == 2, 120, "both ranks to start", proc)
    finally:
        t0 = time.monotonic()
        proc.kill()
        proc.wait(10)
    rank_pids = [int(f.read_text().split()[0]) for f in tmp_path.glob("rank*.pids")]
    left = leftovers(tmp_path, rank_pids)
    deadline = time.monotonic() + 15
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = leftovers(tmp_path, rank_pids)
    took = time.monotonic() - t0
    report_row("launcher SIGKILLed during a 2-rank job", took, "(launcher gone; ranks kill their own groups)", left)
    assert left == []
    assert took < 10


# ---------------------------------------------------------------- perfgate refresh

AREAS = ("a1", "a2", "a3", "a4")


def results_doc(path: Path, tests: dict[str, float], padding: int) -> Path:
    """A results file; ``padding`` floats in the fingerprint make every baseline write take a while."""
    results = [MetricResult(test_id=t, area=area, metric="speedup", unit="x", better="higher", tol=0.1, gated=True,
                            summary=summarize([m * k for k in (1, 1.01, 0.99, 1, 1)]), verdict={"outcome": "new"})
               for area in AREAS for t, m in ((f"perf/{area}/{name}", m) for name, m in tests.items())]
    fingerprint = {"software": {"torch": "test"}, "padding": [i * 0.5 for i in range(padding)]}
    path.write_text(json.dumps(make_document(results, hardware_id=HW, fingerprint=fingerprint, commit="new")))
    return path


def refresh_cmd(results: Path, root: Path) -> list[str]:
    return [sys.executable, "-m", "perfgate.cli", "refresh", str(results), "--yes", "--root", str(root)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_during_refresh_completes_the_write_and_exits_0(tmp_path, sig):
    # `perfgate refresh` holds signals while it writes (perfgate.interrupts): a signal after the
    # first area is written waits until every area is complete, and the exit code says the
    # write completed (0), with one line saying the signal waited. Never some areas new, some old.
    store = BaselineStore(tmp_path / "baselines")
    for area in AREAS:
        store.write(HW, area, {f"perf/{area}/test_old": {"speedup": entry(1.0)}})
    old = {area: store.path(HW, area).read_bytes() for area in AREAS}
    new = results_doc(tmp_path / "new.json", {"test_new": 3.0}, padding=250_000)
    proc = subprocess.Popen(refresh_cmd(new, tmp_path), cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    lines: list[str] = []
    try:
        for line in proc.stdout:  # interrupt right after the first area is written: the next is in progress
            lines.append(line)
            if line.startswith("wrote "):
                break
        t0 = time.monotonic()
        proc.send_signal(sig)
        out, _ = proc.communicate(timeout=60)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    out = "".join(lines) + out
    assert proc.returncode == 0, out
    assert out.count("wrote ") == len(AREAS), out
    note = [ln for ln in out.splitlines() if ln.startswith("perfgate: ")]
    assert note == [f"perfgate: {sig.name} arrived while the baselines in {tmp_path / 'baselines' / HW} were "
                    f"written; the writes were completed first"], out
    for area in AREAS:
        path = store.path(HW, area)
        doc = json.loads(path.read_text())
        assert sorted(doc["entries"]) == [f"perf/{area}/test_new", f"perf/{area}/test_old"]  # complete merge
        assert json.loads(Path(str(path) + ".prev").read_bytes()) == json.loads(old[area])
    temp_files = sorted(p.name for p in (tmp_path / "baselines" / HW).glob(".*.tmp"))
    assert temp_files == []
    report_row(f"{sig.name} to `perfgate refresh` mid-write", took,
               f"exit {proc.returncode}; {len(AREAS)}/{len(AREAS)} areas complete-new (signal held until the "
               f"write completed); temp files left: {len(temp_files)}", [])


def test_concurrent_refreshes_lose_no_entries(tmp_path):
    # four `perfgate refresh` processes merging into the same baseline files at the same time
    n = 4
    (tmp_path / "baselines").mkdir()  # refresh creates a baselines folder only where one is named
    files = [results_doc(tmp_path / f"r{i}.json", {f"test_{i}": 1.0 + i}, padding=40_000) for i in range(n)]
    procs = [subprocess.Popen(refresh_cmd(f, tmp_path), cwd=tmp_path, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for f in files]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    store = BaselineStore(tmp_path / "baselines")
    for area in AREAS:
        entries = store.load(HW, area)
        assert sorted(entries) == sorted(f"perf/{area}/test_{i}" for i in range(n)), area
        assert entries[f"perf/{area}/test_3"]["speedup"].summary.median == pytest.approx(4.0)


PARALLEL = """
import pytest
@pytest.mark.cpu
@pytest.mark.parametrize("i", range(3))
def test_{name}(perf, i):
    perf.record("speedup", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")
"""


def test_concurrent_pytest_refreshes_lose_no_entries(pytester):
    # two sessions refresh the same area at once (CI shards on one runner). Within one session,
    # xdist workers never write: only the controller does (tests/test_plugin_e2e.py covers -n).
    pytester.makepyfile(test_left=PARALLEL.format(name="left"), test_right=PARALLEL.format(name="right"))
    base = [sys.executable, "-m", "pytest", f"--perf-hardware-id={HW}", "--perf-refresh", "-p", "no:cacheprovider", "-q"]
    procs = [subprocess.Popen(base + [name], cwd=pytester.path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for name in ("test_left.py", "test_right.py")]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    files = list((pytester.path / "baselines" / HW).glob("*.json"))
    assert len(files) == 1, files
    entries = json.loads(files[0].read_text())["entries"]
    assert sorted(entries) == sorted(f"test_{side}.py::test_{side}[{i}]" for side in ("left", "right") for i in range(3))


def test_a_second_signal_while_results_are_written_does_not_lose_them(pytester):
    # The signal is real; only its timing is arranged: a conftest sends SIGINT to the session
    # from inside the results writer, i.e. after the run, while the file is being written.
    pytester.makeconftest("""
import os, signal, time
import perfgate.store.results as results

_save = results.save

def save_interrupted(path, doc):
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)  # the signal is delivered here
    _save(path, doc)

results.save = save_interrupted
""")
    pytester.makepyfile(test_x="""
import pytest
@pytest.mark.cpu
def test_ratio(perf):
    perf.record("speedup", [1.0, 1.01, 0.99, 1.0, 1.02], unit="x", better="higher")
""")
    res = pytester.runpytest_subprocess(f"--perf-hardware-id={HW}", "--perf-save=r.json", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    doc = json.loads((pytester.path / "r.json").read_text())
    assert [r["test_id"] for r in doc["results"]] == ["test_x.py::test_ratio"]
    res.stdout.fnmatch_lines(["*SIGINT arrived while results were being written and reported; they were "
                              "completed first*"])


# ---------------------------------------------------------------- issue 49: a Ctrl-C as a refresh finishes

FINISH_CONFTEST = """
import os, signal, time
import pytest
import perfgate.store.atomic as atomic
import perfgate.store.baseline_writer as writer

AT = os.environ["PERFGATE_TEST_SIGINT_AT"]


def sigint(where):
    if AT == where:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.2)  # a real SIGINT, delivered here


_write_baselines, _write_all = writer.write_baselines, atomic._write_all


def write_baselines(*args, **kwargs):
    sigint("before the write")
    written = _write_baselines(*args, **kwargs)
    sigint("after the write")
    return written


def write_all(fd, data):  # each file of the write, .prev first: between its bytes and its rename
    sigint("during the write")
    _write_all(fd, data)


writer.write_baselines, atomic._write_all = write_baselines, write_all


class Before:
    @pytest.hookimpl(tryfirst=True)
    def pytest_terminal_summary(self):
        sigint("in another plugin's summary, before perfgate's")


class After:
    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self):
        sigint("in another plugin's summary, after perfgate's")


def pytest_configure(config):
    config.pluginmanager.register(Before())
    config.pluginmanager.register(After())
"""
POINTS = ["before the write", "during the write", "after the write", "in another plugin's summary, before perfgate's",
          "in another plugin's summary, after perfgate's"]


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(root), *args],
                          check=True, capture_output=True, text=True).stdout


@pytest.mark.parametrize("point", POINTS)
def test_sigint_as_a_perf_refresh_finishes_never_hides_what_was_written(pytester, monkeypatch, point):
    # The reproduction: SIGINT the moment the committed baseline changed; the KeyboardInterrupt
    # landed in another plugin's terminal summary and perfgate's report never printed. Now SIGINT/SIGTERM
    # wait from perfgate's sessionfinish until its report is out, at every point of the finish.
    pytester.makeconftest(FINISH_CONFTEST)
    pytester.makepyfile(test_x=PARALLEL.format(name="x"))
    store = BaselineStore(pytester.path / "baselines")
    old = store.write(HW, "misc", {"test_x.py::test_x[0]": {"speedup": entry(1.0)}})
    _git(pytester.path, "init", "-q")
    _git(pytester.path, "add", "-A")
    _git(pytester.path, "commit", "-q", "-m", "old baselines")
    monkeypatch.setenv("PERFGATE_TEST_SIGINT_AT", point)
    res = pytester.runpytest_subprocess(f"--perf-hardware-id={HW}", "--perf-refresh", "-p", "no:cacheprovider")
    out = res.stdout.str()
    assert f"refreshed baselines: {old}" in out, out  # perfgate's report, naming what was written
    entries = json.loads(old.read_text())["entries"]  # complete: every test of the run, the old one replaced
    assert sorted(entries) == [f"test_x.py::test_x[{i}]" for i in range(3)], out
    if point != POINTS[-1]:  # after perfgate's report, a Ctrl-C is the other plugin's and pytest's to report
        assert res.ret == 0, out
        assert "SIGINT arrived while results were being written and reported; they were completed first" in out
    # nothing perfgate wrote or left is untracked noise: the lock file, .prev and temp files are ignored
    # (pytester's own files beside them are not perfgate's)
    assert _git(pytester.path, "status", "--porcelain", "--untracked-files=all", "--", "baselines").splitlines() \
        == [f" M baselines/{HW}/misc.json"]


KILLED_WRITER = """
import os, signal, sys
import perfgate.store.atomic as atomic
from perfgate.judge.metrics import summarize
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry

def killed(fd, data):  # kill -9 half way through the .prev copy: no cleanup runs
    os.write(fd, data[: len(data) // 2])
    os.kill(os.getpid(), signal.SIGKILL)

atomic._write_all = killed
e = BaselineEntry(unit="x", better="higher", summary=summarize([3.0] * 5), tol=0.1, provenance="measured")
BaselineStore(sys.argv[1]).write("{hw}", "misc", {{"test_new": {{"speedup": e}}}})
"""


def test_a_write_killed_during_the_prev_copy_leaves_no_noise_and_the_next_write_cleans_up(tmp_path):
    store = BaselineStore(tmp_path / "baselines")
    path = store.write(HW, "misc", {"test_old": {"speedup": entry(2.0)}})
    committed = path.read_bytes()
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", "-A")
    _git(tmp_path, "commit", "-q", "-m", "old")
    script = tmp_path.parent / f"{tmp_path.name}-killed.py"  # outside the tree under test
    script.write_text(KILLED_WRITER.format(hw=HW))
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "baselines")], capture_output=True, text=True)
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    left = sorted(p.name for p in path.parent.glob(".*.tmp"))
    assert len(left) == 1 and left[0].startswith(".misc.json.prev."), left  # what the issue found
    assert path.read_bytes() == committed
    assert _git(tmp_path, "status", "--porcelain", "--untracked-files=all") == ""  # ignored, not noise
    store.write(HW, "misc", {"test_new": {"speedup": entry(3.0)}})  # the next write cleans it
    assert sorted(p.name for p in path.parent.glob(".*.tmp")) == []
    assert sorted(p.name for p in path.parent.iterdir()) == [".gitignore", "misc.json", "misc.json.lock",
                                                             "misc.json.prev"]
