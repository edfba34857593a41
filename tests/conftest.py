import os

import pytest
from hypothesis import settings

# Loaded once, before any pytester run: an in-process run unloads the modules it imported, and SQLAlchemy (which
# a refresh loads to keep its run in the embedded SQLite store) fails when it is imported a second time.
import perfgate.store.backends.sql  # noqa: E402,F401

pytest_plugins = ["pytester"]

# CI runs derandomized: the same examples every run, so a red build is reproducible.
settings.register_profile("ci", derandomize=True, deadline=None, print_blob=True)
settings.register_profile("dev", deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))


@pytest.fixture(autouse=True)
def _inner_runs_are_not_xdist_workers(request, monkeypatch):
    """Under `pytest -n N` each worker has PYTEST_XDIST_WORKER set, and pytester's in-process runs
    inherit it: pytest-benchmark then takes the inner run for an xdist worker and disables itself
    (no bench.json: the bridge tests failed under -n 2 only), and perfgate.machine.cpu_use picks
    the wrong process root. An inner run is not a worker; tests that want xdist pass -n themselves."""
    if "pytester" in request.fixturenames:
        monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)


@pytest.fixture(autouse=True)
def _default_results_store_is_the_tests_own(tmp_path, monkeypatch):
    """A refresh keeps its run in the results store (perfgate.store.run_store): where none is named, the
    embedded default in the user's data folder. A test must never write there: the default lies in a folder
    of the test's own (tests that name the default's place set XDG_DATA_HOME themselves)."""
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))
