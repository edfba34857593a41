"""A baseline is valid for one workload: a run of another model is not judged against it.

On a GPU node the user picks the served model and engine flags (PERFGATE_SERVING_MODEL,
PERFGATE_SERVING_ENGINE_ARGS) under unchanged test ids. The serving tests record what they
served (perf.identify, perfgate/workloads/serving/identity.py); the identity travels with the
results into the baselines, and the gate calls a baseline of another workload `not-comparable`,
for ratios too. Checked here through the real plugin (pytester), `perfgate compare` and
`refresh`, with synthetic measurements: the harness's own logic is under test.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from perfgate.store import results as results_mod
from perfgate.judge import pooling
from perfgate.cli import main as cli_main
from perfgate.workloads.serving import GPU_PROFILE
from perfgate.workloads.serving.identity import canonical_flags, describe_model, served_workload
from perfgate.workloads.serving.tiny_model import LLAMA_1B_STRUCTURE, QWEN3_MOE_GPU_STRUCTURE, _model_config


def write_config(d: Path, spec, vocab_size: int = 32064) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    config = _model_config(spec, vocab_size, 2, 3)
    config["transformers_version"] = "4.99.0"  # not part of the identity
    (d / "config.json").write_text(json.dumps(config))
    return d


def test_the_gpu_profiles_models_are_described_by_their_shapes(tmp_path):
    dense = describe_model(write_config(tmp_path / "dense", LLAMA_1B_STRUCTURE))
    assert dense == "llama h2048 L22 heads32 kv4 hd64 mlp5632 vocab32064 bfloat16"
    moe = describe_model(write_config(tmp_path / "moe", QWEN3_MOE_GPU_STRUCTURE))
    assert moe.startswith("qwen3_moe h2048 L24 ") and " experts64 top8 " in moe
    moved = write_config(tmp_path / "elsewhere" / "copy", LLAMA_1B_STRUCTURE)
    assert describe_model(moved) == dense  # the path is not the workload
    with pytest.raises(ValueError, match="config.json: cannot read the model's config"):
        describe_model(tmp_path / "nothing-here")


def test_flags_are_one_identity_wherever_on_the_command_line_they_came_from():
    built = ("--load-format", "dummy", *GPU_PROFILE.engine_args, "--enable-prefix-caching")
    from_env = (*GPU_PROFILE.engine_args, "--enable-prefix-caching", "--load-format", "dummy")
    assert canonical_flags(built) == canonical_flags(from_env)
    assert canonical_flags(["--dtype=half", "--enforce-eager"]) == canonical_flags(["--enforce-eager", "--dtype", "half"])
    assert canonical_flags(["--max-num-seqs", "64", "--max-num-seqs", "1"]) == "--max-num-seqs 1"  # last wins, as argparse
    assert canonical_flags(["--seed", "-1", "-tp", "2"]) == "--seed -1 -tp 2"
    assert canonical_flags(["--dtype", "half"]) != canonical_flags(["--dtype", "bfloat16"])


PROJECT = """
import os, pytest

@pytest.mark.cpu
def test_sweep(perf):
    perf.identify(model=os.environ.get("MODEL", "llama h2048 L22"), engine_args="--load-format dummy")
    k = float(os.environ.get("RATIO_SCALE", "1"))
    perf.record("speedup", [k * x for x in (4.0, 4.02, 3.98, 4.01, 3.99)], unit="x", better="higher")
    perf.record("tpot_ms", [k * x for x in (2.0, 2.02, 1.98, 2.01, 1.99)], unit="ms", better="lower")
"""
HW = "--perf-hardware-id=cpu-Test-2c"


@pytest.fixture
def project(pytester, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")
    pytester.makepyfile(test_synth=PROJECT)
    pytester.runpytest(HW, "--perf-refresh", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    return pytester


def test_the_baseline_keeps_the_workload_it_measured(project):
    doc = json.loads((project.path / "baselines" / "cpu-Test-2c" / "misc.json").read_text())
    entries = doc["entries"]["test_synth.py::test_sweep"]
    assert {m: e["workload"] for m, e in entries.items()} == {
        m: {"model": "llama h2048 L22", "engine_args": "--load-format dummy"} for m in ("speedup", "tpot_ms")}


def test_another_model_is_not_comparable_even_when_it_reads_4x_worse(project, monkeypatch):
    monkeypatch.setenv("MODEL", "qwen2 h3584 L28")
    monkeypatch.setenv("RATIO_SCALE", "0.25")
    res = project.runpytest(HW, "--perf-save=r.json", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)  # not a regression: another model is another number
    res.stdout.fnmatch_lines(["*2 metric(s) not comparable: the baseline measured another workload: model: "
                              "llama h2048 L22 (baseline) -> qwen2 h3584 L28 (here); they are not judged*"])
    doc = json.loads((project.path / "r.json").read_text())
    assert {r["verdict"]["outcome"] for r in doc["results"]} == {"not-comparable"}
    assert all(r["workload"]["model"] == "qwen2 h3584 L28" for r in doc["results"])
    assert all(r["baseline"]["workload"]["model"] == "llama h2048 L22" for r in doc["results"])


def test_the_same_model_4x_worse_is_a_regression(project, monkeypatch):
    monkeypatch.setenv("RATIO_SCALE", "0.25")
    project.runpytest(HW, "-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_a_baseline_from_before_identities_is_judged_as_before(project, monkeypatch):
    path = project.path / "baselines" / "cpu-Test-2c" / "misc.json"
    doc = json.loads(path.read_text())
    for e in doc["entries"]["test_synth.py::test_sweep"].values():
        del e["workload"]
    path.write_text(json.dumps(doc))
    monkeypatch.setenv("MODEL", "qwen2 h3584 L28")
    monkeypatch.setenv("RATIO_SCALE", "0.25")
    project.runpytest(HW, "-p", "no:cacheprovider").assert_outcomes(failed=1)


def test_identify_refuses_empty_or_changing_identities():
    from perfgate.judge.metrics import MetricError
    from perfgate.recorder import PerfRecorder

    rec = PerfRecorder("t")
    with pytest.raises(MetricError, match="non-empty string"):
        rec.identify(model="")
    rec.identify(model="a")
    rec.identify(model="a")  # a re-measurement says it again
    with pytest.raises(MetricError, match="identified as"):
        rec.identify(model="b")


def test_compare_and_refresh_keep_workloads_apart(project, monkeypatch, tmp_path, capsys):
    project.runpytest(HW, "--perf-save=a.json", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    monkeypatch.setenv("MODEL", "qwen2 h3584 L28")
    monkeypatch.setenv("RATIO_SCALE", "0.25")
    project.runpytest(HW, "--perf-save=b.json", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    a, b = project.path / "a.json", project.path / "b.json"
    assert cli_main(["compare", str(a), str(b), "--root", str(project.path)]) == 0
    out = capsys.readouterr().out
    assert "2 metric(s) not comparable: the baseline measured another workload" in out
    # pooling runs of two models into one baseline would be a baseline of neither
    with pytest.raises(pooling.PoolError, match="the runs measured different workloads"):
        pooling.pool([results_mod.load(a), results_mod.load(b)], ["a.json", "b.json"])
    assert cli_main(["refresh", str(a), str(b), "--yes", "--root", str(project.path)]) == 2
    assert "the runs measured different workloads" in capsys.readouterr().err
    # a run from before identities were recorded pools with either; the pooled entry keeps the recorded one
    old = results_mod.load(a)
    for r in old["results"]:
        del r["workload"]
    pooled = pooling.pool([old, results_mod.load(b)], ["old.json", "b.json"])
    assert {r["workload"]["model"] for r in pooled["results"]} == {"qwen2 h3584 L28"}


def test_a_served_workload_is_model_and_flags(tmp_path):
    d = write_config(tmp_path / "dense", LLAMA_1B_STRUCTURE)
    assert served_workload(d, ("--enable-prefix-caching", "--load-format", "dummy")) == {
        "model": "llama h2048 L22 heads32 kv4 hd64 mlp5632 vocab32064 bfloat16",
        "engine_args": "--enable-prefix-caching --load-format dummy"}


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_the_committed_gpu_baselines_name_what_the_gpu_profile_serves(tmp_path, kind):
    """baselines/1xH200/serving.json was measured with the GPU profile's models and flags (the
    runs' logs in results-store/1xH200/ show the server command); its entries say so, and this keeps them
    honest: change the profile's model or flags and this fails until the baselines are refreshed."""
    from perfgate.workloads.serving.tiny_model import build_tiny_model

    spec = GPU_PROFILE.dense_model if kind == "dense" else GPU_PROFILE.moe_model
    built = build_tiny_model(tmp_path / kind, spec)
    # as fixtures/serving.py starts it: the model's own flags, the profile's, prefix caching on
    expected = served_workload(built.path, (*built.load_format_args, *GPU_PROFILE.engine_args,
                                            "--enable-prefix-caching"))
    root = Path(__file__).resolve().parents[1]
    doc = json.loads((root / "baselines" / "1xH200" / "serving.json").read_text())
    mine = {t: m for t, m in doc["entries"].items() if t.endswith("[gpu-moe]") == (kind == "moe")}
    assert mine and all(e.get("workload") == expected for m in mine.values() for e in m.values())


def test_refresh_says_when_the_old_numbers_measured_another_workload(project, monkeypatch, capsys):
    monkeypatch.setenv("MODEL", "qwen2 h3584 L28")
    project.runpytest(HW, "--perf-save=b.json", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    path = project.path / "baselines" / "cpu-Test-2c" / "misc.json"
    before = path.read_bytes()
    # replacing a baseline of another workload is refused unless asked for (the same on every write path)
    assert cli_main(["refresh", str(project.path / "b.json"), "--yes", "--root", str(project.path)]) == 2
    captured = capsys.readouterr()
    assert "pass --allow-other-workload to replace them" in captured.err and path.read_bytes() == before
    res = project.runpytest(HW, "--perf-refresh", "-p", "no:cacheprovider")
    assert res.ret == 1 and path.read_bytes() == before
    res.stdout.fnmatch_lines(["*--perf-refresh stopped: not written: the stored baselines of 1 test(s) measured "
                              "another workload*pass --perf-allow-other-workload*"])
    assert cli_main(["refresh", str(project.path / "b.json"), "--yes", "--root", str(project.path),
                     "--allow-other-workload"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert ("the old numbers of 1 test(s) (test_sweep) measured another workload: "
            "model: llama h2048 L22 (baseline) -> qwen2 h3584 L28 (here)") in out
    doc = json.loads((project.path / "baselines" / "cpu-Test-2c" / "misc.json").read_text())
    assert {e["workload"]["model"] for e in doc["entries"]["test_synth.py::test_sweep"].values()} == {"qwen2 h3584 L28"}
