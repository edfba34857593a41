"""Issue 49, item 1: no zero, negative or subnormal measurement becomes a baseline, nor makes a run pass.

The hostile user's find: `perfgate import` took a nccl-tests time of -3236.43 us, pytest-benchmark
files with negated ``stats.data``, ``stats.median = -1.0`` or all-zero data, a ``vllm bench serve``
TTFT of -35 ms and a throughput of -764 tok/s, and a seed value of -15.06, each with exit 0; after the
negated pytest-benchmark import a run 218 % slower was judged ``pass``. Here zero, negative and
subnormal values go into every positive quantity of every importer, of a results file and of a
baseline (the rule: perfgate.judge.signs), through the real command (``cli.main``) and the real
readers: one line naming the file and the place, nothing written, never ``pass``.
"""
from __future__ import annotations

import contextlib
import copy
import io
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from perfgate import cli
from perfgate.importers.seed import DEFAULT_SEED
from perfgate.judge.metrics import MetricError, summarize
from perfgate.recorder import PerfRecorder
from perfgate.store.baselines import BaselineError, BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.results import make_document
from perfgate.judge.metric_result import MetricResult

HW = "cpu-Test-2c"
TEST = "perf/serving/test_x.py::test_decode"
METRIC = "decode_ms"
BASE = [0.40, 0.41, 0.39, 0.40, 0.42, 0.38, 0.40]
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# zero (both signs), negatives from tiny to huge, subnormals and values below any real measurement
BAD = st.one_of(st.sampled_from([0.0, -0.0, -1.0, -3236.43, -764.0, -1e-9, 5e-324, -5e-324, 1e-310, 1e-31]),
                st.floats(min_value=-1e30, max_value=0.0),
                st.floats(min_value=5e-324, max_value=9.9e-31))
NEGATIVE_OR_TINY = BAD.filter(lambda v: v != 0)


def _main(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, err.getvalue()


def _nothing_written(root: Path) -> bool:
    return not any(root.rglob("*.json"))


# ---------------------------------------------------------------- every importer

def _nccl(value: float, slot: str) -> str:
    time_us, busbw = (value, 331.77) if slot == "time" else (3236.43, value)
    return ("# Collective test starting: all_reduce_perf\n"
            "# nThread 1 nGpus 2 minBytes 1024 maxBytes 1073741824 step: 4(factor) warmup iters: 5 iters: 20 "
            "agg iters: 1 validation: 1 graph: 0 unalign: 0\n"
            "#  Rank  0 Group  0 Pid   1398 on         vm device  0 [0000:00:06] NVIDIA H200\n"
            "#  Rank  1 Group  0 Pid   1398 on         vm device  1 [0000:00:07] NVIDIA H200\n"
            f"  1073741824     268435456     float     sum      -1  {time_us!r}  331.77  {busbw!r}       0  "
            f"3255.24  329.85  329.85       0\n")


def _pytest_benchmark(value: float, slot: str) -> str:
    stats = {"median": 1e-3, "rounds": 5}
    if slot == "median":
        stats["median"] = value
    else:
        stats["data"] = [1e-3, value, 1.1e-3] if slot == "one round" else [value] * 3
    return json.dumps({"version": "5.1.0", "benchmarks": [{"fullname": "test_b.py::test_sort", "name": "test_sort",
                                                             "stats": stats}]})


VLLM_KEYS = ["output_throughput", "request_throughput", "total_token_throughput", "median_ttft_ms",
             "median_tpot_ms", "median_e2el_ms", "p99_itl_ms", "ttfts"]


def _vllm(value: float, slot: str) -> str:
    doc = json.loads((Path(__file__).parent / "data" / "vllm-bench-serve" / "cpu-c4-round0.json").read_text())
    if slot == "ttfts":
        doc["ttfts"] = [0.03, value / 1e3 if value else value, 0.04]  # seconds
    else:
        doc[slot] = value
    return json.dumps(doc)


SEED_DOC = json.loads(DEFAULT_SEED.read_text())


def _seed(value: float, slot: str) -> str:
    doc = copy.deepcopy(SEED_DOC)
    doc["numbers"][int(slot)]["value"] = value
    return json.dumps(doc)


SEED_SLOTS = [str(i) for i, n in enumerate(SEED_DOC["numbers"]) if n["unit"] != "fraction"]
IMPORTERS = {"nccl-tests": (_nccl, ["time", "busbw"], ".txt"),
             "pytest-benchmark": (_pytest_benchmark, ["median", "one round", "every round"], ".json"),
             "vllm-bench": (_vllm, VLLM_KEYS, ".json"),
             "seed": (_seed, SEED_SLOTS, ".json")}


def test_the_valid_import_files_write_baselines(tmp_path):
    # the property below is only meaningful if each file, with a real value in the slot, is written
    for fmt, (make, slots, ext) in IMPORTERS.items():
        path = tmp_path / f"{fmt}{ext}"
        path.write_text(make(SEED_DOC["numbers"][0]["value"] if fmt == "seed" else 35.0, slots[0]))
        hw = [] if fmt == "seed" else ["--hardware-id", HW]
        rc, err = _main(["import", fmt, path, *hw, "--baselines", tmp_path / fmt, "--root", tmp_path])
        assert rc == 0 and not _nothing_written(tmp_path / fmt), (fmt, err)


@FEW
@given(st.sampled_from([(fmt, slot) for fmt, (_, slots, _) in IMPORTERS.items() for slot in slots]), BAD)
def test_property_no_importer_writes_a_zero_negative_or_subnormal_value(where, value):
    fmt, slot = where
    make, _, ext = IMPORTERS[fmt]
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        path = root / f"in{ext}"
        path.write_text(make(value, slot))
        hw = [] if fmt == "seed" else ["--hardware-id", HW]
        rc, err = _main(["import", fmt, path, *hw, "--baselines", root / "b", "--root", root])
        assert rc == 2, (where, value, err)
        assert len(err.strip().splitlines()) == 1 and path.name in err, err
        assert _nothing_written(root / "b"), (where, value)


@pytest.mark.parametrize("fmt, make, slot, says", [
    ("nccl-tests", _nccl, "time", "in.txt:1073741824"),
    ("pytest-benchmark", _pytest_benchmark, "every round", "time_s -1 s is negative"),
    ("pytest-benchmark", _pytest_benchmark, "median", "time_s -1 s is negative"),
    ("vllm-bench", _vllm, "median_ttft_ms", "ttft_ms -1 ms is negative"),
    ("vllm-bench", _vllm, "output_throughput", "output_tok_s -1 tok/s is negative"),
])
def test_the_issues_negative_imports_are_refused_naming_the_value(tmp_path, fmt, make, slot, says):
    path = tmp_path / ("in.txt" if fmt == "nccl-tests" else "in.json")
    path.write_text(make(-1.0, slot))
    rc, err = _main(["import", fmt, path, "--hardware-id", HW, "--baselines", tmp_path / "b", "--root", tmp_path])
    assert rc == 2 and "nothing written" in err and _nothing_written(tmp_path / "b"), err
    if fmt != "nccl-tests":
        assert says in err, err


def test_an_all_zero_pytest_benchmark_file_is_refused(tmp_path):
    path = tmp_path / "zero.json"
    path.write_text(_pytest_benchmark(0.0, "every round"))
    rc, err = _main(["import", "pytest-benchmark", path, "--hardware-id", HW, "--baselines", tmp_path / "b",
                     "--root", tmp_path])
    assert rc == 2 and "0 s: a duration at or below zero is no measurement of a run that worked" in err, err


# ---------------------------------------------------------------- perf.record

@FEW
@given(st.sampled_from(["ms", "s", "GB/s", "tok/s", "MiB", "count"]), NEGATIVE_OR_TINY)
def test_property_perf_record_refuses_a_negative_or_subnormal_measurement(unit, value):
    with pytest.raises(MetricError) as info:
        PerfRecorder("t").record("m", [1.0, value, 2.0], unit=unit, better="lower")
    assert "\n" not in str(info.value) and "'m'" in str(info.value)


def test_perf_record_keeps_real_zeros_and_signed_ratios():
    rec = PerfRecorder("t")
    rec.record("itl_p50_ms", [0.0], unit="ms", better="lower")  # tokens of one chunk: a real gap of 0 ms
    rec.record("other_at_peak_mib", [0.0] * 3, unit="MiB", better="lower")
    rec.record("bubble_drop_vs_theory", [-0.56, 0.2], unit="x", better="higher")  # a ratio of two changes
    rec.record("memory_saving", [-0.05], unit="fraction", better="higher")
    with pytest.raises(MetricError, match="closer to zero than any real measurement"):
        rec.record("speedup", [5e-324], unit="x", better="higher")


# ---------------------------------------------------------------- a results file and a baseline

def _results_doc() -> dict:
    r = MetricResult(test_id=TEST, area="serving", metric=METRIC, unit="ms", better="lower", tol=0.1, gated=True,
                     summary=summarize(BASE), rerun=f"pytest '{TEST}'",
                     verdict={"outcome": "pass", "change": 0.0, "tol": 0.1, "baseline_median": 0.4},
                     baseline={"median": 0.4, "mad": 0.01, "n": 7, "samples": list(BASE),
                               "provenance": "measured", "run_medians": [0.40, 0.41]})
    doc = make_document([r], hardware_id=HW, fingerprint={}, commit="abc")
    doc["results"][0]["runs"] = [{"median": m, "spread": 0.02, "n": 7} for m in (0.40, 0.41)]
    return doc


RESULT_PATHS = ([("summary", k) for k in ("median", "min", "max", "mean")]
                + [("summary", "samples", i) for i in range(len(BASE))]
                + [("runs", i, "median") for i in range(2)] + [("verdict", "baseline_median"), ("baseline", "median")]
                + [("baseline", "samples", i) for i in range(3)] + [("baseline", "run_medians", 1)])


def _put(doc: dict, path: tuple, value: float) -> dict:
    doc = copy.deepcopy(doc)
    parent = doc
    for k in path[:-1]:
        parent = parent[k]
    parent[path[-1]] = value
    return doc


def _key(prefix: str, path: tuple) -> str:
    return prefix + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in path)


@FEW
@given(st.sampled_from(RESULT_PATHS), NEGATIVE_OR_TINY)
def test_property_a_results_file_with_a_negative_or_subnormal_value_writes_nothing(path, value):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        doc = _results_doc()
        doc["results"][0] = _put(doc["results"][0], path, value)
        a = root / "a.json"
        a.write_text(json.dumps(doc))
        for argv in (["refresh", a, "--yes", "--baselines", root / "b"], ["compare", a, a, "--gate", "all"]):
            rc, err = _main([*argv, "--root", root])
            assert rc == 2 and len(err.strip().splitlines()) == 1, (argv, err)
            assert str(a) in err and _key("results[0]", path) in err, err
        assert _nothing_written(root / "b")


def test_a_results_metric_that_measured_nothing_is_left_out_and_the_refresh_fails(tmp_path):
    doc = _results_doc()
    r = doc["results"][0]
    r["summary"] = summarize([0.0] * 7).to_dict()
    r["runs"] = [{"median": 0.0, "n": 7}]
    a = tmp_path / "zero.json"
    a.write_text(json.dumps(doc))
    rc, err = _main(["refresh", a, "--yes", "--root", tmp_path, "--baselines", tmp_path / "b"])
    assert rc == 1 and _nothing_written(tmp_path / "b"), err
    assert "left out test_decode decode_ms: every sample is 0 ms: a duration of zero measured nothing" in err
    assert "nothing written: every metric in" in err


def _baseline_doc(tmp: Path) -> dict:
    entry = BaselineEntry(unit="ms", better="lower", summary=summarize(BASE), tol=0.1, provenance="measured",
                          runs=tuple({"median": m, "spread": 0.02, "n": 7} for m in (0.40, 0.41)),
                          spread={"run_medians": [0.40, 0.41], "runs": 2})
    return json.loads(BaselineStore(tmp).write(HW, "serving", {TEST: {METRIC: entry}}).read_text())


BASELINE_PATHS = ([("summary", k) for k in ("median", "min", "max", "mean")]
                  + [("summary", "samples", i) for i in range(len(BASE))]
                  + [("runs", i, "median") for i in range(2)] + [("spread", "run_medians", 0)])


@FEW
@given(st.sampled_from(BASELINE_PATHS), NEGATIVE_OR_TINY)
def test_property_a_baseline_with_a_negative_or_subnormal_value_is_refused_by_name(path, value):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        doc = _baseline_doc(root)
        doc["entries"][TEST][METRIC] = _put(doc["entries"][TEST][METRIC], path, value)
        file = BaselineStore(root).path(HW, "serving")
        file.write_text(json.dumps(doc))
        with pytest.raises(BaselineError) as info:
            BaselineStore(root).load(HW, "serving")
        message = str(info.value)
        assert "\n" not in message and str(file) in message
        assert _key(f"entries[{TEST!r}][{METRIC!r}]", path) in message, message


def test_a_baseline_of_a_duration_that_measured_nothing_is_refused(tmp_path):
    doc = _baseline_doc(tmp_path)
    doc["entries"][TEST][METRIC]["summary"] = summarize([0.0] * 5).to_dict()
    file = BaselineStore(tmp_path).path(HW, "serving")
    file.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=r"summary\.samples: every sample is 0 ms: a duration of zero measured"):
        BaselineStore(tmp_path).load(HW, "serving")


def test_committed_baselines_and_stored_runs_keep_reading():
    """The rule refuses nothing this project measured: its zeros (a p50 gap of 0 ms, memory not held) and
    its one signed ratio (bubble_drop_vs_theory) are read."""
    from perfgate.store import results as results_mod

    root = Path(__file__).resolve().parents[1]
    store = BaselineStore(root / "baselines")
    for hw in store.hardware_ids():
        for path in sorted((store.root / hw).glob("*.json")):
            store.load(hw, path.stem)
    for path in sorted((root / "tests" / "data" / "runs").rglob("*.json.gz"))[:40]:  # results-store/: digests
        results_mod.load(path)
