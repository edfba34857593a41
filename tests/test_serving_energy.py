"""Serving energy: joules per output token from the GPUs' counter over a run (GPU only).

The counter itself is read on GPUs (perfgate.workloads.device_energy; NVML). Here: the arithmetic from a
run's joules to the metric, and that a machine without GPUs records none (the CPU suite's real runs
go through the same path: loadgen.run_loads_concurrently finds no counter and leaves energy_j None).
"""
from __future__ import annotations

from perfgate.workloads.serving.loadgen import RequestRecord
from perfgate.workloads.serving.measurements import latency_records
from perfgate.workloads.serving.serving_metrics import summarize


def _records(n: int, tokens: int) -> list[RequestRecord]:
    out = []
    for i in range(n):
        chunks = [0.010 * i + 0.002 + 0.001 * k for k in range(tokens)]
        out.append(RequestRecord(index=i, tag="t", due_s=0.01 * i, send_s=0.01 * i, first_chunk_s=chunks[0],
                                 chunk_s=chunks, end_s=chunks[-1], prompt_tokens=8, output_tokens=tokens))
    return out


def test_joules_per_output_token_is_the_runs_energy_over_its_tokens():
    runs = [summarize(_records(4, 16), 0.2, energy_j=j) for j in (32.0, 64.0)]
    assert [r.energy_j_per_output_token for r in runs] == [0.5, 1.0]
    got = {m.name: m for m in latency_records(runs)}
    assert got["energy_j_per_token"].samples == [0.5, 1.0] and got["energy_j_per_token"].unit == "J/tok"


def test_no_energy_is_recorded_where_a_run_has_none():
    runs = [summarize(_records(4, 16), 0.2, energy_j=32.0), summarize(_records(4, 16), 0.2)]
    assert "energy_j_per_token" not in {m.name for m in latency_records(runs)}
    assert summarize(_records(2, 4), 0.1, energy_j=0.0).energy_j_per_output_token is None
