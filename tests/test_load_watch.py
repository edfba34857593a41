"""The in-test load watch (perfgate.machine.load_watch): real processes, real counters.

Ours vs foreign is checked with real children (short-lived ones that end inside the
window, as ranks do) and a real double-forked hog; the run-cache bookkeeping of taint
(which entry carries which reasons) is harness logic and uses a stand-in watch. The
end-to-end cases run a small real perf session in a subprocess beside a real hog started
after that session began (tests/test_load_watch_e2e.py).
"""
from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from perfgate.machine.cpu_use import CpuUse
from perfgate.machine.load_watch import WHILE_LAUNCH, WHILE_TEST, LoadWatch, Window
from perfgate.machine.preflight import Limits
from perfgate.runcache import RunCache

# Burns ``secs`` of CPU time (however busy the machine), then prints what it burned: its own
# count, independent of the watch's readings.
BURN = "import time\nwhile time.process_time() < {secs}: pass\nprint(time.process_time(), flush=True)\n"
HOG = ("import os, sys, time\n"
       "if os.fork():\n    os._exit(0)\n"  # double fork: re-parented away from us, like another user's job
       "open('/proc/self/comm', 'w').write('perfgate-hog')\n"
       "print(os.getpid(), flush=True)\n"
       "end = time.monotonic() + {secs}\nwhile time.monotonic() < end: pass\n")


@contextlib.contextmanager
def foreign_hogs(n: int, secs: float):
    """``n`` busy processes that are not ours (not descendants of this process)."""
    pids = []
    try:
        for _ in range(n):
            launcher = subprocess.Popen([sys.executable, "-c", HOG.format(secs=secs)], stdout=subprocess.PIPE,
                                        text=True)
            pids.append(int(launcher.stdout.readline()))
            launcher.wait()
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_children_that_end_inside_the_window_are_ours():
    """Two ranks' worth of children, started and reaped inside the window: their CPU time is ours,
    none of it foreign, however busy the machine is."""
    watch = LoadWatch(Limits(min_watched_s=0.0))
    with watch.window() as window:
        kids = [subprocess.Popen([sys.executable, "-c", BURN.format(secs=1.0)], stdout=subprocess.PIPE, text=True)
                for _ in range(2)]
        burned = sum(float(k.communicate()[0]) for k in kids)  # reaped here: only our counters still hold them
    assert burned > 0.1, "the children never ran"
    assert window.use.own_s >= 0.9 * burned, (window.use, burned)
    assert not {k.pid for k in kids} & set(window.use.foreign_by_pid)


WORKER = """
import json, sys, time
from perfgate.machine.cpu_use import own_pids, read_cpu_counters
start = read_cpu_counters()
sys.stdout.write(json.dumps(sorted(own_pids())) + "\\n"); sys.stdout.flush()
sys.stdin.readline()  # the sibling has burned and been reaped by our parent (the controller)
use = read_cpu_counters() - start
print(json.dumps({"own_s": use.own_s, "foreign_pids": sorted(use.foreign_by_pid)}))
"""


def test_xdist_sibling_workers_are_ours_even_after_they_ended():
    """Under xdist the controller's tree is ours: a sibling worker's ranks are not foreign load."""
    env = dict(os.environ, PYTEST_XDIST_WORKER="gw0")
    watcher = subprocess.Popen([sys.executable, "-c", WORKER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                               text=True, env=env)
    try:
        ours_at_start = set(json.loads(watcher.stdout.readline()))  # its window is open now
        sibling = subprocess.Popen([sys.executable, "-c", BURN.format(secs=1.0)], stdout=subprocess.PIPE, text=True,
                                   env=dict(os.environ, PYTEST_XDIST_WORKER="gw1"))
        burned = float(sibling.communicate()[0])  # reaped here, by the "controller"
        watcher.stdin.write("\n")
        watcher.stdin.flush()
        seen = json.loads(watcher.stdout.readline())
    finally:
        watcher.kill()
        watcher.wait()
    assert {os.getpid(), watcher.pid} <= ours_at_start
    assert seen["own_s"] >= 0.9 * burned > 0.05, (seen, burned)
    assert sibling.pid not in seen["foreign_pids"]


def test_foreign_hog_taints_the_window_and_is_named():
    watch = LoadWatch(Limits(min_watched_s=0.0))
    with foreign_hogs(2, secs=4) as hogs:
        time.sleep(0.2)
        with watch.window(WHILE_TEST) as window:
            time.sleep(1.5)
    used = window.use.foreign_by_pid
    hog_s = max(used.get(p, 0.0) for p in hogs)
    assert hog_s > 0.1, f"the hogs never ran: {window.use}"
    (reason,) = [r for r in window.reasons if r.startswith("foreign processes used")]
    assert f"of {watch.cores} cores while this test measured (limit 25% of cores): " in reason
    busier = [pid for pid, s in used.items() if s > hog_s and pid not in hogs]
    if len(busier) < 3:  # the reason names the three busiest: a hog, unless others' jobs outran both
        assert "perfgate-hog" in reason, reason


def test_nested_window_is_judged_alone_and_subtracted_from_its_parent():
    """A cache production inside a test's call: the busy launch is the production's; the call's
    own remainder is what is left after it (short and idle here, so not judged)."""
    watch = LoadWatch()
    with foreign_hogs(2, secs=4):
        with watch.window(WHILE_TEST) as call:
            time.sleep(0.2)
            with watch.window(WHILE_LAUNCH) as launch:  # our "ranks" measure beside the hogs
                kids = [subprocess.Popen([sys.executable, "-c", BURN.format(secs=0.6)], stdout=subprocess.PIPE)
                        for _ in range(2)]
                for k in kids:
                    k.communicate()
    assert launch.reasons and all(WHILE_LAUNCH in r for r in launch.reasons)
    assert call.use.elapsed_s < 0.5 <= launch.use.elapsed_s  # the call's own part: the 0.2 s before
    assert call.use.own_s < 0.2 * launch.use.own_s
    assert call.reasons == []


def test_short_windows_are_not_judged_and_a_disabled_watch_reads_nothing():
    watch = LoadWatch()
    watch.cores = 2
    short = CpuUse(elapsed_s=0.3, task_s=0.6, all_s=0.6, own_s=0.0)  # 2 of 2 cores foreign, but only 0.3 s
    assert watch.judge(short, WHILE_TEST) == []
    idle = CpuUse(elapsed_s=3.0, task_s=5.9, all_s=6.0, own_s=0.1)  # we waited 3 s and measured nothing
    assert watch.judge(idle, WHILE_TEST) == []
    longer = CpuUse(elapsed_s=1.0, task_s=2.0, all_s=2.0, own_s=0.6)
    assert watch.judge(longer, WHILE_TEST) == [
        "foreign processes used 1.4 of 2 cores while this test measured (limit 25% of cores): "
        "1.4 in short-lived or smaller processes"]
    quiet = CpuUse(elapsed_s=1.0, task_s=1.9, all_s=2.0, own_s=1.5)  # 0.4 of 2 cores foreign: under 25%
    assert watch.judge(quiet, WHILE_TEST) == []
    off = LoadWatch(enabled=False)
    with off.window() as window:
        pass
    assert window.use is None and window.reasons == []


def test_cpu_use_adds_and_subtracts_per_process():
    a = CpuUse(elapsed_s=2.0, task_s=3.0, steal_s=0.1, all_s=4.0, own_s=1.0, foreign_by_pid={7: 1.5, 8: 0.2})
    b = CpuUse(elapsed_s=0.5, task_s=1.0, steal_s=0.0, all_s=1.0, own_s=0.5, foreign_by_pid={7: 0.5})
    d = a - b
    assert (d.elapsed_s, d.task_s, d.own_s, d.foreign_by_pid) == (1.5, 2.0, 0.5, {7: 1.0, 8: 0.2})
    assert (d + b).foreign_by_pid == a.foreign_by_pid
    s = a.sample(cores=2)
    assert (s.busy_cores, s.own_cores, s.foreign_cores) == (1.5, 0.5, 1.0)
    assert [(pid, c) for _, pid, c in s.top_foreign] == [(7, 0.75), (8, 0.1)]  # busiest first, in cores


class StandInWatch:
    """Hands each producer window the next canned reasons (run-cache bookkeeping only)."""

    def __init__(self, *reasons: list[str]):
        self.reasons = list(reasons)

    @contextlib.contextmanager
    def window(self, during: str):
        assert during == WHILE_LAUNCH
        window = Window(during)
        try:
            yield window
        finally:
            window.reasons = self.reasons.pop(0)


def test_cached_results_carry_the_taint_of_the_launch_that_measured_them():
    runs = RunCache(StandInWatch(["busy A"], [], ["busy C"]))
    runs.begin("t1")
    runs.get_many([1], lambda missing: {k: k for k in missing}, batch=[1, 2])  # launch 1 (busy) makes 1 and 2
    runs.begin("t2")
    runs.get_many([2], lambda missing: {k: k for k in missing}, batch=[1, 2])  # read from launch 1
    runs.begin("t3")
    runs.get("q", lambda: 0)  # launch 2: quiet
    assert runs.taint_of("t1") == runs.taint_of("t2") == ["busy A"]
    assert runs.taint_of("t3") == []
    runs.invalidate("t2")  # a re-measurement: the fresh launch is judged afresh
    runs.begin("t2")
    runs.get_many([2], lambda missing: {k: k for k in missing}, batch=[1, 2])
    assert runs.taint_of("t2") == ["busy C"] and runs.taint_of("t1") == ["busy A"]


def test_failed_producer_leaves_no_taint_behind():
    runs = RunCache(StandInWatch(["busy"], []))
    runs.begin("t")
    with pytest.raises(ZeroDivisionError):
        runs.get("a", lambda: 1 / 0)
    assert runs.taint_of("t") == []
    assert runs.get("a", lambda: 2) == 2 and runs.taint_of("t") == []
