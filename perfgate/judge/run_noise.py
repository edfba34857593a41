"""Noise by run, not by sample: each run's summary, the spread between runs, what follows.

Samples inside one run share the process, the host, the lease and the hour; a rank test on
them says whether this run differs from the baseline run, not whether it differs more than
runs do (DESIGN §2). So a baseline keeps, beside its pooled samples, one summary per
contributing run (median, within-run spread, when, commit, host identity), and:

- between-run spread = 1.4826 x MAD(run medians) / median(run medians) (absolute for
  fractions), defined from MIN_RUNS runs on;
- effective tolerance = max(configured, k x between-run spread);
- the reference level is the median of the run medians, not of the pooled samples (a run
  with more samples must not weigh more);
- runs whose medians disagree beyond the tolerance (one would fail against another) are not
  pooled silently.

Pure functions, no I/O; results.pool and gate.evaluate call them.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal sample * this = its standard deviation
MIN_RUNS = 3
DEFAULT_K = 3.0


@dataclass(frozen=True)
class RunSummary:
    """One run's contribution to a baseline entry."""

    median: float
    spread: float | None      # within-run robust spread (relative; absolute for fractions)
    n: int
    when: str | None = None
    commit: str | None = None
    host: dict = field(default_factory=dict)  # hostname, boot_id, gpu_uuids where the run recorded them
    file: str | None = None

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, {})}

    @classmethod
    def from_dict(cls, d: dict) -> "RunSummary":
        return cls(median=float(d["median"]), spread=d.get("spread"), n=int(d.get("n", 1)), when=d.get("when"),
                   commit=d.get("commit"), host=dict(d.get("host") or {}), file=d.get("file"))


def robust_spread(values: Iterable[float], *, absolute: bool = False) -> float | None:
    """1.4826 * MAD, relative to the median unless ``absolute``; None when undefined."""
    arr = np.asarray(list(values), dtype=float)
    if arr.size < 2:
        return None
    med = float(np.median(arr))
    mad = float(np.median(np.abs(arr - med))) * MAD_TO_SIGMA
    if absolute:
        return mad
    return None if med == 0 else mad / abs(med)


def host_identity(fingerprint: dict | None) -> dict:
    """What a results file says about the host it ran on: hostname, boot id, GPU UUIDs (if recorded)."""
    fp = fingerprint or {}
    out = {}
    if fp.get("hostname"):
        out["hostname"] = fp["hostname"]
    if fp.get("boot_id"):
        out["boot_id"] = fp["boot_id"]
    uuids = [g["uuid"] for g in fp.get("gpus") or [] if isinstance(g, dict) and g.get("uuid")]
    if uuids:
        out["gpu_uuids"] = uuids
    return out


def run_summary(samples: Sequence[float], *, absolute: bool, when: str | None = None, commit: str | None = None,
                fingerprint: dict | None = None, file: str | None = None) -> RunSummary:
    if not samples:
        raise ValueError("a run summary needs at least one sample")
    return RunSummary(median=float(np.median(np.asarray(samples, dtype=float))),
                      spread=robust_spread(samples, absolute=absolute), n=len(samples), when=when, commit=commit,
                      host=host_identity(fingerprint), file=file)


def between_run_spread(runs: Sequence[RunSummary], *, absolute: bool = False) -> float | None:
    """Robust spread of the run medians; None below MIN_RUNS runs (two points make no spread)."""
    if len(runs) < MIN_RUNS:
        return None
    return robust_spread([r.median for r in runs], absolute=absolute)


def center(runs: Sequence[RunSummary]) -> float:
    """The reference level: the median of the run medians."""
    if not runs:
        raise ValueError("no runs")
    return float(np.median([r.median for r in runs]))


def effective_tolerance(configured: float, runs: Sequence[RunSummary], *, k: float = DEFAULT_K,
                        absolute: bool = False) -> float:
    """max(configured, k x between-run spread); the configured tolerance below MIN_RUNS runs."""
    spread = between_run_spread(runs, absolute=absolute)
    return configured if spread is None else max(configured, k * spread)


def disagreement(medians: Sequence[float], *, absolute: bool = False) -> float:
    """How far apart the most distant two run medians are: max/min - 1 (absolute: max - min).

    Infinite when the medians straddle or touch zero in relative terms (they cannot be compared)."""
    lo, hi = min(medians), max(medians)
    if absolute:
        return hi - lo
    if lo == hi:
        return 0.0
    if lo <= 0:
        return float("inf")
    return hi / lo - 1


def disagree(medians: Sequence[float], tol: float, *, absolute: bool = False) -> bool:
    """Whether some run would fail against another at this tolerance (pooling them hides that)."""
    return len(medians) >= 2 and disagreement(medians, absolute=absolute) > tol * (1 + 1e-9) + 1e-12
