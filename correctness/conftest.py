"""Fixtures for the property tests: warm gloo groups, the hypothesis profile, a planted-bug summary.

* ``rank_pools``: one warm group of ranks per world size for the whole session (see
  correctness/rankpool.py for why a warm group and when it is replaced): gloo, or NCCL where
  the machine has a GPU per rank (``CORRECTNESS_BACKEND=auto|gloo|nccl``). NCCL pools are
  closed after each module so they do not hold the GPUs' file locks.
* hypothesis profile ``distributed`` (correctness/hypothesis_settings.py), registered so that
  ``pytest --hypothesis-profile=distributed`` works anywhere; the properties here apply it
  explicitly, so nothing changes for tests in other folders.
* ``planted_report``: test_planted_bugs.py records the minimal example hypothesis found for
  each planted bug; they are printed at the end of the run (xdist-safe: they travel in the
  test reports' user_properties).
"""
from __future__ import annotations

import pytest
from hypothesis import settings

from correctness.hypothesis_settings import distributed
from correctness.rankpool import RankPools

settings.register_profile("distributed", distributed(25))

_PLANTED_KEY = "planted_bug_minimal_example"
_POOLS_KEY = pytest.StashKey[RankPools]()
_planted_lines: list[str] = []


@pytest.fixture(scope="session")
def rank_pools(request):
    pools = RankPools(case_timeout_s=60.0, pg_timeout_s=30.0)
    request.session.stash[_POOLS_KEY] = pools
    try:
        yield pools
    finally:
        pools.close()


@pytest.fixture(scope="module", autouse=True)
def _release_gpu_pools(request):
    """NCCL pools hold the launcher's per-GPU file locks while warm: give the GPUs back after
    each module so perf tests in the same session can take them (gloo pools stay warm)."""
    yield
    pools = request.session.stash.get(_POOLS_KEY, None)
    if pools is not None:
        pools.close(backend="nccl")


@pytest.fixture
def planted_report(record_property):
    """Call with (bug, property, minimal example text) to list it in the end-of-run summary."""

    def report(bug: str, prop: str, example: str) -> None:
        record_property(_PLANTED_KEY, f"{bug} | caught by: {prop}\n    minimal example: {example}")

    return report


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        _planted_lines.extend(v for k, v in report.user_properties if k == _PLANTED_KEY)


def pytest_terminal_summary(terminalreporter) -> None:
    if _planted_lines:
        terminalreporter.section("planted bugs caught by the correctness properties")
        for line in _planted_lines:
            terminalreporter.write_line(line)
