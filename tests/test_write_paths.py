"""Issues 26 and 27: every path that writes baselines makes the same checks, and every write is safe.

1. One writer (perfgate.store.baseline_writer) behind ``pytest --perf-refresh``, ``perfgate
   refresh``, ``calibrate --write`` and ``import``: a dirty tree, disagreeing runs, another
   workload, a test-only mutation and a non-finite number are refused on each path.
2. One mutation registry (perfgate.mutations): the older knobs are registered mutations, their
   runs are marked in the results, and adding a knob is one entry.
3. Writes go through real folders only (no symbolic link followed, no hard link written into),
   ``.prev`` and ``.lock`` included; a failing write is one line and the report still prints; a
   held lock names its holder at once; refresh does not start ``./baselines`` in a stray folder,
   pools a file given twice once, caps stored samples and escapes names in its review.

Real files, real git repositories, real pytest sessions (pytester) and the real CLI; the perf
tests record synthetic samples (the harness-logic case). Write failures are real: /proc, a path
under a regular file, a file-size limit (RLIMIT_FSIZE, which refuses writes as root too).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from perfgate.judge.metrics import MetricError

from perfgate import cli, mutations
from perfgate.commands import calibrate
from perfgate.judge.metrics import MAX_STORED_SAMPLES, summarize
from perfgate.commands.confirm import confirmed
from perfgate.store import baseline_writer, locks
from perfgate.store.baseline_writer import Checks, WriteRefused
from perfgate.store.baselines import BaselineStore
from perfgate.judge.metric_result import MetricResult
from perfgate.store.safe_paths import PathError
from test_hardening import HW, TEST_FILE, cli_subprocess, entry, one_line, result, results_doc

REPO = Path(__file__).resolve().parents[1]


def save(path: Path, doc: dict) -> Path:
    path.write_text(json.dumps(doc))
    return path


def git(cwd: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=cwd, check=True,
                   capture_output=True)


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.delenv(mutations.ENV, raising=False)
    pytester.makepyfile(test_x=TEST_FILE)
    return pytester


# ================================================================ 1. the same checks on every path

def test_perf_refresh_refuses_a_dirty_tree_unless_allowed(project):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git(project.path, "init", "-q")
    git(project.path, "add", "test_x.py")
    git(project.path, "commit", "-q", "-m", "x")
    (project.path / "test_x.py").write_text(TEST_FILE + "\n# an uncommitted change\n")
    res = project.runpytest(f"--perf-hardware-id={HW}", "--perf-refresh", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    text = "\n".join(res.errlines)
    assert "--perf-refresh refused:" in text and "uncommitted changes to tracked files" in text
    assert "--perf-allow-dirty" in text and not (project.path / "baselines").exists()
    res = project.runpytest(f"--perf-hardware-id={HW}", "--perf-refresh", "--perf-allow-dirty",
                            "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    doc = json.loads((project.path / "baselines" / HW / "misc.json").read_text())
    assert "-dirty-" in doc["entries"]["test_x.py::test_ratio"]["speedup"]["commit"]  # the provenance says so


def two_runs(tmp_path: Path, second_median: float) -> list[dict]:
    docs = []
    for i, k in enumerate((1.0, second_median)):
        r = result()
        r = MetricResult(**{**vars(r), "summary": summarize([k * x for x in (1.0, 1.01, 0.99, 1.0, 1.0)])})
        docs.append(results_doc(results=[r]))
        docs[-1]["created"] = f"2026-12-0{i + 1}T00:00:00+00:00"
    return docs


def test_disagreeing_runs_are_refused_on_the_session_path_too(tmp_path):
    """The function --perf-refresh calls (a session whose results carry runs) refuses what refresh does."""
    store = BaselineStore(tmp_path / "baselines")
    docs = two_runs(tmp_path, 1.5)  # 50 % apart, tolerance 10 %
    with pytest.raises(baseline_writer.RunsDisagree, match=r"1 gated metric\(s\) whose run medians disagree.*"
                                                           r"pass --perf-save and then `perfgate refresh --force`"):
        baseline_writer.write_baselines(docs, ["a", "b"], store=store, checks=Checks(prefix="--perf-"))
    assert not (tmp_path / "baselines").exists()
    a, b = (save(tmp_path / n, d) for n, d in zip(("a.json", "b.json"), docs))
    assert cli.main(["refresh", str(a), str(b), "--yes", "--baselines", str(tmp_path / "baselines")]) == 1
    assert not (tmp_path / "baselines").exists()


@pytest.mark.parametrize("table, written", [
    ("", False),                                                                        # the runs' own 10 %
    ('[record_only]\n"perf/collectives/*@speedup" = "launch-bound: 50 % apart between leases"\n', True),
    ('[overrides]\n"perf/collectives/*@speedup" = 0.80\n', True),                         # wide enough
    ('[overrides]\n"perf/collectives/*@speedup" = 0.20\n', False),                        # still too narrow
])
def test_refresh_judges_the_runs_agreement_with_the_ids_committed_table(tmp_path, table, written):
    """The tolerance table the id's sessions will judge with decides whether runs may pool, not the one
    they were measured under: a metric made [record_only] (or given a wider override) from these very
    runs' spread pools; without that table, or with a tolerance they still break, nothing is written."""
    base = tmp_path / "baselines"
    (base / HW).mkdir(parents=True)
    (base / HW / "tolerances.toml").write_text(table)
    a, b = (save(tmp_path / n, d) for n, d in zip(("a.json", "b.json"), two_runs(tmp_path, 1.5)))
    assert cli.main(["refresh", str(a), str(b), "--yes", "--baselines", str(base)]) == (0 if written else 1)
    assert (base / HW / "collectives.json").exists() == written


def test_results_of_a_mutated_session_are_marked_and_refused(project, monkeypatch, capsys):
    monkeypatch.setenv(mutations.ENV, "extra_param_copy")
    project.runpytest(f"--perf-hardware-id={HW}", "--perf-save=r.json", "-p", "no:cacheprovider").assert_outcomes(
        passed=1)
    doc = json.loads((project.path / "r.json").read_text())
    assert doc[mutations.RESULTS_KEY]["names"] == ["extra_param_copy"]
    monkeypatch.delenv(mutations.ENV)
    assert cli.main(["refresh", str(project.path / "r.json"), "--yes", "--baselines",
                     str(project.path / "baselines")]) == 2
    assert "was measured with planted bugs (test-only mutation(s) extra_param_copy" in capsys.readouterr().err
    assert not (project.path / "baselines").exists()


def test_refresh_refuses_a_median_that_overflows_to_inf(tmp_path, capsys):
    docs = []
    for name in ("a.json", "b.json"):
        doc = results_doc()
        doc["created"] = f"2026-12-01T00:00:0{len(docs)}+00:00"  # two runs, not one file twice
        summary = doc["results"][0]["summary"]
        summary.update(samples=[1e308] * 4, median=1e308, mean=1e308, min=1e308, max=1e308, mad=0.0, iqr=0.0)
        docs.append(save(tmp_path / name, doc))
    (tmp_path / "baselines").mkdir()
    rc = cli.main(["refresh", *map(str, docs), "--yes", "--force", "--root", str(tmp_path),
                   "--baselines", str(tmp_path / "baselines")])
    err = capsys.readouterr().err
    assert rc == 2
    line = one_line(err)
    # the reader refuses a magnitude no measurement reaches (store.shapes) before the writer's own check
    # of the pooled median (inf) would: either way one line naming the file, nothing written
    assert ("perf/collectives/test_c.py::test_x speedup: summary.median is inf, not a finite number" in line
            or "results[0].summary.median: must be a number of sane magnitude" in line), line
    assert list((tmp_path / "baselines").iterdir()) == []


def test_calibrate_refuses_a_non_finite_pooled_median(tmp_path):
    cal = calibrate.Calibration(test_id="perf/collectives/test_c.py::test_x", metric="speedup", unit="x",
                                better="higher", run_medians=(1e308, 1e308, 1e308), pooled=(1e308,) * 6,
                                within=0.0, spread=0.0, proposed=0.02, configured=0.1)
    docs = [results_doc() for _ in range(3)]
    # summarize refuses samples beyond any real measurement first (judge.metrics.MAX_MAGNITUDE); the
    # writer's own check of a non-finite median stands behind it
    with pytest.raises((WriteRefused, MetricError), match=r"summary.median is inf|beyond any real measurement"):
        by_area = calibrate.entries([cal], docs, k=3, floor=0.02, fraction_floor=0.01)
        baseline_writer.plan_from_entries(HW, by_area, fingerprint=None, source="calibrate (3 runs)")


def test_import_seed_refuses_a_nan_in_the_table(tmp_path):
    seed = json.loads((REPO / "baselines-imported" / "seed-v100.json").read_text())
    seed["numbers"][1]["value"] = float("nan")
    bad = tmp_path / "seed.json"
    bad.write_text(json.dumps(seed))  # Python writes the NaN as NaN, and reads it back
    out = cli_subprocess(tmp_path, "import", "seed", str(bad), "--baselines", str(tmp_path / "b"),
                         "--root", str(tmp_path))
    assert out.returncode == 2, out
    line = one_line(out.stderr)
    n = seed["numbers"][1]
    # the writer's check names the test and metric; a reader that checks each number (store.readers) may
    # refuse it first, naming the key: either way one line, the file, nothing written
    assert (f"{bad}: {n['test_id']} {n['metric']}: summary.median is nan, not a finite number" in line
            or (line.startswith(f"perfgate import: error: {bad}") and "numbers[1].value" in line)), line
    assert not (tmp_path / "b").exists()


# ================================================================ 2. one mutation registry

def test_one_variable_reads_every_knob(monkeypatch):
    """Issue 50: one variable (the two older ones are gone: setting them plants nothing) and one entry per bug
    (``collective_repeat`` was ``collective_slowdown:4``)."""
    env = {mutations.ENV: "collective_slowdown:3,extra_param_copy"}
    assert mutations.active_factors(env) == {"collective_slowdown": 3.0, "extra_param_copy": None}
    assert mutations.active_factors({"PERFGATE_TEST_COLLECTIVE_SLOWDOWN": "3", "PERFGATE_TEST_EXTRA_PARAM_COPY": "1"}) \
        == {}
    assert "collective_repeat" not in mutations.MUTATIONS
    assert mutations.active_factors({mutations.ENV: "collective_slowdown"}) == {"collective_slowdown": 4.0}
    assert mutations.active_factors({mutations.ENV: "collective_slowdown:1"}) == {}  # factor 1 changes nothing
    assert mutations.factor("collective_slowdown", {}) is None
    for bad, why in (({mutations.ENV: "collective_slowdown:0.5"}, "finite number >= 1"),
                     ({mutations.ENV: "collective_slowdown:inf"}, "finite number >= 1"),
                     ({mutations.ENV: "extra_param_copy:2"}, "takes no factor"),
                     ({mutations.ENV: "collective_repeat"}, "unknown mutation")):
        with pytest.raises(mutations.MutationError, match=why):
            mutations.active_factors(bad)
    monkeypatch.setenv(mutations.ENV, "collective_slowdown:2.5")
    from perfgate.workloads.collectives import ops
    assert ops._slowdown() == 2.5
    assert mutations.results_mark()["factors"] == {"collective_slowdown": 2.5}


def test_a_new_graded_knob_is_one_registry_entry(monkeypatch):
    """A device-side slowdown whose factor is the extra share of work (0: none), as the lead's GPU knob."""
    knob = mutations.Mutation("gpu_step_slowdown", "training", "every GPU training step does more device work",
                              "perfgate/workloads/training/engine.py", default_factor=0.10, neutral_factor=0.0,
                              max_factor=100.0)
    monkeypatch.setitem(mutations.MUTATIONS, knob.name, knob)
    monkeypatch.setenv(mutations.ENV, "gpu_step_slowdown:0.3")
    assert mutations.factor("gpu_step_slowdown") == 0.3
    assert mutations.results_mark()["names"] == ["gpu_step_slowdown"]
    assert "gpu_step_slowdown:0.3" in mutations.note()
    assert mutations.factor("gpu_step_slowdown", {mutations.ENV: "gpu_step_slowdown"}) == 0.10
    assert mutations.factor("gpu_step_slowdown", {mutations.ENV: "gpu_step_slowdown:0"}) is None  # neutral: off
    with pytest.raises(mutations.MutationError, match=r"finite number >= 0 and < 100, got '150'"):
        mutations.factor("gpu_step_slowdown", {mutations.ENV: "gpu_step_slowdown:150"})


# ================================================================ 3. safe writes

def test_a_symlinked_baselines_root_is_not_followed(tmp_path, capsys):
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "baselines").symlink_to(real)
    r = save(tmp_path / "r.json", results_doc())
    assert cli.main(["refresh", str(r), "--yes", "--baselines", str(tmp_path / "baselines")]) == 2
    line = one_line(capsys.readouterr().err)
    assert f"baselines root: {tmp_path / 'baselines'} is a symbolic link (to {real})" in line, line
    assert list(real.iterdir()) == []


def test_an_in_root_alias_of_another_id_is_refused(tmp_path):
    store = BaselineStore(tmp_path / "baselines")
    path_b = store.write("cpu-B", "collectives", {"t": {"m": entry()}})
    before = path_b.read_bytes()
    (tmp_path / "baselines" / "cpu-A").symlink_to("cpu-B")
    with pytest.raises(PathError, match=r"hardware id folder: .*cpu-A is a symbolic link \(to cpu-B\).*two machines "
                                        r"share one baseline"):
        store.write("cpu-A", "collectives", {"t": {"m": entry(2.0)}})
    assert path_b.read_bytes() == before and not Path(str(path_b) + ".prev").exists()


@pytest.mark.parametrize("name", ["collectives.json", "collectives.json.prev"])
def test_a_hard_link_at_the_target_or_backup_is_replaced_not_written_into(tmp_path, name):
    store = BaselineStore(tmp_path / "baselines")
    path = store.write(HW, "collectives", {"t": {"m": entry()}})
    first = path.read_bytes()
    precious = tmp_path / "precious.txt"
    if name == "collectives.json":  # the baseline file has a second name elsewhere (cp -al, a planted link)
        os.link(path, precious)
    else:
        precious.write_text("keep me\n")
        (path.parent / name).unlink(missing_ok=True)
        os.link(precious, path.parent / name)
    kept = precious.read_bytes()
    store.write(HW, "collectives", {"t": {"m": entry(2.0)}})
    assert precious.read_bytes() == kept and os.stat(precious).st_nlink == 1
    stored = json.loads(path.read_text())["entries"]["t"]["m"]["summary"]["median"]
    assert stored == pytest.approx(2.0)
    if name.endswith(".prev"):
        assert Path(str(path) + ".prev").read_bytes() == first


def test_a_hard_linked_lock_file_is_refused_not_truncated(tmp_path):
    store = BaselineStore(tmp_path / "baselines")
    path = store.write(HW, "collectives", {"t": {"m": entry()}})
    precious = tmp_path / "precious.txt"
    precious.write_text("keep me\n")
    lock = Path(str(path) + ".lock")
    lock.unlink(missing_ok=True)
    os.link(precious, lock)
    before = path.read_bytes()
    with pytest.raises(PathError, match=r"lock file: .*collectives.json.lock is not perfgate's own lock file \(a hard "
                                        r"link with 2 names"):
        store.write(HW, "collectives", {"t": {"m": entry(2.0)}})
    assert precious.read_text() == "keep me\n" and path.read_bytes() == before


def test_perf_save_inside_the_baselines_root_is_refused(project):
    res = project.runpytest(f"--perf-hardware-id={HW}", f"--perf-save=baselines/{HW}/misc.json",
                            "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    assert "--perf-save baselines/cpu-Test-2c/misc.json: inside the baselines folder" in "\n".join(res.errlines)
    assert not (project.path / "baselines").exists()


def test_a_perf_save_under_a_file_is_refused_before_the_run(project):
    (project.path / "plain.txt").write_text("x")
    where = str(project.path / "plain.txt" / "r.json")
    res = project.runpytest(f"--perf-hardware-id={HW}", f"--perf-save={where}", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.USAGE_ERROR  # as parsed, before any test (issue 49), not after the run
    assert f"argument --perf-save: {where!r}: {project.path / 'plain.txt'} is not a folder" in res.stderr.str()


@pytest.mark.parametrize("where", ["/proc/perfgate-x.json"])
def test_a_failing_perf_save_is_one_line_under_the_report(project, where):
    res = project.runpytest(f"--perf-hardware-id={HW}", f"--perf-save={where}", "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    text = "\n".join(res.outlines)
    assert "perfgate: 0 regressions" in text  # the report is printed
    assert f"perfgate: --perf-save {where} not written:" in text and "Traceback" not in text + "\n".join(res.errlines)


def test_perf_refresh_into_a_folder_that_cannot_be_written_is_one_line(project):
    res = project.runpytest(f"--perf-hardware-id={HW}", "--perf-refresh", "--perf-baselines=/proc/perfgate-x",
                            "-p", "no:cacheprovider")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    lines = [x for x in res.outlines if "--perf-refresh stopped" in x]
    assert len(lines) == 1 and "nothing written" in lines[0], res.outlines
    assert "perfgate: 0 regressions" in "\n".join(res.outlines)
    assert "Traceback" not in "\n".join(res.outlines + res.errlines)


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into a read-only folder: /proc and RLIMIT_FSIZE cover it")
def test_refresh_into_a_read_only_folder_is_one_line(tmp_path, capsys):
    (tmp_path / "baselines" / HW).mkdir(parents=True)
    (tmp_path / "baselines" / HW).chmod(0o555)
    r = save(tmp_path / "r.json", results_doc())
    try:
        assert cli.main(["refresh", str(r), "--yes", "--baselines", str(tmp_path / "baselines")]) == 2
    finally:
        (tmp_path / "baselines" / HW).chmod(0o755)
    assert "Permission denied" in one_line(capsys.readouterr().err)


FULL_DISK = textwrap.dedent('''
    import json, resource, signal, sys
    from perfgate.store.baselines import BaselineStore
    from perfgate.store.baseline_writer import Checks, Plan, write_plan
    from test_hardening import entry
    store = BaselineStore(sys.argv[1])
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
    try:
        write_plan(store, Plan("{hw}", {{"collectives": {{"t": {{"m": entry(3.0)}}}}}}, None, "x"), Checks())
    except ValueError as exc:
        print(exc)
''')


def test_a_full_disk_during_the_backup_leaves_every_file_as_it_was(tmp_path):
    """A file-size limit makes the `.prev` copy fail half way, as a full disk would (root included)."""
    store = BaselineStore(tmp_path / "baselines")
    store.write(HW, "collectives", {f"t{i}": {"m": entry()} for i in range(40)})  # big old file
    path = store.write(HW, "collectives", {"t0": {"m": entry(2.0)}})  # .prev: the first version
    before = {p.name: p.read_bytes() for p in path.parent.iterdir()}
    limit = len(before["collectives.json.prev"]) // 2  # the new .prev (= the current file) cannot be written
    out = subprocess.run([sys.executable, "-c", FULL_DISK.format(hw=HW), str(tmp_path / "baselines"), str(limit)],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "tests")])))
    assert out.returncode == 0, out.stderr
    line = one_line(out.stdout)
    assert line.startswith(f"cannot write {path}: File too large") and "nothing written" in line, line
    after = {p.name: p.read_bytes() for p in path.parent.iterdir() if not p.name.endswith(".lock")}
    assert after == {k: v for k, v in before.items() if not k.endswith(".lock")}  # no temp file left behind
    json.loads(after["collectives.json.prev"])  # still a valid backup


HOLDER = textwrap.dedent('''
    import os, sys, time
    from pathlib import Path
    from perfgate.store import locks
    folder = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)
    with locks.exclusive(folder, "collectives.json.lock", shown=Path(sys.argv[1]) / "collectives.json.lock"):
        print("holding", flush=True)
        time.sleep(30)
''')


def test_a_held_lock_names_its_holder_at_once_then_times_out(tmp_path):
    store = BaselineStore(tmp_path / "baselines", lock_timeout_s=1.5)
    store.write(HW, "collectives", {"t": {"m": entry()}})
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "baselines" / HW), "--nightly"],
                              stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)))
    said: list[tuple[float, str]] = []
    try:
        assert holder.stdout.readline().strip() == "holding"
        t0 = time.monotonic()
        with pytest.raises(locks.LockTimeout) as exc:
            with locks.exclusive(os.open(tmp_path / "baselines" / HW, os.O_RDONLY), "collectives.json.lock",
                                 shown=tmp_path / "lock", timeout_s=1.5,
                                 say=lambda text: said.append((time.monotonic() - t0, text))):
                pass
        waited = time.monotonic() - t0
        plan = baseline_writer.Plan(HW, {"collectives": {"t": {"m": entry(3.0)}}}, None, "r.json")
        with pytest.raises(WriteRefused, match=rf"still locked after 1.5 s by pid {holder.pid} .*; nothing written"):
            baseline_writer.write_plan(store, plan, Checks())  # the writer's path: one line, what was written
    finally:
        holder.kill()
        holder.wait()
    assert len(said) == 1 and said[0][0] < 1.0, said  # at once, not after the timeout
    assert f"is locked by pid {holder.pid} (-c {tmp_path / 'baselines' / HW} --nightly) since 20" in said[0][1]
    assert f"`kill {holder.pid}`" in said[0][1]
    assert waited >= 1.4 and f"still locked after 1.5 s by pid {holder.pid}" in str(exc.value)
    store.write(HW, "collectives", {"t": {"m": entry(2.0)}})  # freed when the holder died


def test_refresh_from_another_folder_does_not_start_a_baselines_folder(tmp_path):
    r = save(tmp_path / "r.json", results_doc())
    stray = tmp_path / "downloads"
    stray.mkdir()
    out = cli_subprocess(stray, "refresh", str(r), "--yes")
    assert out.returncode == 2, out
    assert f"no baselines folder at {stray / 'baselines'}" in one_line(out.stderr)
    assert list(stray.iterdir()) == []
    out = cli_subprocess(stray, "refresh", str(r), "--yes", "--baselines", "baselines")  # named: created
    assert out.returncode == 0, out
    assert (stray / "baselines" / HW / "collectives.json").exists()


def test_a_file_given_twice_is_pooled_once(tmp_path, capsys):
    r = save(tmp_path / "r.json", results_doc())
    copy = save(tmp_path / "copy.json", results_doc())
    copy.write_bytes(r.read_bytes())
    assert cli.main(["refresh", str(r), str(r), str(copy), "--yes", "--baselines", str(tmp_path / "b")]) == 0
    err = capsys.readouterr().err
    assert f"{r} has the same content as {r}: pooled once" in err
    assert f"{copy} has the same content as {r}: pooled once" in err
    doc = json.loads((tmp_path / "b" / HW / "collectives.json").read_text())
    stored = doc["entries"]["perf/collectives/test_c.py::test_x"]["speedup"]
    assert len(stored["runs"]) == 1 and stored["summary"]["n"] == 5


def test_stored_samples_are_capped(tmp_path):
    doc = results_doc()
    samples = [1.0 + (i % 7) / 1000 for i in range(20_000)]
    doc["results"][0]["summary"] = summarize(samples).to_dict() | {"samples": samples}
    r = save(tmp_path / "r.json", doc)
    assert cli.main(["refresh", str(r), "--yes", "--baselines", str(tmp_path / "b")]) == 0
    stored = json.loads((tmp_path / "b" / HW / "collectives.json").read_text())
    summary = stored["entries"]["perf/collectives/test_c.py::test_x"]["speedup"]["summary"]
    assert len(summary["samples"]) == MAX_STORED_SAMPLES and summary["n"] == 20_000


def test_names_in_the_review_are_escaped(tmp_path, capsys):
    hostile = "perf/collectives/test_c.py::test_x[\x1b[2J\u202e]"
    r = save(tmp_path / "r.json", results_doc(results=[result(test_id=hostile)]))
    rc = cli.main(["refresh", str(r), "--yes", "--baselines", str(tmp_path / "b")])
    out, err = capsys.readouterr()
    assert "\x1b" not in out + err and "\u202e" not in out + err
    if rc == 0:  # the reader took the id: the review shows it escaped
        assert "\\x1b[2J\\u202e" in out
    else:  # a reader that refuses such ids said so in one line
        assert rc == 2 and one_line(err)


def test_an_interrupted_run_is_refused_unless_its_finished_tests_are_asked_for(tmp_path, capsys):
    """A GPU call cut by its time limit saves the tests that finished, marked interrupted (the one cut
    short is not in the file: tests/test_faults_interrupt.py). Refresh refuses such a file by default
    and says how to take the finished tests; with --allow-interrupted it writes exactly those."""
    doc = results_doc()
    doc["interrupted"] = True
    r = save(tmp_path / "cut.json", doc)
    base = tmp_path / "baselines"
    assert cli.main(["refresh", str(r), "--yes", "--baselines", str(base)]) == 2
    err = capsys.readouterr().err
    assert "comes from an interrupted run" in err and "--allow-interrupted" in err
    assert not base.exists()
    assert cli.main(["refresh", str(r), "--yes", "--baselines", str(base), "--allow-interrupted"]) == 0
    stored = json.loads((base / HW / "collectives.json").read_text())["entries"]
    assert list(stored) == ["perf/collectives/test_c.py::test_x"]


def _metric(test_id: str, metric: str, median: float) -> MetricResult:
    return MetricResult(test_id=test_id, area="training", metric=metric, unit="GiB", better="lower", tol=0.02,
                        gated=True, summary=summarize([median] * 5), verdict={"outcome": "improved"})


def test_refresh_takes_only_the_named_tests_and_metrics(tmp_path, capsys):
    """A harness fix changed one metric of some tests (GPU memory, after a leak between cases was fixed):
    `--test`/`--metric` replace those entries from the re-measured run and leave every other baseline,
    pooled over earlier runs, as it was; a selection that matches nothing writes nothing and says so."""
    base = tmp_path / "baselines"
    store = BaselineStore(base)
    ids = {"mb2": "perf/training/test_ddp.py::test_ddp_microbatch[nccl-1rank-gpt-1.3b-mb2]",
           "mb1": "perf/training/test_ddp.py::test_ddp_microbatch[nccl-1rank-gpt-1.3b-mb1]",
           "fsdp": "perf/training/test_fsdp.py::test_fsdp_memory[nccl-1rank-gpt-1.3b-untied-fsdp2-reshard]"}
    old = {(t, m): entry(v) for t, m, v in ((ids["mb2"], "peak_alloc_gib", 39.3), (ids["mb2"], "step_ms", 80.0),
                                             (ids["mb1"], "peak_alloc_gib", 25.6), (ids["fsdp"], "peak_alloc_gib", 79.4))}
    entries: dict = {}
    for (t, m), e in old.items():
        entries.setdefault(t, {})[m] = e
    store.write(HW, "training", entries)
    run = results_doc(results=[_metric(ids["mb2"], "peak_alloc_gib", 29.7), _metric(ids["mb2"], "step_ms", 70.0),
                               _metric(ids["mb1"], "peak_alloc_gib", 25.6), _metric(ids["fsdp"], "peak_alloc_gib", 70.5)])
    path = save(tmp_path / "run.json", run)

    assert cli.main(["refresh", str(path), "--yes", "--baselines", str(base), "--test", "test_ddp_microbatch[",
                     "--metric", "peak_alloc_*"]) == 0
    now = BaselineStore(base).load(HW, "training")
    assert now[ids["mb2"]]["peak_alloc_gib"].summary.median == pytest.approx(29.7)  # re-measured: replaced
    assert now[ids["mb1"]]["peak_alloc_gib"].summary.median == pytest.approx(25.6)
    assert now[ids["mb2"]]["step_ms"].summary.median == pytest.approx(80.0)  # another metric: kept
    assert now[ids["fsdp"]]["peak_alloc_gib"].summary.median == pytest.approx(79.4)  # another test: kept
    capsys.readouterr()

    assert cli.main(["refresh", str(path), "--yes", "--baselines", str(base), "--metric", "no_such_*"]) == 1
    assert "nothing written: no metric of" in one_line(capsys.readouterr().err)
    assert BaselineStore(base).load(HW, "training")[ids["fsdp"]]["peak_alloc_gib"].summary.median == pytest.approx(79.4)


@pytest.mark.parametrize("yes, tty, answer, written", [
    (True, False, None, True),      # --yes: asks nothing, even without a terminal
    (False, False, None, False),    # no terminal to ask on: nothing written, and how to write anyway
    (False, True, "y", True),
    (False, True, " YES ", True),
    (False, True, "", False),       # the default is no
    (False, True, "n", False),
])
def test_refresh_and_calibrate_ask_the_same_question_before_writing(monkeypatch, capsys, yes, tty, answer, written):
    from perfgate.store import baseline_writer

    asked = []

    class Stdin:
        def isatty(self):
            return tty

    def ask(prompt):
        asked.append(prompt)
        return answer

    monkeypatch.setattr(sys, "stdin", Stdin())
    monkeypatch.setattr("builtins.input", ask)
    assert confirmed(yes, "write 3 metric(s) to baselines/x?") is written
    out, err = capsys.readouterr()
    assert asked == ([] if yes or not tty else ["write 3 metric(s) to baselines/x? [y/N] "])
    assert ("pass --yes" in err) == (not yes and not tty)
    assert ("not written" in out) == (tty and not yes and not written)


def test_each_front_door_offers_the_writers_checks_in_the_same_words():
    """Issue 50: the check flags were spelled out three times (refresh, calibrate, the pytest options) and
    had drifted apart; each front door now offers its checks from baseline_writer.CHECK_FLAGS."""
    from _pytest.config.argparsing import Parser

    from perfgate.cli import build_parser
    from perfgate.options import pytest_addoption
    from perfgate.store.baseline_writer import CHECK_FLAGS, SESSION_CHECKS

    commands = build_parser()._subparsers._group_actions[0].choices
    helps = {door: {a.option_strings[0]: a.help for a in commands[door]._actions if a.option_strings}
             for door in ("refresh", "calibrate")}
    assert {f"--{name}" for name in CHECK_FLAGS} <= set(helps["refresh"])
    for name, words in CHECK_FLAGS.items():
        assert helps["refresh"][f"--{name}"] == words
        if name != "force":  # calibrate pools disagreeing runs by design
            assert helps["calibrate"][f"--{name}"].endswith(words), name

    parser = Parser(_ispytest=True)  # pytest's own option parser, as a session builds it
    pytest_addoption(parser)
    session = {o.names()[0]: o.attrs().get("help") for o in parser.getgroup("perfgate").options}
    for name in SESSION_CHECKS:
        assert session[f"--perf-{name}"] == f"with --perf-refresh: {CHECK_FLAGS[name]}"
