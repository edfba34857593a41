"""The launcher under real faults: a rank that raises, exits, is killed, or hangs in a collective.

Every fault is real: ranks are real subprocesses in a real gloo process group, the fault
is injected through the test-only knob ``PERFGATE_TEST_FAULT`` (perfgate/launch/faults.py) into a
rank doing real all_reduce steps, and a killed rank gets a real SIGKILL. Each rank also
starts a helper child (as a dataloader or a compile worker would) and writes every PID to a
file, so the test can check that no process of the job outlives it.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from perfgate.launch.faults import FAULT_ENV, Fault
from perfgate.launch.jobs import LaunchError, WorkerFailure, WorkerTimeout, launch
from perfgate.launch.stacks import stack_collective

HERE = Path(__file__).resolve().parent
TARGET = "test_faults_launch:allreduce_steps"  # this module, imported by the ranks via PYTHONPATH


def allreduce_steps(spec: dict, ctx) -> float:
    """Rank body: start helper children, record PIDs, then all_reduce ``steps`` times."""
    import torch
    import torch.distributed as dist

    helpers = [subprocess.Popen(["sleep", "600"])]  # stays in the rank's process group
    if spec.get("escaped_helper") and ctx.rank == 0:
        # a child that left the group (its own session), as a server or daemon would
        helpers.append(subprocess.Popen(["sleep", "600"], start_new_session=True))
    pids = [os.getpid()] + [h.pid for h in helpers]
    Path(spec["pid_dir"], f"rank{ctx.rank}.pids").write_text(" ".join(map(str, pids)))
    t = torch.ones(256)
    for step in range(spec["steps"]):
        ctx.phase(f"all_reduce step {step}")
        if ctx.rank == 1 and step == spec.get("stop_at_step"):
            Path(spec["pid_dir"], "stopped_at").write_text(repr(time.time()))
            os.kill(os.getpid(), signal.SIGSTOP)  # a real stop: every thread of the rank freezes
        if ctx.rank == 1 and step == spec.get("slow_at_step"):
            time.sleep(spec["slow_s"])  # slow but alive: its heartbeat thread keeps beating
        dist.all_reduce(t)
    return float(t[0])


def _env(fault: str | None = None) -> dict[str, str]:
    env = {"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    if fault:
        env[FAULT_ENV] = fault
    return env


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def leftovers(pid_dir: Path, rank_pids: list[int]) -> list[str]:
    """Processes of the job still alive: recorded PIDs, and any member of the ranks' process groups."""
    recorded = [int(p) for f in pid_dir.glob("rank*.pids") for p in f.read_text().split()]
    alive = [f"pid {p}" for p in set(recorded) | set(rank_pids) if _alive(p)]
    for proc in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(proc.pid) in rank_pids and _alive(proc.pid):
                alive.append(f"pid {proc.pid} in group {os.getpgid(proc.pid)}")
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return sorted(set(alive))


def report_row(fault: str, seconds: float, message: str, left: list[str], since_fault: float | None = None) -> None:
    """One line of the issue's fault table (collected with `pytest -s tests/test_faults_*.py`)."""
    after = f" ({since_fault:.1f} s after the fault)" if since_fault is not None else ""
    print(f"\nFAULT-REPORT | {fault} | {seconds:.1f} s{after} | {message.splitlines()[0][:150]} | {len(left)}")


def since_fault(exc: Exception) -> float | None:
    """Seconds from the injected fault (its t= stamp, printed by the rank) to now."""
    m = re.search(r"injected fault \(.*?, t=(\d+\.\d+)\)", str(exc))
    return time.time() - float(m.group(1)) if m else None


def _run(tmp_path: Path, fault: str | None, steps: int = 6, **kw):
    spec = {"pid_dir": str(tmp_path), "steps": steps, "escaped_helper": kw.pop("escaped_helper", False)}
    spec.update(kw.pop("spec", {}))
    t0 = time.monotonic()
    try:
        return launch(TARGET, spec, world_size=2, env=_env(fault), **kw), None, time.monotonic() - t0
    except LaunchError as exc:
        return None, exc, time.monotonic() - t0


def _pid_files_written(tmp_path: Path) -> list[int]:
    files = sorted(tmp_path.glob("rank*.pids"))
    assert len(files) == 2, f"both ranks should have started: {files}"
    return [int(f.read_text().split()[0]) for f in files]


@pytest.mark.parametrize("fault, status, own_error", [
    ("raise@1:step 2", "exit code 1", "RuntimeError: injected fault"),
    ("exit@1:step 2", "exit code 7", "perfgate: injected fault"),
    ("kill@1:step 2", "SIGKILL", "perfgate: injected fault"),
], ids=["raises", "exits-nonzero", "killed-by-SIGKILL"])
def test_rank_fault_mid_collective_fails_fast_names_rank_and_leaves_nothing(tmp_path, fault, status, own_error):
    timeout_s = 60
    _, exc, took = _run(tmp_path, fault, timeout_s=timeout_s)
    after = since_fault(exc)
    assert isinstance(exc, WorkerFailure), f"expected WorkerFailure, got {exc!r}"
    text = str(exc)
    first = text.splitlines()[0]
    # the rank that caused it, not rank 0 that merely lost its peer inside the all_reduce
    assert exc.rank == 1 and first.startswith(f"rank 1 of 2 failed ({status}) in phase 'all_reduce step 2'"), text
    assert own_error in text
    # the other rank's last lines: it was inside all_reduce when its peer went away
    assert "--- rank 0 (" in text and "lost its peer" in text and "all_reduce" in text, text
    assert took < timeout_s / 2, f"failure took {took:.1f} s: it should not wait for the timeout"
    rank_pids = _pid_files_written(tmp_path)
    assert sorted(exc.pids) == sorted(rank_pids)
    left = leftovers(tmp_path, exc.pids)
    report_row(f"rank {fault.split('@')[0]} mid-all_reduce", took, first, left, after)
    assert left == []


def test_hang_is_killed_at_timeout_and_names_the_collective_then_next_launch_works(tmp_path):
    # rank 1 stops (sleeps) at step 2; rank 0 blocks inside all_reduce. The process-group
    # timeout is longer than ours, so the parent's kill is what ends it.
    timeout_s = 8
    (tmp_path / "hang").mkdir()
    _, exc, took = _run(tmp_path / "hang", "hang@1:step 2", timeout_s=timeout_s, pg_timeout_s=120,
                        escaped_helper=True)
    after = since_fault(exc)
    assert isinstance(exc, WorkerTimeout), f"expected WorkerTimeout, got {exc!r}"
    text = str(exc)
    first = text.splitlines()[0]
    assert first.startswith(f"hang: job did not finish within {timeout_s} s; killed all 2 ranks"), text
    assert exc.phases == {0: "all_reduce step 2", 1: "all_reduce step 2"}
    # rank 0's Python stack (faulthandler, dumped on SIGUSR1) shows the collective it is blocked in
    assert exc.collectives[0].startswith("all_reduce (distributed_c10d.py"), exc.collectives
    assert exc.collectives[1].startswith("not in a collective"), exc.collectives
    assert "rank 0: all_reduce step 2 [all_reduce (distributed_c10d.py" in text
    assert took < timeout_s + 30, f"hang outlived its timeout by {took - timeout_s:.1f} s"
    left = leftovers(tmp_path / "hang", exc.pids)  # includes rank 0's helper in its own session
    report_row("hang in all_reduce (parent timeout 8 s)", took, first, left, after)
    assert left == []

    # the next launch on the same machine works normally, and also leaves nothing behind
    (tmp_path / "next").mkdir()
    results, exc2, _ = _run(tmp_path / "next", None, steps=3)
    assert exc2 is None, exc2
    assert results == [8.0, 8.0]  # 1 -> 2 -> 4 -> 8 over three all_reduce(sum) steps on 2 ranks
    assert leftovers(tmp_path / "next", _pid_files_written(tmp_path / "next")) == []


def test_process_group_timeout_is_reported_as_a_hang(tmp_path):
    # gloo's own timeout (2 s) fires before ours (60 s): the rank that timed out is not blamed
    # as "failed"; the report is a hang that names the rank still stuck.
    _, exc, took = _run(tmp_path, "hang@1:step 2", timeout_s=60, pg_timeout_s=2)
    after = since_fault(exc)
    assert isinstance(exc, WorkerTimeout), f"expected WorkerTimeout, got {exc!r}"
    text = str(exc)
    first = text.splitlines()[0]
    assert first.startswith("hang: rank 0's collective hit the process-group timeout (2 s) in phase "
                            "'all_reduce step 2'; still running (the likely culprits): [1]"), text
    assert exc.collectives[0].startswith("all_reduce"), exc.collectives
    assert "Timed out waiting 2000ms" in text
    assert took < 40
    left = leftovers(tmp_path, exc.pids)
    report_row("hang in all_reduce (gloo timeout 2 s)", took, first, left, after)
    assert left == []


def test_fault_knob_is_validated_before_any_rank_starts():
    with pytest.raises(ValueError, match="PERFGATE_TEST_FAULT='explode@1'.*KIND@RANK"):
        launch(TARGET, {}, world_size=2, env={FAULT_ENV: "explode@1"})
    assert Fault.parse("kill@1:sample 2") == Fault("kill", 1, "sample 2")
    assert Fault.parse("hang@0") == Fault("hang", 0, "")


def test_stack_collective_reads_faulthandler_dumps():
    dump = (
        "Thread 0x00007f0000000001 (most recent call first):\n"  # the parent-watch thread
        '  File "/w/perfgate/launch/worker.py", line 46 in watch\n'
        '  File "/x/threading.py", line 982 in run\n'
        "\n"
        "Current thread 0x00007fd6949bdb80 (most recent call first):\n"
        '  File "/v/torch/distributed/distributed_c10d.py", line 4800 in barrier\n'
        '  File "/v/torch/distributed/c10d_logger.py", line 83 in wrapper\n'
        '  File "/w/perfgate/workloads/collectives.py", line 196 in _measure_size\n'
        '  File "/w/perfgate/launch/worker.py", line 61 in main\n'
        '  File "/w/perfgate/launch/worker.py", line 105 in <module>\n'
        '  File "<frozen runpy>", line 88 in _run_code\n'
    )
    assert stack_collective(dump) == "barrier (distributed_c10d.py:4800)"
    assert stack_collective("no dump here") is None


def test_rank_stuck_before_rendezvous_is_a_start_up_hang(tmp_path):
    # rank 1 hangs before joining the process group (a stuck import, a wrong address)
    _, exc, took = _run(tmp_path, "hang@1:init_process_group", timeout_s=60, startup_timeout_s=6)
    assert isinstance(exc, WorkerTimeout), f"expected WorkerTimeout, got {exc!r}"
    first = str(exc).splitlines()[0]
    assert first.startswith("hang at start-up:"), first
    # rank 1 never arrives; on a loaded machine rank 0 may still be importing torch too
    missing = re.search(r"never reached the rendezvous: rank\(s\) \[([\d, ]*)\]", first)
    assert missing and "1" in missing.group(1).split(", "), first
    assert not exc.phases[1].startswith("all_reduce"), exc.phases
    left = leftovers(tmp_path, exc.pids)
    report_row("rank stuck before rendezvous (start-up 6 s)", took, first, left)
    assert left == []


# ---------------------------------------------------------------- hangs found in proportion to the work


def test_stopped_rank_is_found_by_its_silence_not_the_timeout(tmp_path):
    # rank 1 SIGSTOPs itself before step 2's all_reduce; rank 0 blocks inside it. The job's
    # timeout (300 s) and the process-group timeout are long: only the missing heartbeat can end it.
    _, exc, took = _run(tmp_path, None, spec={"stop_at_step": 2}, timeout_s=300, escaped_helper=True)
    after = time.time() - float((tmp_path / "stopped_at").read_text())
    assert isinstance(exc, WorkerTimeout), f"expected WorkerTimeout, got {exc!r}"
    text = str(exc)
    first = text.splitlines()[0]
    assert re.match(r"hang: rank 1 is frozen \(process stopped; no heartbeat for 1\d s and no CPU used\) "
                    r"in phase 'all_reduce step 2'; killed all 2 ranks\.$", first), text
    assert exc.collectives[0].startswith("all_reduce (distributed_c10d.py"), exc.collectives
    assert after < 20, f"a stopped rank was found {after:.1f} s after it stopped"
    left = leftovers(tmp_path, exc.pids)  # the stopped rank, both helpers, the escaped one
    report_row("rank SIGSTOPped mid-all_reduce (timeout 300 s)", took, first, left, after)
    assert left == []


def test_slow_rank_with_a_heartbeat_is_not_killed(tmp_path):
    # rank 1 spends 3x the silence window in one phase, alive: slowness is not a hang
    results, exc, _ = _run(tmp_path, None, steps=3, spec={"slow_at_step": 1, "slow_s": 6.0},
                           timeout_s=120, silent_after_s=2.0)
    assert exc is None, exc
    assert results == [8.0, 8.0]
    assert leftovers(tmp_path, _pid_files_written(tmp_path)) == []


def test_briefly_stopped_rank_that_resumes_is_not_killed(tmp_path):
    # SIGSTOP for less than the silence window, then SIGCONT (a debugger, a paused VM): not a hang
    proc = subprocess.Popen([sys.executable, "-c", _STOP_AND_CONTINUE, str(tmp_path)])
    try:
        results, exc, _ = _run(tmp_path, None, steps=40, spec={"slow_at_step": 0, "slow_s": 4.0},
                               timeout_s=120, silent_after_s=6.0)
    finally:
        proc.wait(timeout=60)
    assert proc.returncode == 0, "the stopper never saw rank 1"
    assert exc is None, exc
    assert results == [2.0 ** 40] * 2
    assert leftovers(tmp_path, _pid_files_written(tmp_path)) == []


# Stops rank 1 (found by its pid file) for 3 s, then continues it.
_STOP_AND_CONTINUE = """
import os, signal, sys, time
from pathlib import Path
f = Path(sys.argv[1], "rank1.pids")
deadline = time.monotonic() + 50
while not f.exists() or not f.read_text().strip():
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.05)
pid = int(f.read_text().split()[0])
os.kill(pid, signal.SIGSTOP)
time.sleep(3)
os.kill(pid, signal.SIGCONT)
"""


def test_hang_budget_comes_from_the_expected_duration():
    from perfgate.launch.jobs import WorkLimit
    from perfgate.launch.liveness import expected_duration, hang_budget_s

    assert hang_budget_s(1.0) == 30.0 and hang_budget_s(40.0) == 120.0
    assert WorkLimit.of(600, None) == WorkLimit(600)  # unknown work: the caller's timeout
    assert WorkLimit.of(20, 5.0) == WorkLimit(20)  # never beyond the caller's timeout
    budget = WorkLimit.of(600, 40.0)
    assert budget.seconds == 120.0 and "3 x the expected 40 s" in budget.why
    from perfgate.workloads.collectives import CollectiveSpec

    kib = 1024
    small = CollectiveSpec("all_reduce", tuple(kib * 4**i for i in range(7)))
    big = CollectiveSpec("all_reduce", small.sizes + (1 << 30,))
    assert expected_duration(small) == small.expected_s() and expected_duration({}) is None
    assert big.expected_s() > small.expected_s() + 20  # scales with the bytes moved
    with pytest.raises(ValueError, match="expected_s must be > 0"):
        launch(TARGET, {}, world_size=2, expected_s=0)


def _rank_processes(root: psutil.Process) -> dict[int, psutil.Process]:
    ranks = {}
    for child in root.children(recursive=True):
        try:
            if "perfgate.launch.worker" in " ".join(child.cmdline()):
                ranks[int(child.environ()["RANK"])] = child
        except (psutil.Error, KeyError, ValueError):
            continue
    return ranks


def _phase_of(tmp: Path, rank: int) -> str:
    for phase in tmp.glob(f"perfgate-job-*/rank{rank}.phase"):
        try:
            return phase.read_text()
        except OSError:
            pass
    return ""


def test_sigstopped_rank_fails_the_collectives_test_within_60_s(tmp_path):
    """Issue 17's reproduction: `kill -STOP` one rank of the real gloo sweep under pytest."""
    node = "perf/collectives/test_collectives.py::test_all_reduce[gloo-2rank-4MiB]"
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = dict(os.environ, TMPDIR=str(tmp), PYTHONPATH=os.pathsep.join([str(HERE.parent), os.environ.get("PYTHONPATH", "")]))
    env.pop(FAULT_ENV, None)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", node, "-p", "no:cacheprovider", "-q", "-x",
                             "--perf-preflight", "off", "--perf-progress", "off"],
                            cwd=HERE.parent, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        root = psutil.Process(proc.pid)
        deadline = time.monotonic() + 180
        ranks: dict[int, psutil.Process] = {}
        while time.monotonic() < deadline and proc.poll() is None:
            ranks = _rank_processes(root)
            if len(ranks) == 2 and " sample " in _phase_of(tmp, 1):
                break
            time.sleep(0.05)
        assert proc.poll() is None and len(ranks) == 2, f"the sweep never reached its samples:\n{proc.communicate()[0]}"
        pids = [ranks[0].pid, ranks[1].pid]
        phase = _phase_of(tmp, 1)
        os.kill(ranks[1].pid, signal.SIGSTOP)
        stopped = time.monotonic()
        out, _ = proc.communicate(timeout=120)
        took = time.monotonic() - stopped
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 1, out
    m = re.search(r"hang: rank 1 is frozen \(process stopped; no heartbeat for \d+ s and no CPU used\) in phase "
                  r"'all_reduce \d+ B [^']+'; killed all 2 ranks\.", out)
    assert m, out
    assert re.search(r"in flight: rank 0: all_reduce \d+ B [^;]* \[", out), out  # rank 0's collective named
    assert took < 60, f"the stopped rank failed the test after {took:.1f} s"
    left = leftovers(tmp_path, pids)
    report_row(f"`kill -STOP` rank 1 of test_all_reduce[gloo-2rank-4MiB] (stopped in {phase!r})", took,
               m.group(0), left)
    assert left == []
    assert not list(tmp.glob("perfgate-job-*")), "the job folder was left behind"


def test_heartbeat_watch_tells_frozen_from_busy_and_beating(tmp_path):
    """Real processes: one asleep without a heartbeat (frozen), one burning CPU (busy), one beating."""
    from perfgate.launch.liveness import HeartbeatWatch

    beating = f"import os, time\nwhile True:\n    os.utime({str(tmp_path / 'p2')!r}); time.sleep(0.2)"
    procs = [subprocess.Popen(["sleep", "60"]),
             subprocess.Popen([sys.executable, "-c", "while True: pass"]),
             subprocess.Popen([sys.executable, "-c", beating])]
    paths = [tmp_path / f"p{i}" for i in range(3)]
    for p in paths:
        p.write_text("phase")
    try:
        watch = HeartbeatWatch(paths, [p.pid for p in procs], silent_after_s=1.5)
        watch.poll([True] * 3)
        deadline = time.monotonic() + 6
        found = []
        while time.monotonic() < deadline:
            silence = watch.poll([True] * 3)
            if silence is not None:
                found.append(silence.rank)
            time.sleep(0.1)
        assert set(found) == {0}, found  # only the sleeping, silent one
        assert watch.poll([False, True, True]) is None  # a rank that ended is not silent
    finally:
        for p in procs:
            p.kill()
            p.wait()
