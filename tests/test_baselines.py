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
    keeps its samples to 1/100-1/1000 of their IQR, its medians and spreads to PRECISION digits, and no
    figure its samples give again (MAD, IQR, min, max, mean: computed when read); any layout is read."""
    from perfgate.store.baselines import baseline_bytes

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
    assert a["summary"]["median"] == 10.12346 and a["runs"][0] == {"median": 10.12346, "spread": 0.01234568, "n": 5}
    assert a["summary"]["samples"] == [10.123, 10.235, 9.988, 10.0, 10.556]   # IQR 0.23: to the 0.001
    assert sorted(a["summary"]) == ["median", "n", "samples"]
    loaded = store.load(HW, "a")["t2"]["a_gbps"].summary                      # the rest from the samples kept
    again = summarize(a["summary"]["samples"])
    assert (loaded.mad, loaded.iqr, loaded.min, loaded.max, loaded.mean) == (again.mad, again.iqr, 9.988, 10.556,
                                                                             again.mean)
    assert loaded.median == 10.12346 and loaded.n == 5
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


def test_a_new_entry_keeps_no_digit_below_its_noise_and_changes_no_order():
    """stored_entry (issue 51): each sample moves by at most 1/200 of the noise of the entry's quietest run (never
    more than 1/200 of the samples' IQR, or of their range where the IQR is 0; a PRECISION-digit step where all
    are equal), the samples keep their order and make no tie (what the judge's rank test and exact-value rule
    read: scipy's Mann-Whitney U takes tied samples another way), and a summary of quantiles (n above the
    samples kept) keeps its own MAD, IQR, min, max and mean."""
    import math
    import random

    from perfgate.store.baselines import PRECISION, stored_entry

    rng = random.Random(51)
    for case in range(1200):
        scale = 10 ** rng.uniform(-6, 9)
        kind = case % 4
        if kind == 0:
            sigma = rng.choice((1e-6, 1e-3, 0.05, 0.5))
            xs = [scale * rng.lognormvariate(0, sigma) for _ in range(rng.randint(1, 40))]
        elif kind == 1:
            xs = [scale] * rng.randint(1, 9)                                   # an exact value
        elif kind == 2:
            xs = [scale] * 6 + [scale * (1 + rng.choice((1e-9, 1e-4, 0.3)))]  # IQR 0, one sample apart
        elif case % 8 == 3:                                                    # one sample's near twin
            xs = [scale * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(9)]
            xs.append(xs[0] * (1 + 1e-8))
        else:
            xs = [scale * (1 + 0.01 * rng.gauss(0, 1)) for _ in range(200)]
        s = summarize(xs).to_dict()
        run = rng.choice((0.1, 1e-5, 0.0))                                     # a run's relative noise
        e = {"unit": "ms", "better": "lower", "summary": s, "provenance": "measured",
             "runs": [{"median": s["median"], "spread": run, "n": len(xs)}, {"median": s["median"], "n": 1}]}
        kept = stored_entry(e)["summary"]["samples"]
        spread = min(s["iqr"] or max(xs) - min(xs), run * s["median"] or math.inf)
        for x, k in zip(xs, kept):
            assert abs(k - x) <= max(spread / 200, abs(x) * 0.5 * 10 ** (1 - PRECISION)) * (1 + 1e-9), (xs, x, k)
            if not run:                                                        # no run's noise: the old 7 digits
                assert abs(k - x) <= abs(x) * 0.5 * 10 ** (1 - PRECISION) * (1 + 1e-9)
        pairs = [(a, b) for a, b in zip(sorted(range(len(xs)), key=xs.__getitem__),
                                        sorted(range(len(xs)), key=xs.__getitem__)[1:])]
        assert all(kept[i] <= kept[j] for i, j in pairs)                       # the order
        assert len(set(kept)) == len(set(xs))                                  # and no tie that was not there
    quantiles = summarize([float(i) for i in range(1000)]).to_dict()           # 200 stored of 1000 taken
    e = stored_entry({"unit": "ms", "better": "lower", "summary": quantiles, "provenance": "measured"})
    assert {k: e["summary"][k] for k in ("mad", "iqr", "min", "max", "mean")} == {
        "mad": 250.0, "iqr": 499.5, "min": 0.0, "max": 999.0, "mean": 499.5}
    # two sittings' runs 380 and 158 us apart (an IQR of 200 us): each keeps its own 0.3 us of noise
    xs = [380.288, 384.736, 387.648, 369.408, 158.4521517, 158.5398544, 158.6129341, 158.2463229]
    s = summarize(xs).to_dict()
    runs = [{"median": 384.7, "spread": 0.02, "n": 4}, {"median": 158.5, "spread": 0.0018, "n": 4}]
    kept = stored_entry({"unit": "us", "better": "lower", "summary": s, "provenance": "measured", "runs": runs})
    assert kept["summary"]["samples"][4:] == [158.452, 158.54, 158.613, 158.246]
