"""The results store (perfgate.store.run_store, perfgate.store.backends): `perfgate store add`, the run
references that `perfgate refresh` records, and `perfgate verify-baselines`, which re-derives every
baseline's run medians from the stored runs (in a folder here; tests/test_store_commands.py has the same
on SQLite and PostgreSQL); last, the same check on this repository's own baselines and the digests in
results-store/.

Real files and the real CLI entry point throughout; the results documents are small ones built here.
"""
from __future__ import annotations

import gzip
import hashlib
import json
import os
import re
from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.judge.metrics import summarize
from perfgate.store import run_store
from perfgate.store.backends import open_store

HW = "cpu-Test-2c"
TEST = "perf/a/test_t.py::t"
ROOT = Path(__file__).resolve().parents[1]


def results_file(path: Path, created: str, samples: list[float], *, commit: str = "c1") -> Path:
    doc = {"kind": "perfgate-results", "schema_version": 1, "hardware_id": HW, "created": created,
           "commit": commit, "fingerprint": {"software": {"torch": "x"}},
           "results": [{"test_id": TEST, "area": "a", "metric": "bw", "unit": "GB/s", "better": "higher",
                        "tol": 0.05, "gated": True, "summary": summarize(samples).to_dict(), "verdict": {},
                        "tainted": []}]}
    path.write_text(json.dumps(doc))
    return path


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def project(tmp_path):
    """Two runs of one machine, a baselines folder and an empty store, all under tmp_path."""
    (tmp_path / "pyproject.toml").write_text("[tool.perfgate]\n")
    a = results_file(tmp_path / "a.json", "2026-01-01T00:00:00+00:00", [10.0, 10.2, 9.8])
    b = results_file(tmp_path / "b.json", "2026-01-02T00:00:00+00:00", [10.1, 10.0, 10.3], commit="c2")
    return tmp_path, a, b, tmp_path / "store"


def test_store_add_keeps_the_file_gzipped_under_its_hardware_id_and_own_name(project, capsys):
    root, a, _, store = project
    assert main(["store", "add", str(a), "--store", str(store)]) == 0
    stored = store / HW / "a.json.gz"
    assert gzip.decompress(stored.read_bytes()) == a.read_bytes()  # the same bytes, so the same hash
    assert f"sha256 {sha(a)}" in capsys.readouterr().out
    assert [e.name for e in open_store(store).entries()] == [f"{HW}/a.json.gz"]


def test_store_add_stores_content_once_under_any_name(project, capsys):
    """Pushing a run twice (a retried nightly job, two writers) stores it once and is no error."""
    root, a, _, store = project
    assert main(["store", "add", str(a), "--store", str(store)]) == 0
    again = root / "copy.json"
    again.write_bytes(a.read_bytes())
    assert main(["store", "add", str(again), "--store", str(store)]) == 0
    assert f"already stored as {HW}/a.json.gz" in capsys.readouterr().out
    assert [e.name for e in open_store(store).entries()] == [f"{HW}/a.json.gz"]


def test_store_add_never_replaces_a_stored_file(project, capsys):
    root, a, _, store = project
    assert main(["store", "add", str(a), "--store", str(store)]) == 0
    before = (store / HW / "a.json.gz").read_bytes()
    (root / "other").mkdir()
    other = results_file(root / "other" / "a.json", "2026-01-03T00:00:00+00:00", [5.0, 5.1])
    assert main(["store", "add", str(other), "--store", str(store)]) == 1
    assert f"{HW}/a.json.gz already holds another run" in capsys.readouterr().err
    assert (store / HW / "a.json.gz").read_bytes() == before


def test_the_store_is_named_by_flag_or_environment_else_the_embedded_default(project, capsys, monkeypatch):
    """Nothing named: an SQLite file in the user's data folder, outside any code tree, no server."""
    root, a, _, store = project
    monkeypatch.delenv(run_store.ENV, raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(root / "data"))
    assert main(["store", "add", str(a)]) == 0
    assert (root / "data" / "perfgate" / "results.sqlite").is_file()
    assert f"results store sqlite:///{root / 'data' / 'perfgate' / 'results.sqlite'}" in capsys.readouterr().out
    monkeypatch.setenv(run_store.ENV, str(store))
    assert main(["store", "add", str(a)]) == 0 and (store / HW / "a.json.gz").is_file()


@pytest.mark.parametrize("pooled", [True, False])
def test_refresh_records_each_run_by_store_name_and_hash_never_by_path(project, pooled):
    root, a, b, _ = project
    files = [a, b] if pooled else [a]
    assert main(["refresh", *map(str, files), "--root", str(root), "--baselines", str(root / "baselines"), "--yes"]) == 0
    text = (root / "baselines" / HW / "a.json").read_text()
    runs = json.loads(text)["entries"][TEST]["bw"]["runs"]
    assert [(r["file"], r["sha256"]) for r in runs] == [(f"{HW}/{f.name}.gz", sha(f)) for f in files]
    assert str(root) not in text


def test_a_sessions_refresh_keeps_its_run_where_verify_baselines_finds_it(pytester, capsys):
    """`pytest --perf-refresh` wrote run summaries without a hash, which verify-baselines counted as not
    checkable (issue 50): the session's run now goes to the results store (--perf-history's, else
    $PERFGATE_RESULTS_STORE, else the embedded default) and the baseline names it by name and hash."""
    pytester.makepyfile(test_bw="""
        def test_bw(perf):
            perf.record("bw", [10.0, 10.2, 9.8, 10.1, 9.9], unit="GB/s", better="higher")
    """)
    pytester.makefile(".toml", pyproject="[tool.perfgate]\n")
    store = pytester.path / "store"
    res = pytester.runpytest(f"--perf-hardware-id={HW}", "--perf-refresh", "-p", "no:cacheprovider")
    res.assert_outcomes(passed=1)
    res.stdout.fnmatch_lines([f"*their run is {HW}/*.json.gz in *"])
    code, out = main(["verify-baselines", "--root", str(pytester.path)]), capsys.readouterr().out
    assert code == 0 and "1 run reference(s) re-derived and equal, 0 not; 0 without a hash" in out, out
    # named with --perf-history, the run is kept there (once, though both outputs push it)
    pytester.runpytest(f"--perf-hardware-id={HW}", "--perf-refresh", f"--perf-history={store}",
                       "-p", "no:cacheprovider").assert_outcomes(passed=1)
    assert len(list((store / HW).glob("*.json.gz"))) == 1
    code, out = main(["verify-baselines", str(store), "--root", str(pytester.path)]), capsys.readouterr().out
    assert code == 0 and "1 run reference(s) re-derived and equal, 0 not" in out, out


def _verified(root: Path, store: Path, capsys) -> tuple[int, str]:
    code = main(["verify-baselines", str(store), "--root", str(root)])
    return code, capsys.readouterr().out


@pytest.fixture
def verified(project, capsys):
    """A baseline pooled from two runs, both runs in the store, and verify-baselines content with it."""
    root, a, b, store = project
    assert main(["refresh", str(a), str(b), "--root", str(root), "--baselines", str(root / "baselines"), "--yes"]) == 0
    assert main(["store", "add", str(a), str(b), "--store", str(store)]) == 0
    capsys.readouterr()
    code, out = _verified(root, store, capsys)
    assert code == 0 and "2 run reference(s) re-derived and equal, 0 not" in out, out
    return root, store, root / "baselines" / HW / "a.json"


def test_verify_finds_a_stored_file_whose_content_changed(verified, capsys):
    root, store, _ = verified
    stored = store / HW / "b.json.gz"
    doc = json.loads(gzip.decompress(stored.read_bytes()))
    doc["results"][0]["summary"]["samples"][0] = 99.0
    stored.write_bytes(gzip.compress(json.dumps(doc).encode()))
    code, out = _verified(root, store, capsys)
    assert code == 1 and f"{HW}/b.json.gz: sha256" in out and "1 not" in out, out


def test_verify_finds_a_missing_file(verified, capsys):
    root, store, _ = verified
    (store / HW / "a.json.gz").unlink()
    code, out = _verified(root, store, capsys)
    assert code == 1 and f"missing: {HW}/a.json.gz (sha256 {sha(root / 'a.json')[:12]}) is not in the results store" \
        in out, out


def test_verify_finds_a_run_median_edited_in_the_baseline(verified, capsys):
    root, store, baseline = verified
    doc = json.loads(baseline.read_text())
    doc["entries"][TEST]["bw"]["runs"][1]["median"] = 10.5
    baseline.write_text(json.dumps(doc))
    code, out = _verified(root, store, capsys)
    assert code == 1 and re.search(r"b\.json\.gz: median 10\.5 in the baseline, 10\.1 from the file", out), out


def test_verify_takes_a_run_median_as_the_writer_keeps_it_or_exact_and_no_other(project, capsys):
    """A baseline written since issue 51 keeps a run's median to PRECISION digits (stored_entry), one written
    before keeps it exactly: verify-baselines re-derives the median and takes either, and a baseline whose
    kept median differs in its last digit is still caught."""
    root, *_, store = project
    c = results_file(root / "c.json", "2026-01-03T00:00:00+00:00", [10.123456789, 10.2, 9.8], commit="c3")
    assert main(["refresh", str(c), "--root", str(root), "--baselines", str(root / "baselines"), "--yes"]) == 0
    assert main(["store", "add", str(c), "--digest", "--store", str(store)]) == 0
    baseline = root / "baselines" / HW / "a.json"
    doc = json.loads(baseline.read_text())
    run = doc["entries"][TEST]["bw"]["runs"][0]
    assert run["median"] == 10.12346 and doc["entries"][TEST]["bw"]["summary"]["median"] == 10.12346
    capsys.readouterr()
    for median, code in ((10.12346, 0), (10.123456789, 0), (10.12347, 1), (10.123457, 1)):
        run["median"] = median
        baseline.write_text(json.dumps(doc))
        got, out = _verified(root, store, capsys)
        assert got == code, (median, out)
    assert "median 10.123457 in the baseline, 10.123456789 from the file" in out, out


@pytest.mark.parametrize("name", ["/tmp/pool3/a/b.json", f"{HW}/../../a.json", "a.json"])
def test_verify_names_a_run_reference_that_is_not_a_store_name(verified, capsys, name):
    """A machine path, or a name that climbs out of the store, is reported, never opened."""
    root, store, baseline = verified
    doc = json.loads(baseline.read_text())
    doc["entries"][TEST]["bw"]["runs"][0]["file"] = name
    baseline.write_text(json.dumps(doc))
    code, out = _verified(root, store, capsys)
    assert code == 1 and f"{name!r} is not a results store name: it must be <hardware-id>/<file name>" in out, out


def test_verify_counts_run_summaries_without_a_hash_as_not_checkable(verified, capsys):
    root, store, baseline = verified
    doc = json.loads(baseline.read_text())
    doc["entries"][TEST]["bw"]["runs"][0]["sha256"] = None
    baseline.write_text(json.dumps(doc))
    code, out = _verified(root, store, capsys)
    assert code == 0 and "1 run reference(s) re-derived" in out and "1 without a hash (not checkable)" in out, out


def test_the_committed_baselines_follow_from_the_committed_results_store(capsys):
    """This repository's own baselines against its store (results-store/, or $PERFGATE_RESULTS_STORE where
    the store is checked out elsewhere): every run reference is found, hashed and re-derived. Not skipped
    when the store is absent: a baseline whose runs cannot be shown is what this test exists to catch."""
    store = Path(os.environ.get(run_store.ENV) or ROOT / "results-store")
    assert store.is_dir(), f"no results store at {store}: check it out, or set {run_store.ENV}"
    texts = {p: p.read_text() for p in (ROOT / "baselines").glob("*/*.json")}
    machine_paths = [p for p, t in texts.items() if re.search(r'"(/tmp|/work|/home|/root)', t)]
    assert not machine_paths, f"baselines naming machine paths: {machine_paths}"
    with_hash = sum(1 for t in texts.values() for m in json.loads(t)["entries"].values() for e in m.values()
                    for r in e.get("runs") or [] if r.get("sha256"))
    assert with_hash > 0
    code, out = _verified(ROOT, store, capsys)
    assert code == 0 and f" {with_hash} run reference(s) re-derived and equal, 0 not" in out, out


def test_the_committed_power_tallies_follow_from_their_counts_files():
    """Each committed `perfgate power --tally` table (results-store/*/power-tally-*.json) is what adding up
    the counts files it names gives today: a detection rate quoted in the docs can be re-derived, and a
    counts file edited or lost after its tally was written is caught."""
    from perfgate.commands import power

    tallies = sorted((ROOT / "results-store").glob("*/power-tally-*.json"))
    assert tallies, "no committed power tally: the GPU power tables (docs/serving.md, docs/training.md) cite them"
    for path in tallies:
        doc = json.loads(path.read_text())
        files = [ROOT / n if (ROOT / n).is_file() else path.parent / n for n in doc["tallied_from"]]
        assert all(f.is_file() for f in files), f"{path.name}: counts files missing: {files}"
        _, counts = power.merge_counts([power.load_counts(f) for f in files], [str(f) for f in files])
        again = {(m["test_id"], m["metric"]): m for m in power._metrics_section(counts)}
        kept = {(m["test_id"], m["metric"]): m for m in doc["metrics"]}
        assert again.keys() == kept.keys(), path.name
        for key, m in kept.items():
            for cond in doc["conditions"]:
                if cond not in m:
                    continue
                for field in ("regressions", "runs", "outcomes", "changes", "intervals"):
                    assert again[key][cond][field] == m[cond][field], (path.name, key, cond, field)
