"""A session launches the training cases its selected tests read, not every case of their jobs.

`pytest -k 'test_ddp_microbatch and mb4'` on the GPU launched the whole world-1 job (strong, weak,
mb1..mb8: ~90 s of a 1.3 B model) to read one case. The plugin hands the selected tests' cases to
the run cache; training.batch_labels narrows each launch to what they read (their compared cases
and world-1 references included). Checked here on the job arithmetic and on the launches asked,
with the launcher replaced by a recorder (the harness's own logic; real launches are the perf suite's).
"""
from __future__ import annotations

import pytest

from perfgate.runcache import RunCache
from perfgate.workloads import training
from perfgate.workloads.training import plans

CPU, GPU_LARGE = training.PROFILES["cpu"], training.PROFILES["gpu-large"]


def case(profile, ident_part: str):
    [c] = [c for c in training.cases(profile) if c.id.endswith(ident_part)]
    return c


def cache(*selected) -> RunCache:
    runs = RunCache()
    runs.selected_cases = tuple(c.values for c in selected)
    return runs


def test_one_selected_micro_batch_launches_that_case_alone():
    runs = cache(case(GPU_LARGE, "1rank-gpt-1.3b-mb4"))
    j = training.job("ddp", GPU_LARGE, 1)
    assert training.batch_labels(runs, "ddp", GPU_LARGE, 1, j) == ["mb4"]
    # its world-1 reference comes along where it runs inside the world-N launch (CPU)
    runs = cache(case(CPU, "2rank-gpt-tiny-mb2"))
    assert training.batch_labels(runs, "ddp", CPU, 2, training.job("ddp", CPU, 2)) == ["mb2", "world1-mb2"]


def test_compared_cases_and_fsdp_references_come_along():
    runs = cache(case(CPU, "2rank-gpt-tiny-bucket0.25MiB"))
    assert training.batch_labels(runs, "ddp", CPU, 2, training.job("ddp", CPU, 2)) == ["bucket0.25MiB", "bucket1MiB"]
    fsdp = case(GPU_LARGE, "1rank-gpt-1.3b-untied-fsdp2-reshard-bf16reduce")
    j = training.job("fsdp", GPU_LARGE, 1)
    got = training.batch_labels(cache(fsdp), "fsdp", GPU_LARGE, 1, j)
    assert fsdp.values.label in got and len(got) == 3  # the mode, its DDP bf16 reference, and DDP fp32 (read)
    assert all(j.mode(x) for x in got)


def test_an_unknown_selection_measures_the_whole_job():
    j = training.job("ddp", GPU_LARGE, 1)
    assert training.batch_labels(RunCache(), "ddp", GPU_LARGE, 1, j) == [c.label for c in j.cases]
    # other engines', profiles' and world sizes' cases narrow nothing here
    runs = cache(case(CPU, "2rank-gpt-tiny-mb2"))
    assert training.batch_labels(runs, "ddp", GPU_LARGE, 1, j) == []


def test_a_session_of_one_case_asks_one_launch_for_it(monkeypatch):
    asked = []

    def launch_job(engine, profile, j):
        asked.append([c.label for c in j.cases + j.reference_cases])
        return {label: ["raw"] for label in asked[-1]}
    monkeypatch.setattr(training, "launch_job", launch_job)
    mb4 = case(GPU_LARGE, "1rank-gpt-1.3b-mb4")
    runs = cache(mb4)
    assert training.measure(runs, mb4) == {"mb4": ["raw"]}
    assert asked == [["mb4"]]
    # a test outside the selection (run anyway, e.g. by a plugin) still gets what it reads
    assert training.measure(runs, case(GPU_LARGE, "1rank-gpt-1.3b-mb8")) == {"mb8": ["raw"]}
    assert asked[-1] == ["mb8"]


@pytest.mark.parametrize("profile", [p for p in plans.PROFILES], ids=lambda p: p.name)
def test_every_case_reads_labels_its_launch_measures(profile):
    for c in training.cases(profile):
        if c.skip:  # e.g. the bf16 hook on gloo: never launched
            continue
        for world, labels in training.launches_read(c.values):
            j = training.job(c.values.engine, profile, world)
            assert set(labels) <= set(training._labels(c.values.engine, j)), c.id
