"""Open-loop Poisson arrivals: completed throughput vs SLO goodput, and the highest rate that
still meets the SLO (seed §12.2: goodput peaks near 5 QPS while completed req/s keeps rising).

Offered rates are fractions of the capacity measured in this run (closed loop at the
profile's largest concurrency; the median of the profile's ``capacity_reps`` runs, so one
noisy run does not move every offered rate with it), so the sweep means the same thing on
any hardware. The GPU
profile uses the seed's SLO (TTFT <= 250 ms, TPOT <= 40 ms); the CPU profile's SLO is
relative to this run's unloaded latency (TTFT <= 4x, TPOT <= 2.5x the C=1 medians, about
the seed's SLO over its unloaded latency), with
floors of 10 ms / 1 ms so scheduler jitter on a shared 2-core machine cannot make it absurd.
Workload and metrics: perfgate.workloads.serving.measurements (``poisson_workload``: the unloaded and
capacity runs as setup phases, each offered rate a phase; ``poisson_reduce``).
"""
from __future__ import annotations

from fixtures.cases import parametrize, record
from perfgate.workloads import serving


@parametrize(serving.AREA, "poisson")
def test_poisson_rate_sweep(perf, servers, case):
    """Gates nothing on the CPU machine: SLO attainment and the rate sweep move by whole requests and
    whole rate steps with scheduler stalls there (record-only in baselines/cpu-*/tolerances.toml)."""
    record(perf, serving.AREA.run(servers, case))
