"""tools/guard_replay.py, the evidence behind a [gross_change] setting: stored runs (gzipped, as the
results store keeps them) held out one by one through perfgate.judge.held_out, and a trip reported."""
from __future__ import annotations

import gzip
import importlib.util
import json
from pathlib import Path

from perfgate.judge.metrics import summarize
from perfgate.store import results as results_mod
from perfgate.judge.metric_result import MetricResult

TOOL = Path(__file__).resolve().parents[1] / "tools" / "guard_replay.py"
TEST = "perf/demo/test_a.py::test_a"


def _tool():
    spec = importlib.util.spec_from_file_location("guard_replay", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _stored(folder: Path, name: str, step_ms: float) -> None:
    """A run whose absolute step time (record-only on a CPU id) reads ``step_ms``, gzipped."""
    r = MetricResult(test_id=TEST, area="demo", metric="step_ms", unit="ms", better="lower", tol=0.1, gated=False,
                     summary=summarize([step_ms * f for f in (0.99, 1.0, 1.01, 1.0, 0.995)]),
                     verdict={"outcome": "new"})
    doc = results_mod.make_document([r], hardware_id="cpu-Test-2c", fingerprint={"software": {"torch": "x"}},
                                    commit="abc")
    (folder / f"{name}.json.gz").write_bytes(gzip.compress(json.dumps(doc).encode()))


def test_a_stored_run_ten_times_slower_than_the_others_trips_the_guard(tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text('[tool.perfgate]\nbaselines = "baselines"\n')
    runs = tmp_path / "runs"
    runs.mkdir()
    for i, ms in enumerate((10.0, 10.4, 9.8)):
        _stored(runs, f"ci-{i}", ms)
    argv = [str(runs), "--hardware-id", "cpu-Test-2c", "--root", str(tmp_path), "--pooled", "ci-*.json*"]
    assert _tool().main(argv) == 0
    assert "3 not-gated figures judged, 0 trip(s)" in capsys.readouterr().out
    _stored(runs, "ci-3", 100.0)  # 10x: no noise of those runs explains it
    assert _tool().main(argv) == 1
    out = capsys.readouterr().out
    assert "1 trip(s)" in out and "TRIP" in out and f"{TEST} step_ms  [ci-3.json.gz (vs the others)]" in out
