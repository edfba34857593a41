"""Runs each collective sweep (one op, backend, world size, placement) once per session.

The tests are per message size, but launching ranks per size would spend most of the
time starting processes; a sweep measures every size in one launch and the tests read
their slice. A re-measurement (perfgate retry) launches a fresh job for that size only.
"""
from __future__ import annotations

import pytest

from perfgate.launch import launch
from perfgate.workloads.collectives import CollectiveSpec


class CollectiveSweeps:
    def __init__(self):
        self._cache: dict[tuple, dict[int, dict]] = {}

    def _launch(self, op, backend, world, sizes, devices):
        env = {"CUDA_VISIBLE_DEVICES": ",".join(map(str, devices))} if devices else {}
        spec = CollectiveSpec(op=op, sizes=tuple(sizes))
        timeout = 120 + 30 * len(sizes) * (2 if backend == "gloo" else 1)
        per_rank = launch("perfgate.workloads.collectives:run", spec, world_size=world, backend=backend,
                          timeout_s=timeout, env=env)
        # timings are already max-reduced across ranks; wrong counts differ per rank: sum them
        merged = {}
        for i, size in enumerate(sizes):
            res = dict(per_rank[0][i])
            res["wrong"] = sum(r[i]["wrong"] for r in per_rank)
            merged[size] = res
        return merged

    def get(self, op, backend, world, size, all_sizes, devices=None, fresh=False) -> dict:
        key = (op, backend, world, tuple(devices or ()))
        if fresh:
            return self._launch(op, backend, world, [size], devices)[size]
        if key not in self._cache:
            self._cache[key] = self._launch(op, backend, world, list(all_sizes), devices)
        return self._cache[key][size]


@pytest.fixture(scope="session")
def collective_sweeps() -> CollectiveSweeps:
    return CollectiveSweeps()
