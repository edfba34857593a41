"""wait_until_quiet on real processes: a child that spins for a while then sleeps (what a vLLM server
does for ~1 s after its last request), one that never stops, and one that is gone."""
from __future__ import annotations

import select
import subprocess
import sys
import time

import pytest

from perfgate.workloads.serving.quiesce import tree_cpu_s, wait_until_quiet

SPIN_THEN_SLEEP = """
import sys, time
end = time.monotonic() + float(sys.argv[1])
while time.monotonic() < end:
    pass
print("slept", flush=True)
time.sleep(60)
"""


def _spawn(seconds: float) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", SPIN_THEN_SLEEP, str(seconds)], stdout=subprocess.PIPE, text=True)
    time.sleep(0.2)  # the interpreter is up and spinning
    return proc


@pytest.fixture
def spawned():
    procs: list[subprocess.Popen] = []

    def spawn(seconds: float) -> subprocess.Popen:
        procs.append(_spawn(seconds))
        return procs[-1]
    yield spawn
    for p in procs:
        p.kill()
        p.wait()


def test_waits_out_a_spin_and_returns_once_quiet(spawned):
    proc = spawned(1.2)
    t0 = time.monotonic()
    quiet = wait_until_quiet(proc.pid)
    waited = time.monotonic() - t0
    assert quiet.quiet and quiet.last_cores < 0.2
    # it returned after the spin ended, not before: the child's line is already there to read
    assert select.select([proc.stdout], [], [], 0)[0], "wait_until_quiet returned while the child still spun"
    assert proc.stdout.readline().strip() == "slept"
    assert 0.7 < waited < 3.0, waited  # ~1.0 s of spin left, then two quiet windows


def test_a_process_that_never_goes_quiet_is_reported_at_the_timeout(spawned):
    proc = spawned(30)
    quiet = wait_until_quiet(proc.pid, timeout_s=0.6)
    assert not quiet.quiet
    assert quiet.last_cores > 0.3  # one core, give or take a busy machine
    assert 0.6 <= quiet.waited_s < 1.5


def test_an_idle_or_gone_process_is_quiet_at_once(spawned):
    proc = spawned(0)
    time.sleep(0.2)
    assert wait_until_quiet(proc.pid).waited_s < 0.5
    proc.kill()
    proc.wait()
    assert tree_cpu_s(proc.pid) == 0.0
    assert wait_until_quiet(proc.pid).quiet


@pytest.mark.parametrize("kw", [{"below_cores": 0}, {"window_s": 0}, {"windows": 0}, {"timeout_s": 0.15}])
def test_bad_arguments_are_refused(kw):
    with pytest.raises(ValueError, match="wait_until_quiet"):
        wait_until_quiet(1, **kw)
