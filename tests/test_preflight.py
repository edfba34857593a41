"""Preflight taint check: the judgements with exact readings, and the real readings of this machine.

NVML readings are given as GpuState values (there is no GPU here): that is the judgement
logic under test. CPU, memory and governor checks read the real machine, real processes
and real files.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from perfgate.machine import cpu_use, preflight
from perfgate.machine.cpu_use import CpuSample
from perfgate.machine.preflight import GpuProcess, GpuState, Limits

GiB = 1 << 30
LIMITS = Limits()


def gpu(**kw) -> GpuState:
    base = dict(index=0, name="NVIDIA H200", mem_used_bytes=int(0.5 * GiB), clock_event_bits=0x1, temp_c=35.0,
                app_sm_clock_mhz=1980, max_sm_clock_mhz=1980)
    base.update(kw)
    return GpuState(**base)


def test_quiet_gpu_is_clean():
    assert preflight.gpu_reasons([gpu()], LIMITS, mine={os.getpid()}) == []


def test_foreign_gpu_process_taints_but_our_own_does_not():
    procs = (GpuProcess(4242, 30 * GiB, "python"), GpuProcess(os.getpid(), 2 * GiB, "pytest"))
    reasons = preflight.gpu_reasons([gpu(processes=procs, mem_used_bytes=32 * GiB)], LIMITS, mine={os.getpid()})
    assert any("1 other process(es)" in r and "pid 4242 python" in r for r in reasons)
    assert any("30.0 GiB of memory already in use by others" in r for r in reasons)
    ours = (GpuProcess(os.getpid(), 2 * GiB, "pytest"),)
    assert preflight.gpu_reasons([gpu(processes=ours, mem_used_bytes=int(2.3 * GiB))], LIMITS,
                                 mine={os.getpid()}) == []


def test_ignored_pids_and_unchecked_gpus_do_not_taint():
    procs = (GpuProcess(4242, 30 * GiB, "vllm"),)
    g = gpu(index=3, processes=procs, mem_used_bytes=31 * GiB)
    assert preflight.gpu_reasons([g], Limits(ignore_pids=frozenset({4242})), mine=set()) == []
    assert preflight.gpu_reasons([g], Limits(gpus=(0, 1)), mine=set()) == []


@pytest.mark.parametrize("bits, word", [(0x40, "hardware thermal slowdown"), (0x4, "software power cap"),
                                        (0x8 | 0x20, "hardware slowdown, software thermal slowdown"),
                                        (0x80, "hardware power brake")])
def test_slowdown_clock_reasons_taint(bits, word):
    (reason,) = preflight.gpu_reasons([gpu(clock_event_bits=bits)], LIMITS, mine=set())
    assert word in reason and reason.startswith("GPU 0: clocks reduced now")


@pytest.mark.parametrize("bits", [0x1, 0x2, 0x10, 0x100, 0x0])
def test_idle_and_settings_reasons_do_not_taint(bits):
    assert preflight.gpu_reasons([gpu(clock_event_bits=bits)], LIMITS, mine=set()) == []


def test_hot_gpu_and_capped_application_clocks_taint():
    reasons = preflight.gpu_reasons([gpu(temp_c=91.0, app_sm_clock_mhz=900, max_sm_clock_mhz=1980)], LIMITS,
                                    mine=set())
    assert any("91 C" in r for r in reasons) and any("900 MHz" in r and "nvidia-smi -rac" in r for r in reasons)


def _sysfs(tmp_path, governors):
    for cpu, gov in enumerate(governors):
        d = tmp_path / f"devices/system/cpu/cpu{cpu}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_governor").write_text(gov + "\n")
    return tmp_path


def test_governor_read_from_sysfs_and_judged(tmp_path):
    root = _sysfs(tmp_path, ["performance", "powersave", "powersave"])
    govs = preflight.read_governors(root)
    assert govs == {0: "performance", 1: "powersave", 2: "powersave"}
    (reason,) = preflight.governor_reasons(govs, LIMITS, have_gpus=True)
    assert "powersave on 2 of 3 CPUs" in reason
    # default "gpu": a CPU-only machine is not tainted by its governor; "always" checks anyway
    assert preflight.governor_reasons(govs, LIMITS, have_gpus=False) == []
    assert preflight.governor_reasons(govs, Limits(governor_check="always"), have_gpus=False)
    assert preflight.governor_reasons(govs, Limits(ok_governors=("performance", "powersave")), have_gpus=True) == []


def test_no_cpufreq_means_nothing_to_judge(tmp_path):
    assert preflight.read_governors(tmp_path) == {}
    assert preflight.governor_reasons({}, Limits(governor_check="always"), have_gpus=True) == []


def test_small_quiet_machine_is_not_tainted_for_being_small():
    # 2 cores with the load of one busy pytest process, 24 GiB with most of it free
    assert preflight.load_reasons(1.9, 2, LIMITS) == []
    assert preflight.memory_reasons(18 * GiB, 24 * GiB, LIMITS) == []
    assert preflight.cpu_reasons(CpuSample(cores=2, busy_cores=1.2, own_cores=1.0, steal_fraction=0.01), LIMITS) == []


def test_busy_host_taints():
    assert "load average 9.0 on 2 cores" in preflight.load_reasons(9.0, 2, LIMITS)[0]
    assert "0.5 GiB of 24.0 GiB" in preflight.memory_reasons(GiB // 2, 24 * GiB, LIMITS)[0]
    sample = CpuSample(cores=2, busy_cores=2.0, own_cores=0.2, steal_fraction=0.25)
    reasons = preflight.cpu_reasons(sample, LIMITS)
    assert any("foreign processes used 1.8 of 2 cores (limit 50% of cores)" in r for r in reasons)
    assert any("steal 25%" in r for r in reasons)
    assert preflight.cpu_reasons(sample, Limits(max_foreign_cpu_fraction=None, max_steal_fraction=0.5)) == []


def test_foreign_use_while_measuring_has_a_lower_limit_and_names_the_processes():
    """One hog beside two busy ranks on 2 cores gets ~0.7 of a core: fine before the session (our
    cores idle), a third of our CPU while measuring (perfgate.machine.load_watch)."""
    sample = CpuSample(cores=2, busy_cores=2.0, own_cores=1.3, steal_fraction=0.0,
                       top_foreign=(("stress", 4242, 0.5),))
    assert preflight.cpu_reasons(sample, LIMITS) == []
    assert preflight.cpu_reasons(sample, LIMITS, during=" while this test measured") == [
        "foreign processes used 0.7 of 2 cores while this test measured (limit 25% of cores): "
        "stress (pid 4242) 0.5, 0.2 in short-lived or smaller processes"]
    assert preflight.cpu_reasons(sample, Limits(max_foreign_cpu_fraction_while_measuring=None), during=" x") == []


def test_limits_are_validated():
    with pytest.raises(ValueError, match="governor_check"):
        Limits(governor_check="sometimes")
    with pytest.raises(TypeError):
        preflight.taint_reasons(no_such_limit=1)


def test_real_check_on_this_machine_returns_reasons_as_text():
    reasons = preflight.taint_reasons(cpu_sample_s=0.1)
    assert isinstance(reasons, list) and all(isinstance(r, str) and r for r in reasons)
    # no GPU here: nothing GPU-related can be reported
    assert not any(r.startswith("GPU ") for r in reasons)
    # an impossible memory floor is reported, with the numbers
    tight = preflight.taint_reasons(min_free_mem_gib=1e6, cpu_sample_s=0.1)
    assert any("memory available" in r for r in tight)


BURN = "import time\nend = time.monotonic() + {secs}\nwhile time.monotonic() < end: pass\n"


def _cpu_s(pid: int) -> float:
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def test_our_own_children_are_counted_as_ours():
    """A child's CPU time lands in own_cores (and so is not foreign), however busy the machine is."""
    child = subprocess.Popen([sys.executable, "-c", BURN.format(secs=4)])
    try:
        time.sleep(0.3)
        before = _cpu_s(child.pid)
        sample = cpu_use.sample_cpu(1.0)
        burned = _cpu_s(child.pid) - before  # what the child really got, whatever the load
        assert burned > 0.02, "the child never ran"
        assert sample.own_cores >= 0.7 * burned, (sample, burned)
        assert sample.busy_cores >= sample.own_cores - 0.05  # ...and it is part of the machine's load
    finally:
        child.kill()
        child.wait()


def test_orphaned_busy_process_is_foreign_load():
    """A double-forked burner is re-parented away from us: another user's process, for all we know."""
    code = ("import os, sys, time\n"
            "if os.fork():\n    os._exit(0)\n"
            "print(os.getpid(), flush=True)\n" + BURN.format(secs=4))
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(launcher.stdout.readline())
    launcher.wait()
    try:
        assert pid not in cpu_use.own_pids()
        time.sleep(0.3)
        before = _cpu_s(pid)
        sample = cpu_use.sample_cpu(1.0)
        burned = _cpu_s(pid) - before
        assert burned > 0.02, "the burner never ran"
        assert sample.foreign_cores >= 0.7 * burned, (sample, burned)
        reasons = preflight.cpu_reasons(sample, Limits(max_foreign_cpu_fraction=0.5 * burned / sample.cores))
        assert reasons and "foreign processes used" in reasons[0]
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
