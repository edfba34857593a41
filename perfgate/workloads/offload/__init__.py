"""MoE expert offload: how fast can one missed expert come off the SSD, and how often does it miss?

The reference is the second seed report: a 35B-A3B MoE model streamed from SSD on an 8 GB machine.
Per token and per layer the router picks k experts; an expert not in RAM must be read from the GGUF
file as three separate tensor segments (gate, up, down) that lie far apart in the file. Decode speed
is then bounded by (a) how long the slowest missed expert of a layer takes to read and (b) how many
experts miss.

Modules, one job each:
  gguf_layout   GGUF file -> per-expert (offset, length) segments
  page_cache    drop a file's pages from the page cache; residency check; O_DIRECT buffers
  device_probe  the device: random reads of one block size at 1..16 threads; 4 KiB latency / IOPS
  expert_reads  the critical path: one expert (3 segments) and one layer (k experts) read cold
  cache_sim     routing traces -> hit rates of LRU / Belady / hot-set pin / admit-after-N, reuse, U(k)
  decode_model  measured miss latency + hit rate + layer count -> predicted decode tok/s

Nothing here imports pytest: tests in perf/offload/ and the CLIs in tools/ both call these.

This file is the area: one profile (profiles.py: the machine's own SSD, markers cpu + ssd) and the
cases of every offload test, each of a ``kind`` whose row (measurements.py) says how it is measured
(on the session's model file and what is open on it: measurements.OffloadSource) and reduced (e.g. a
read comparison: per-round raw read times of two strategies, interleaved -> one ratio of their medians
per round, the gated figure, and the times beside it). The reads run in this process (no ranks): what
would be per rank elsewhere is per round here. Tests that take no parameter (their ids have no
brackets) run the one case of their kind.
"""
from __future__ import annotations

from typing import Any

from perfgate.workloads.area import Area, Case, Record
from perfgate.workloads.offload.fio import fio_path
from perfgate.workloads.offload.measurements import (ROWS, OffloadSource, ReadComparison, ReadRounds, read_specs,
                                                     trace_cases)
from perfgate.workloads.offload.profiles import GROUP, MARKS, SSD, Profile

__all__ = ["AREA", "GROUP", "MARKS", "PROFILES", "Profile", "ReadComparison", "ReadRounds", "SSD", "cases",
           "read_specs", "trace_cases"]

PROFILES = {"ssd": SSD}


def _case(kind: str, ident: str, values=None, skip: str | None = None) -> Case:
    return Case(ident, values, MARKS, GROUP, skip=skip, kind=kind)


def cases(profile: Profile) -> list[Case]:
    """Every offload test's cases: read comparisons, the decode prediction, the page-cache check, device
    probes and their scaling, the fio check (skipped where fio is not installed). The expert-cache cases
    come from the trace families the test names (trace_cases)."""
    out = [_case("expert_read", io, ReadComparison(io)) for io in ("buffered", "direct")]
    out += [_case("layer_read", f"{io}-{t}threads", ReadComparison(io, threads=t)) for io, t in profile.layer_cases]
    out += [_case("split_read", f"{n}chunks", ReadComparison("buffered", split=n)) for n in profile.split_chunks]
    out += [_case(kind, profile.name) for kind in ("decode_prediction", "page_cache_drop", "probe_scaling")]
    out += [_case("device_probe", f"segment-{t}threads", t) for t in profile.probe_threads]
    out += [_case("small_read_probe", f"4KiB-{t}thread" + ("s" if t > 1 else ""), t) for t in (1, 16)]
    no_fio = None if fio_path() else "fio is not installed (apt-get install fio): no reference to compare our reads with"
    out += [_case("fio_crosscheck", f"qd{t}", t, skip=no_fio) for t in (1, 8)]
    return out


def measure(source: OffloadSource, case: Case) -> Any:
    """The case's row's measurement, on the session's model file (source)."""
    return ROWS[case.kind].measure(source, case)


def reduce(case: Case, raw: Any) -> list[Record]:
    """The case's row's reduce: metrics, raw data attached, hard invariants checked."""
    return ROWS[case.kind].reduce(case, raw)


AREA: Area[Profile, OffloadSource, Any] = Area("offload", PROFILES, cases, measure, reduce)
