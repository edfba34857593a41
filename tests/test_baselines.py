"""BaselineStore: atomic writes, merge, .prev, and clear errors for bad files."""
from __future__ import annotations

import json
import multiprocessing

import pytest

from perfgate.store.baselines import BaselineError, BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metrics import summarize

HW = "cpu-Test-2c"


def entry(median: float) -> BaselineEntry:
    return BaselineEntry(unit="GB/s", better="higher", summary=summarize([median] * 5), tol=0.05,
                         provenance="measured", when="2026-11-30T00:00:00+00:00", commit="abc")


def test_round_trip_and_merge(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, "collectives", {"t1": {"busbw_gbps": entry(10)}})
    store.write(HW, "collectives", {"t2": {"busbw_gbps": entry(20)}})
    loaded = store.load(HW, "collectives")
    assert loaded["t1"]["busbw_gbps"].summary.median == 10
    assert loaded["t2"]["busbw_gbps"].summary.median == 20
    assert store.lookup(HW, "collectives", "t3", "busbw_gbps") is None
    assert store.hardware_ids() == [HW]
    prev = json.loads((tmp_path / HW / "collectives.json.prev").read_text())
    assert list(prev["entries"]) == ["t1"]  # the version before the last write is recoverable


def test_no_temp_files_left(tmp_path):
    store = BaselineStore(tmp_path)
    store.write(HW, "a", {"t": {"m": entry(1)}})
    leftovers = [p.name for p in (tmp_path / HW).iterdir() if p.name.endswith(".tmp")]
    assert leftovers == []


@pytest.mark.parametrize("content, match", [
    ('{"kind": "perfgate-baseline", "schema_version": 1, "entries": {"t": {"m": {"un', "not valid JSON"),
    ('{"kind": "perfgate-baseline", "schema_version": 99, "entries": {}}', "schema version 99"),
    ('{"kind": "something-else"}', "not a perfgate baseline"),
    ('{"kind": "perfgate-baseline", "schema_version": 1, "entries": {"t": {"m": {"unit": "GB/s"}}}}',
     r"entries\['t'\]\['m'\]\.better: must be a string, got nothing \(the key is missing or null\)"),
])
def test_bad_files_give_clear_errors(tmp_path, content, match):
    path = tmp_path / HW / "x.json"
    path.parent.mkdir()
    path.write_text(content)
    with pytest.raises(BaselineError, match=match) as info:
        BaselineStore(tmp_path).load(HW, "x")
    assert str(path) in str(info.value)


def _writer(root, i):
    BaselineStore(root).write(HW, "shared", {f"t{i}": {"m": entry(i + 1)}})  # 0 GB/s measured nothing


def test_concurrent_writers_lose_no_entries(tmp_path):
    # several processes merging into one file at once (xdist workers refreshing): the lock keeps all
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), i)) for i in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert all(p.exitcode == 0 for p in procs)
    assert sorted(BaselineStore(tmp_path).load(HW, "shared")) == sorted(f"t{i}" for i in range(6))


def test_the_file_is_one_line_per_entry_and_a_refresh_leaves_other_lines_alone(tmp_path):
    """What a refresh adds to git (results-store/README.md): an untouched entry keeps its bytes, a new one
    keeps its samples and spread figures to PRECISION digits and its median exactly; any layout is read."""
    from perfgate.store.baselines import PRECISION, baseline_bytes

    samples = [10.123456789012, 10.2345678901234, 9.98765432109876, 10.0, 10.5555555555555]
    store = BaselineStore(tmp_path)
    measured = BaselineEntry(unit="GB/s", better="higher", summary=summarize(samples), tol=0.05,
                             provenance="measured", runs=({"median": 10.123456789012, "spread": 0.0123456789012,
                                                           "n": 5},))
    imported = BaselineEntry(unit="GB/s", better="higher", summary=summarize(samples), tol=0.05,
                             provenance="imported: a report")
    store.write(HW, "a", {"t2": {"b_gbps": measured, "a_gbps": measured}, "t1": {"x_gbps": imported}})
    path = tmp_path / HW / "a.json"
    lines = path.read_text().splitlines()
    starts = [line.split(":", 1)[0].strip() for line in lines if line.startswith("   ")]
    assert starts == ['"x_gbps"', '"a_gbps"', '"b_gbps"']       # one line each, tests and metrics sorted
    stored = json.loads(path.read_text())["entries"]
    a = stored["t2"]["a_gbps"]
    assert a["summary"]["median"] == summarize(samples).median and a["runs"][0]["median"] == 10.123456789012
    assert a["summary"]["samples"] == [float(f"{x:.{PRECISION}g}") for x in samples] and a["runs"][0]["spread"] == 0.01234568
    assert stored["t1"]["x_gbps"]["summary"]["samples"] == samples            # another tool's numbers as reported
    before = {line for line in lines if '"a_gbps"' in line or '"x_gbps"' in line}
    store.write(HW, "a", {"t2": {"b_gbps": entry(11)}})                    # a refresh of one metric
    after = path.read_text().splitlines()
    assert before <= set(after) and len(set(after) - set(lines)) <= 2    # its line (and "updated") only
    # a file of the earlier layout (indented JSON) reads the same and is rewritten without changing a value
    old = json.loads(path.read_text())
    path.write_text(json.dumps(old, indent=1) + "\n")
    store = BaselineStore(tmp_path)
    assert store.load(HW, "a")["t1"]["x_gbps"].summary.samples == tuple(samples)
    assert json.loads(baseline_bytes(old)) == old
