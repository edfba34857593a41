"""Pooling several runs into one baseline: samples add up, hardware ids must agree."""
from __future__ import annotations

import pytest

from perfgate.judge import pooling


def doc(hw, created, samples):
    return {"kind": "perfgate-results", "schema_version": 1, "hardware_id": hw, "created": created, "commit": "c",
            "fingerprint": {"software": {"torch": "x"}},
            "results": [{"test_id": "perf/a/t.py::t", "area": "a", "metric": "bw", "unit": "GB/s", "better": "higher",
                         "tol": 0.05, "gated": True, "summary": {"median": samples[0], "samples": samples},
                         "verdict": {}}]}


def test_pool_adds_samples_and_names_runs():
    pooled = pooling.pool([doc("h", "2026-01-01", [1.0, 2.0]), doc("h", "2026-01-02", [3.0, 4.0, 5.0])], ["a", "b"])
    entry = pooling.baseline_entries(pooled)["a"]["perf/a/t.py::t"]["bw"]
    assert entry.summary.n == 5 and entry.summary.median == 3.0
    assert "pooled over 2 runs" in entry.provenance and "2026-01-02" in entry.provenance


def test_pool_refuses_mixed_hardware():
    with pytest.raises(pooling.PoolError, match="different hardware ids"):
        pooling.pool([doc("h1", "x", [1.0]), doc("h2", "y", [1.0])], ["a", "b"])
