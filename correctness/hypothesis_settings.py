"""Hypothesis settings for properties that run on real process groups and real files.

Why not hypothesis' defaults: one example here costs milliseconds to a second (a gloo
collective, an fsync, a DCP save), so the 200 ms deadline would flag healthy examples and
100 examples per property would blow the CI budget. So: no deadline, a bounded number of
examples per property (scaled by ``CORRECTNESS_EXAMPLES_SCALE`` for a deeper nightly run),
and reproducibility in CI (``CI=true`` or ``HYPOTHESIS_PROFILE=ci``: ``derandomize``, the same examples every run) or, on
a workstation, a fixed example database so that a failure found once is replayed first.

The conftest registers this as the profile ``distributed`` too, but properties apply it
explicitly through :func:`distributed`, so loading it never changes other folders' tests.
"""
from __future__ import annotations

import os
from pathlib import Path

from hypothesis import HealthCheck, Phase, settings
from hypothesis.database import DirectoryBasedExampleDatabase

REPO_ROOT = Path(__file__).resolve().parents[1]
DATABASE_PATH = REPO_ROOT / ".hypothesis" / "correctness"
# CI=true (GitHub Actions sets it) or HYPOTHESIS_PROFILE=ci (scripts/test.sh sets it).
IN_CI = (os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")
         or os.environ.get("HYPOTHESIS_PROFILE", "") == "ci")


def examples_scale() -> float:
    raw = os.environ.get("CORRECTNESS_EXAMPLES_SCALE", "1")
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"CORRECTNESS_EXAMPLES_SCALE must be a number, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"CORRECTNESS_EXAMPLES_SCALE must be > 0, got {value}")
    return value


def distributed(max_examples: int, **overrides) -> settings:
    """Settings for one property: ``max_examples`` at scale 1, no deadline, reproducible."""
    base = dict(
        max_examples=max(1, round(max_examples * examples_scale())),
        deadline=None,
        derandomize=IN_CI,
        database=None if IN_CI else DirectoryBasedExampleDatabase(str(DATABASE_PATH)),
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
        print_blob=True,
    )
    base.update(overrides)
    return settings(**base)


def planted(max_examples: int = 300) -> settings:
    """Settings for hunting a planted bug with ``hypothesis.find``: always derandomized, no
    database, so the minimal example reported in docs/correctness.md is the one every run finds.
    No explain phase: it re-runs ~100 variations of the minimal case to annotate a report that
    ``find`` never prints, and each variation here is a real save or a collective."""
    return settings(max_examples=max_examples, deadline=None, derandomize=True, database=None,
                    phases=[Phase.explicit, Phase.reuse, Phase.generate, Phase.shrink],
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
