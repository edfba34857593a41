"""The results store's backends (perfgate.store.backends): the same tests on a folder, an SQLite file and a
real PostgreSQL server started here (tests/postgres_server.py), never a mock.

What each must hold: a run stored once by content hash; a name never re-used for other content; hostile
test ids and metric names (quotes, ``;``, ``--``, NUL, 10 kB) stored and read back as data, hostile
hardware ids refused in a run and harmless as a query; a writer killed mid-push leaves nothing visible;
two writers of one run store it once; a server that is down or refuses the login is one line without the
password; a read-only login reads.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from perfgate.store.backends import StoreError, StoreUnavailable, documents, open_store

sys.path.insert(0, str(Path(__file__).parent))
import postgres_server  # noqa: E402

HW = "cpu-test-2c"
HOSTILE = ["x'); DROP TABLE perfgate_runs; --", 'say "hi"; --', "nul\x00inside", "\u00e9\u2603 \U0001f600",
           "perf/a/test_x.py::test_y[" + "k" * 10_000 + "]", "back\\slash %s %(x)s ? $1"]


def results_doc(i: int, *, hw: str = HW, tests: list[str] | None = None, metric: str = "busbw_gbps",
                created: str | None = None) -> dict:
    tests = tests or [f"perf/collectives/test_all_reduce.py::test_all_reduce[gloo-2rank-{i}KiB]"]
    results = [{"test_id": t, "area": "collectives", "metric": m, "unit": "GB/s", "better": "higher", "tol": 0.05,
                "gated": True, "summary": {"median": 10.0 + i, "mad": 0.1, "iqr": 0.2, "min": 9.0 + i,
                                           "max": 11.0 + i, "mean": 10.0 + i, "n": 5,
                                           "samples": [9.0 + i, 9.5 + i, 10.0 + i, 10.5 + i, 11.0 + i]},
                "verdict": {"outcome": "pass"}, "baseline": None, "tainted": []}
               for t in tests for m in ([metric] if isinstance(metric, str) else metric)]
    return {"schema_version": 1, "kind": "perfgate-results", "created": created or f"2026-12-01T00:{i // 60:02d}:"
            f"{i % 60:02d}+00:00", "hardware_id": hw, "commit": f"c{i:011d}", "fingerprint": {},
            "interrupted": False, "results": results, "attachments": {"raw": list(range(50))}}


def raw_of(doc: dict) -> bytes:
    return json.dumps(doc, indent=1).encode()


@pytest.fixture(scope="module")
def postgres():
    if postgres_server.binaries() is None:
        pytest.skip(f"no PostgreSQL server binaries to start a real server: {postgres_server.INSTALL}")
    server = postgres_server.PostgresServer()
    try:
        yield server
    finally:
        server.stop()


_db_count = 0


@pytest.fixture(params=["folder", "sqlite", "postgresql"])
def spec(request, tmp_path):
    """Where a fresh store lives, for each backend."""
    global _db_count
    if request.param == "folder":
        return str(tmp_path / "store")
    if request.param == "sqlite":
        return str(tmp_path / "runs.sqlite")
    server = request.getfixturevalue("postgres")
    _db_count += 1
    return server.new_database(f"t{_db_count}")


def test_a_run_is_stored_once_and_read_back_byte_for_byte(spec):
    raw = raw_of(results_doc(1))
    with open_store(spec, create=True) as store:
        first = store.put(raw, f"{HW}/run1.json.gz")
        again = store.put(raw, f"{HW}/other-name.json.gz")   # same content under another name
        assert first.added and not again.added and again.entry.name == f"{HW}/run1.json.gz"
        assert first.entry.sha256 == documents.sha256_of(raw)
        assert [e.sha256 for e in store.entries()] == [first.entry.sha256]
        assert store.raw(first.entry.sha256[:12]) == raw
        assert store.document(f"{HW}/run1.json.gz")["commit"] == "c00000000001"
        with pytest.raises(StoreError, match="already holds another run"):
            store.put(raw_of(results_doc(2)), f"{HW}/run1.json.gz")
    with open_store(spec) as reader:   # a new connection sees it
        assert len(reader.entries(HW)) == 1 and reader.entries("other-id") == []


def test_a_series_is_one_query(spec):
    with open_store(spec, create=True) as store:
        for i in range(5):
            store.put(raw_of(results_doc(i, tests=["t::a", "t::b"])), f"{HW}/r{i}.json.gz")
        points = store.series(HW, "t::a", "busbw_gbps")
        assert [p.median for p in points] == [10.0, 11.0, 12.0, 13.0, 14.0]
        assert [p.commit for p in points] == [f"c{i:011d}" for i in range(5)]
        assert points[0].q1 <= points[0].median <= points[0].q3 and points[0].n == 5
        assert len(store.metric_rows()) == 10 and store.series(HW, "t::c", "busbw_gbps") == []


def test_hostile_names_are_data(spec):
    with open_store(spec, create=True) as store:
        stored = store.put(raw_of(results_doc(1, tests=HOSTILE, metric=HOSTILE)), f"{HW}/hostile.json.gz")
        rows = store.metric_rows(HW)
        assert {(r.test_id, r.metric) for r in rows} == {(t, m) for t in HOSTILE for m in HOSTILE}
        for name in HOSTILE:
            [point] = store.series(HW, name, name)
            assert point.test_id == name and point.metric == name and point.sha256 == stored.entry.sha256
        for hostile_id in HOSTILE:  # as a query: nothing found, nothing broken
            assert store.entries(hostile_id) == [] and store.series(hostile_id, HOSTILE[0], HOSTILE[0]) == []
            assert store.entry(hostile_id) is None
        for hostile_id in ("a'; --", "x" * 10_000, "nul\x00"):
            with pytest.raises(StoreError, match="not a valid hardware id"):
                store.put(raw_of(results_doc(2, hw=hostile_id)), f"{HW}/bad.json.gz")
        assert len(store.entries()) == 1 and store.document(stored.entry.sha256)["results"][0]["test_id"] == HOSTILE[0]


def test_numbers_are_checked_as_they_go_in(spec):
    doc = results_doc(1)
    doc["results"][0]["summary"]["median"] = -3.0
    with open_store(spec, create=True) as store:
        with pytest.raises(StoreError, match="negative"):
            store.put(raw_of(doc), f"{HW}/neg.json.gz")
        with pytest.raises(StoreError, match="not valid JSON"):
            store.put(b'{"kind": "perfgate-results", "median": NaN', f"{HW}/nan.json.gz")
        assert store.entries() == []


def test_a_digest_stands_for_its_run_until_the_run_comes(spec):
    raw = raw_of(results_doc(3))
    sha = documents.sha256_of(raw)
    digest = documents.digest_of(json.loads(raw), sha)
    with open_store(spec, create=True) as store:
        assert store.put(digest, f"{HW}/r3.json.gz").added
        entry = store.entry(sha)
        assert entry.digest and store.series(HW, results_doc(3)["results"][0]["test_id"], "busbw_gbps")
        assert store.put(raw, f"{HW}/r3.json.gz").added               # the run replaces its digest
        assert not store.put(digest, f"{HW}/r3.json.gz").added        # and a digest never replaces the run
        assert not store.entry(sha).digest and store.raw(sha) == raw
        assert len(store.metric_rows()) == 1


def test_a_digest_keeps_what_verify_baselines_and_a_trend_read_and_the_old_one_is_still_read():
    """Schema 2 (issue 51: what a refresh adds to git): no MAD, no baseline, tolerance and IQR to DIGEST_DIGITS,
    the stored samples' median only where it is not the median; schema 1 digests (committed before) are read, and
    digest_of(..., schema=1) still makes their bytes. Both give verify-baselines the same median and n."""
    doc = results_doc(3)
    doc["results"][0]["summary"]["iqr"] = 0.123456789
    doc["results"][0]["tol"] = 0.0523456789
    doc["results"][0]["baseline"] = {"median": 12.5, "mad": 0.3, "provenance": "measured, pooled over 3 runs"}
    first = dict(doc["results"][0], metric="first_200", summary=dict(doc["results"][0]["summary"], n=900,
                                                                       median=12.0))  # stored before issue 47
    doc["results"].append(first)
    raw = raw_of(doc)
    sha = documents.sha256_of(raw)
    two, one = documents.digest_of(doc, sha), documents.digest_of(doc, sha, schema=1)
    r, old = json.loads(two)["results"], json.loads(one)["results"]

    def old_tol(data: bytes) -> float:
        return json.loads(data)["results"][0]["tol"]
    assert json.loads(two)["schema_version"] == 2 and json.loads(one)["schema_version"] == 1
    assert r[0]["summary"] == {"median": 13.0, "iqr": 0.1235, "n": 5, "stored": 5} and "baseline" not in r[0]
    assert r[0]["tol"] == 0.05235 and old_tol(one) == 0.0523456789
    assert r[1]["summary"]["samples"] == [13.0] and r[0]["verdict"] == {"outcome": "pass"}
    assert old[0]["summary"]["mad"] == 0.1 and old[0]["baseline"]["median"] == 12.5
    assert len(two) < len(one)
    for data in (two, one):
        parsed = documents.parse(data, "digest")
        assert [(x["summary"]["median"], x["summary"]["samples"], documents.stored_count(x["summary"]))
                for x in parsed["results"]] == [(13.0, [13.0], 5), (12.0, [13.0], 5)]
    entry = documents.entry_of(json.loads(two), sha, f"{HW}/r.json.gz")
    rows = documents.metric_rows(documents.parse(two, "d"), entry)
    assert [(x.metric, x.median, x.baseline_median) for x in rows] == [("busbw_gbps", 13.0, None),
                                                                       ("first_200", 12.0, None)]
    assert [x.q3 - x.q1 for x in rows] == pytest.approx([0.1235, 0.1235])   # a trend's band from the IQR kept
    with pytest.raises(StoreError, match="no digest schema 3"):
        documents.digest_of(doc, sha, schema=3)


WRITER = textwrap.dedent("""
    import sys, time, json
    import sqlalchemy as sa
    from perfgate.store.backends import open_store
    spec, name, path, stall = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "stall"
    if stall:  # stop after the run's row is written and before its metric rows: the moment to be killed
        real = sa.engine.Connection.execute
        def execute(self, statement, *a, **kw):
            out = real(self, statement, *a, **kw)
            if getattr(getattr(statement, "table", None), "name", "") == "perfgate_runs" and statement.is_insert:
                print("run row written", flush=True)
                time.sleep(60)
            return out
        sa.engine.Connection.execute = execute
    with open_store(spec, create=True) as store:
        print("added" if store.put(open(path, "rb").read(), name).added else "present", flush=True)
""")


def _writer(spec: str, name: str, path: Path, stall: bool = False) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", WRITER, spec, name, str(path), "stall" if stall else "go"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.parametrize("spec", ["sqlite", "postgresql"], indirect=True)
def test_a_writer_killed_mid_push_leaves_nothing(spec, tmp_path):
    path = tmp_path / "run.json"
    path.write_bytes(raw_of(results_doc(7, tests=[f"t::{k}" for k in range(50)])))
    with open_store(spec, create=True):
        pass
    writer = _writer(spec, f"{HW}/r7.json.gz", path, stall=True)
    try:
        assert writer.stdout.readline().strip() == "run row written", writer.stderr.read()
        with open_store(spec) as reader:   # not visible while the push is open
            assert reader.entries() == [] and reader.metric_rows() == []
    finally:
        os.kill(writer.pid, signal.SIGKILL)
        writer.wait()
    with open_store(spec, create=True) as store:
        assert store.entries() == [] and store.metric_rows() == []
        assert store.put(path.read_bytes(), f"{HW}/r7.json.gz").added   # and the next push is whole
        assert len(store.metric_rows()) == 50


@pytest.mark.parametrize("spec", ["sqlite", "postgresql"], indirect=True)
def test_two_writers_of_one_run_store_it_once(spec, tmp_path):
    path = tmp_path / "run.json"
    path.write_bytes(raw_of(results_doc(8, tests=[f"t::{k}" for k in range(200)])))
    with open_store(spec, create=True):
        pass
    writers = [_writer(spec, f"{HW}/r8.json.gz", path) for _ in range(2)]
    said = sorted(w.communicate(timeout=120)[0].strip() for w in writers)
    assert all(w.returncode == 0 for w in writers), [w.stderr.read() if w.stderr else "" for w in writers]
    assert said.count("added") >= 1 and set(said) <= {"added", "present"}
    assert said == ["added", "present"]
    with open_store(spec) as store:
        assert len(store.entries()) == 1 and len(store.metric_rows()) == 200


def test_a_server_that_is_down_or_refuses_the_login_is_one_line(postgres):
    url = postgres.new_database("refusing")
    wrong = url.replace(":admin-secret@", ":not-the-password-0xC0FFEE@")
    with pytest.raises(StoreUnavailable) as refused:
        open_store(wrong, create=True)
    text = str(refused.value)
    assert "password authentication failed" in text and "not-the-password-0xC0FFEE" not in text
    assert "\n" not in text and "***" in text
    down = f"postgresql://u:s3cret-pw@127.0.0.1:{postgres_server._free_port()}/x"
    with pytest.raises(StoreUnavailable) as unreachable:
        open_store(down)
    assert "s3cret-pw" not in str(unreachable.value) and "\n" not in str(unreachable.value)


def test_a_read_only_login_reads_and_cannot_write(postgres):
    url = postgres.new_database("shared")
    with open_store(url, create=True) as store:
        store.put(raw_of(results_doc(1)), f"{HW}/r1.json.gz")
    postgres.psql("CREATE ROLE reader LOGIN PASSWORD 'reader-pw'; GRANT CONNECT ON DATABASE shared TO reader")
    postgres.psql("GRANT SELECT ON ALL TABLES IN SCHEMA public TO reader", database="shared")
    reader_url = postgres.url("reader", "reader-pw", "shared")
    with open_store(reader_url) as reader:
        assert len(reader.entries()) == 1 and len(reader.metric_rows(HW)) == 1
        with pytest.raises(StoreUnavailable, match="permission denied") as refused:
            reader.put(raw_of(results_doc(2)), f"{HW}/r2.json.gz")
        assert "reader-pw" not in str(refused.value)


def test_a_reader_never_creates_a_store(tmp_path):
    with pytest.raises(StoreError, match="no such SQLite file"):
        open_store(str(tmp_path / "none.sqlite"))
    with pytest.raises(StoreError, match="no such folder"):
        open_store(str(tmp_path / "none"))
    assert not (tmp_path / "none.sqlite").exists()


def test_a_changed_row_is_refused_not_read(tmp_path):
    spec = str(tmp_path / "runs.sqlite")
    raw = raw_of(results_doc(1))
    with open_store(spec, create=True) as store:
        sha = store.put(raw, f"{HW}/r1.json.gz").entry.sha256
    import sqlite3
    with sqlite3.connect(tmp_path / "runs.sqlite") as db:
        db.execute("UPDATE perfgate_runs SET content = ?", (documents.packed(raw.replace(b"c00000000001", b"c0000000000X")),))
        db.execute("UPDATE perfgate_metrics SET median = ?", (float("inf"),))
    with open_store(spec) as store:
        with pytest.raises(StoreError, match="changed after it was stored"):
            store.raw(sha)
        with pytest.raises(StoreError, match="not a finite number"):
            store.metric_rows()
