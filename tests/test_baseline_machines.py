"""Each baseline entry keeps the machine it was measured on through a partial refresh.

A baseline file holds one fingerprint. Until 2026-12-04 a refresh of some of its entries
(``perfgate refresh --test``, one area's tests) from another machine of the same hardware id
(another CPU generation under one CPU id, a 16-core host under the GPUs a 32-core one measured)
overwrote it, and every entry it kept then claimed the new machine: a host-bound figure of the
old machine was judged on the new one as comparable, and the other way round.
"""
from __future__ import annotations

import json

import pytest

from perfgate.judge.baseline_choice import BaselineChooser
from perfgate.judge.metrics import summarize
from perfgate.store.baselines import BaselineError, BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry

HW = "1xH200"
AREA = "training"
T1 = "perf/training/test_ddp.py::test_ddp_microbatch[nccl-1rank-gpt-1.3b-mb4]"
T2 = "perf/training/test_ddp.py::test_ddp_microbatch[nccl-1rank-gpt-1.3b-mb8]"


def machine(cores: int) -> dict:
    return {"gpus": [{"name": "NVIDIA H200", "memory_gib": 139.8}], "links": [["X"]],
            "cpu": {"vendor": "AuthenticAMD", "model": "AMD EPYC 9654", "arch": "x86_64", "isa": "avx512",
                    "cores": cores, "threads_per_core": 1, "numa_nodes": 1},
            "software": {"torch": "2.11.0+cu130"}}


def entry(ms: float) -> BaselineEntry:
    return BaselineEntry(unit="ms", better="lower", summary=summarize([ms, ms * 1.001, ms * 0.999]), tol=None,
                         provenance="measured")


def both(ms: float = 150.0) -> dict:
    return {T1: {"step_ms": entry(ms)}, T2: {"step_ms": entry(2 * ms)}}


def chooser(store: BaselineStore, cores: int) -> BaselineChooser:
    return BaselineChooser(store, HW, lambda: machine(cores))


def host_diff(store: BaselineStore, here_cores: int, test: str) -> list[str]:
    return chooser(BaselineStore(store.root), here_cores).choose(test, "step_ms", dependency="host").diff.host


def test_a_partial_refresh_from_another_host_keeps_the_old_entries_machine(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=machine(32))
    store.write(HW, AREA, {T2: {"step_ms": entry(310.0)}}, fingerprint=machine(16))
    doc = json.loads((tmp_path / HW / f"{AREA}.json").read_text())
    assert doc["fingerprint"]["cpu"]["cores"] == 16
    key = doc["entries"][T1]["step_ms"]["fingerprint_key"]
    assert doc["fingerprints"] == {key: machine(32)}
    assert "fingerprint_key" not in doc["entries"][T2]["step_ms"]
    # on the 32-core host the kept entry is comparable and the new one is not; on the 16-core host the reverse
    assert host_diff(store, 32, T1) == [] and host_diff(store, 32, T2) == ["cpu.cores: 16 (baseline) -> 32 (here)"]
    assert host_diff(store, 16, T2) == [] and host_diff(store, 16, T1) == ["cpu.cores: 32 (baseline) -> 16 (here)"]


def refreshed_twice(tmp_path, test: str, cores: int) -> dict:
    """The file after both entries on the 32-core host, mb8 on the 16-core one, then ``test`` on ``cores``."""
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=machine(32))
    store.write(HW, AREA, {T2: {"step_ms": entry(310.0)}}, fingerprint=machine(16))
    store.write(HW, AREA, {test: {"step_ms": entry(300.0)}}, fingerprint=machine(cores))
    return json.loads((tmp_path / HW / f"{AREA}.json").read_text())


def test_refreshing_the_kept_entry_on_the_new_host_drops_its_name_and_the_table(tmp_path):
    doc = refreshed_twice(tmp_path, T1, 16)
    assert "fingerprints" not in doc
    assert all("fingerprint_key" not in m["step_ms"] for m in doc["entries"].values())


def test_a_partial_refresh_back_on_the_first_host_unnames_what_matches_it(tmp_path):
    doc = refreshed_twice(tmp_path, T2, 32)
    assert "fingerprints" not in doc and doc["fingerprint"] == machine(32)


def test_the_same_machine_and_a_replace_write_no_table(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=machine(32))
    same_boot_other_software = dict(machine(32), software={"torch": "2.12.0+cu130"})
    store.write(HW, AREA, {T2: {"step_ms": entry(301.0)}}, fingerprint=same_boot_other_software)
    assert "fingerprints" not in json.loads((tmp_path / HW / f"{AREA}.json").read_text())
    store.write(HW, AREA, {T2: {"step_ms": entry(301.0)}}, fingerprint=machine(16), replace=True)
    doc = json.loads((tmp_path / HW / f"{AREA}.json").read_text())
    assert "fingerprints" not in doc and list(doc["entries"]) == [T2]


def test_an_import_that_knows_no_machine_keeps_the_files(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=machine(32))
    store.write(HW, AREA, {T2: {"step_ms": entry(301.0)}}, fingerprint=None)
    doc = json.loads((tmp_path / HW / f"{AREA}.json").read_text())
    assert doc["fingerprint"] == machine(32) and "fingerprints" not in doc


def test_an_entry_of_a_file_that_knew_no_machine_stays_unverified(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=None)
    store.write(HW, AREA, {T2: {"step_ms": entry(301.0)}}, fingerprint=machine(16))
    diff = chooser(BaselineStore(tmp_path), 32).choose(T1, "step_ms", dependency="host").diff
    assert diff.host == [] and diff.unverified == ["fingerprint (the baseline file stores none)"]


@pytest.mark.parametrize("damage, says", [
    (lambda d: d["entries"][T1]["step_ms"].__setitem__("fingerprint_key", "0123abcd"), "does not hold"),
    (lambda d: d["entries"][T1]["step_ms"].__setitem__("fingerprint_key", 7), "must be a string"),
    (lambda d: d.__setitem__("fingerprints", {"k": {"cpu": {"cores": "many"}}}), "cores"),
], ids=["key-names-no-machine", "key-not-a-string", "machine-with-a-bad-field"])
def test_a_damaged_table_is_one_clear_error(tmp_path, damage, says):
    store = BaselineStore(tmp_path)
    store.write(HW, AREA, both(), fingerprint=machine(32))
    path = tmp_path / HW / f"{AREA}.json"
    doc = json.loads(path.read_text())
    damage(doc)
    path.write_text(json.dumps(doc))
    with pytest.raises(BaselineError, match=says) as err:
        BaselineStore(tmp_path).load(HW, AREA)
    assert str(path) in str(err.value) and "\n" not in str(err.value)
