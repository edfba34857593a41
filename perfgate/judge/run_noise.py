"""Noise by run, not by sample: each run's summary, the spread between runs, what follows.

Samples inside one run share the process, the host, the sitting and the hour; a rank test on
them says whether this run differs from the baseline run, not whether it differs more than
runs do (DESIGN §2). So a baseline keeps, beside its pooled samples, one summary per
contributing run (median, within-run spread, when, commit, host identity), and:

- between-run spread = 1.4826 x MAD(run medians) / median(run medians) (absolute for
  fractions), defined from MIN_RUNS runs on;
- effective tolerance = max(configured, k x between-run spread), the widening capped at
  MAX_NOISE_TOL (100 %; 0.5 absolute): runs that disagree more than that say the metric cannot be
  gated, and letting them widen the tolerance further lets anything pass (run medians of
  1e-300, 1 and 1e29 made it 445 %); the verdict says when the cap applied;
- the reference level is the median of the run medians, not of the pooled samples (a run
  with more samples must not weigh more), with the runs of one sitting (one boot on one day: one
  job on a node booted for it) first taken as one, their median (a sitting that ran twice must not
  weigh twice);
- runs whose medians disagree beyond the tolerance (one would fail against another) are not
  pooled silently.

Pure functions, no I/O; pooling.pool and gate.evaluate call them.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field
from typing import Iterable, Sequence

import numpy as np

MAD_TO_SIGMA = 1.4826  # MAD of a normal sample * this = its standard deviation
MIN_RUNS = 3
DEFAULT_K = 3.0
# The most that between-run noise may widen a tolerance to: relative (100 %: a figure twice the
# reference level), and absolute for fractions; a configured tolerance may be wider. No gated metric
# of the committed baselines changes tolerance: the widest widening among them is 56 % (1xH200
# serving, C=16), bar the CPU gloo time_over_p2p ratios (110-147 %), configured at 150 %.
MAX_NOISE_TOL = 1.0
MAX_NOISE_TOL_ABSOLUTE = 0.5


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
        """From a checked file (perfgate.store.shapes.check_runs); a NaN median is refused here too."""
        _finite([d["median"]], "run median")
        return cls(median=float(d["median"]), spread=d.get("spread"), n=int(d.get("n", 1)), when=d.get("when"),
                   commit=d.get("commit"), host=dict(d.get("host") or {}), file=d.get("file"))


def _finite(values, what: str) -> None:
    """Defence in depth: the readers refuse non-finite numbers, and no caller may bring one either
    (a NaN reference level made every change ``pass``)."""
    bad = [v for v in values if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(v)]
    if bad:
        raise ValueError(f"{what} {bad[0]!r} is not a finite number: the baseline is damaged; re-create it "
                         f"with `perfgate refresh`")


def robust_spread(values: Iterable[float], *, absolute: bool = False) -> float | None:
    """1.4826 * MAD, relative to the median unless ``absolute``; None when undefined."""
    values = list(values)
    _finite(values, "value")
    arr = np.asarray(values, dtype=float)
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


def run_summary_of(summary: dict, *, absolute: bool, when: str | None = None, commit: str | None = None,
                   fingerprint: dict | None = None, file: str | None = None) -> RunSummary:
    """One run's summary from its metric's stored summary (a results file's ``summary``): the median, MAD
    and n of every sample the run took, not of the ones it stored. A summary without ``n`` or ``mad``
    (hand-written, imported) is summarised from its samples."""
    samples = summary.get("samples") or [summary["median"]]
    if "n" not in summary or "mad" not in summary:
        return run_summary(samples, absolute=absolute, when=when, commit=commit, fingerprint=fingerprint, file=file)
    median, n = float(summary["median"]), int(summary["n"])
    _finite([median, summary["mad"]], "summary value")
    mad = float(summary["mad"]) * MAD_TO_SIGMA
    spread = None if n < 2 else mad if absolute else (None if median == 0 else mad / abs(median))
    return RunSummary(median=median, spread=spread, n=n, when=when, commit=commit,
                      host=host_identity(fingerprint), file=file)


def between_run_spread(runs: Sequence[RunSummary], *, absolute: bool = False) -> float | None:
    """Robust spread of the run medians; None below MIN_RUNS runs (two points make no spread)."""
    if len(runs) < MIN_RUNS:
        return None
    return robust_spread([r.median for r in runs], absolute=absolute)


def sitting_key(boot_id: str | None, when: str | None) -> str | None:
    """A sitting: one boot on one (UTC) day. A node booted fresh for each job makes each job a
    sitting; a workstation up for a month is a new sitting each day. None without a boot id."""
    return f"{boot_id}@{(when or '')[:10]}" if boot_id else None


def sitting(run: RunSummary) -> str | None:
    """The sitting the run was measured in (:func:`sitting_key`), None where the run recorded no boot id."""
    return sitting_key(run.host.get("boot_id"), run.when)


def center(runs: Sequence[RunSummary]) -> float:
    """The reference level: the median over sittings of each sitting's median run median (a run that
    recorded no boot id is a sitting of its own, so a baseline of such runs keeps the median of them all)."""
    if not runs:
        raise ValueError("no runs")
    _finite([r.median for r in runs], "run median")
    groups: dict[object, list[float]] = {}
    for i, r in enumerate(runs):
        groups.setdefault(sitting(r) or i, []).append(r.median)
    return float(np.median([float(np.median(g)) for g in groups.values()]))


def _widening(configured: float, runs: Sequence[RunSummary], k: float, absolute: bool) -> tuple[float, float]:
    """(k x between-run spread, its cap); 0 below MIN_RUNS runs."""
    _finite([configured, k], "tolerance")
    spread = between_run_spread(runs, absolute=absolute)
    return (0.0 if spread is None else k * spread), (MAX_NOISE_TOL_ABSOLUTE if absolute else MAX_NOISE_TOL)


def effective_tolerance(configured: float, runs: Sequence[RunSummary], *, k: float = DEFAULT_K,
                        absolute: bool = False) -> float:
    """max(configured, min(k x between-run spread, the cap)); the configured tolerance below MIN_RUNS runs."""
    wide, cap = _widening(configured, runs, k, absolute)
    return max(configured, min(wide, cap))


def cap_note(configured: float, runs: Sequence[RunSummary], *, k: float = DEFAULT_K,
             absolute: bool = False) -> str | None:
    """What the verdict says when the cap held the tolerance below the runs' noise; None otherwise."""
    wide, cap = _widening(configured, runs, k, absolute)
    if wide <= cap or configured >= cap:
        return None
    shown = (lambda x: f"{x:.3g}") if absolute else (lambda x: f"{x * 100:.0f}%")
    return (f"the baseline's runs spread so widely that {k:g} x their spread ({shown(wide)}) would let almost any "
            f"change pass; the tolerance is capped at {shown(cap)}: re-measure the baseline, or mark the metric "
            f"record_only")


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
