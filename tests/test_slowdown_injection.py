"""The gate fires on a real slowdown: real gloo all-reduce, a baseline measured minutes
earlier, then the test-only knob that issues every timed collective 4 times."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from perfgate import mutations

ROOT = Path(__file__).resolve().parents[1]
CASE = "perf/collectives/test_collectives.py::test_all_reduce[gloo-2rank-1MiB]"


def run_pytest(tmp_path: Path, *extra: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != mutations.ENV}
    env.update(env_extra or {})
    # --perf-preflight=off: this checks the gate against a planted slowdown; on a machine shared with
    # other jobs the load watch would (rightly) taint both runs, and a tainted run neither refreshes nor fails
    cmd = [sys.executable, "-m", "pytest", CASE, "-p", "no:cacheprovider", "-q", "--perf-preflight=off",
           f"--perf-baselines={tmp_path / 'baselines'}", *extra]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_injected_collective_slowdown_fails_as_regression(tmp_path):
    first = run_pytest(tmp_path, "--perf-refresh", "--perf-allow-dirty")  # in this checkout, maybe mid-edit
    assert first.returncode == 0, first.stdout + first.stderr
    slow = run_pytest(tmp_path, "--perf-gate=all", "--perf-retries=0", f"--perf-save={tmp_path / 'r.json'}",
                      env_extra={mutations.ENV: "collective_slowdown:4"})
    out = slow.stdout + slow.stderr
    assert slow.returncode == 1, out
    assert "performance regression" in out and "busbw_gbps" in out
    doc = json.loads((tmp_path / "r.json").read_text())
    verdicts = {r["metric"]: r["verdict"]["outcome"] for r in doc["results"]}
    assert verdicts["busbw_gbps"] == "regression", verdicts
