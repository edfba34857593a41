"""The commands on the results store, through the real CLI: `store add/copy/export`, `trends --store`,
`report --store --html` (every machine, no password on the page) and `verify-baselines --store`, on a
folder, an SQLite file and a real PostgreSQL server (tests/postgres_server.py)."""
from __future__ import annotations

import csv
import io
import json
import sys
from pathlib import Path

import pytest

from perfgate.cli import main
from perfgate.store.backends import documents, open_store

sys.path.insert(0, str(Path(__file__).parent))
from test_store_backends import HOSTILE, HW, postgres, raw_of, results_doc, spec  # noqa: E402,F401 (fixtures)


def files(tmp_path: Path, n: int, *, hw: str = HW, tests: list[str] | None = None) -> list[Path]:
    out = []
    for i in range(n):
        path = tmp_path / f"{hw}-run{i}.json"
        path.write_bytes(raw_of(results_doc(i, hw=hw, tests=tests or ["perf/collectives/test_a.py::test_a[x]"])))
        out.append(path)
    return out


def test_copy_is_lossless_by_hash_between_every_pair_of_backends(spec, tmp_path, capsys):
    runs = files(tmp_path, 3) + files(tmp_path, 2, hw="cpu-other-4c", tests=HOSTILE[:3])
    assert main(["store", "add", "--store", spec, *map(str, runs)]) == 0
    for destination in (str(tmp_path / "copy-folder"), str(tmp_path / "copy.sqlite")):
        assert main(["store", "copy", spec, destination]) == 0
        assert "5 run(s) copied, 0 already there" in capsys.readouterr().out
        with open_store(spec) as src, open_store(destination) as dst:
            assert [e.sha256 for e in src.entries()] == [e.sha256 for e in dst.entries()]
            for e in src.entries():
                assert dst.raw(e.sha256) == src.raw(e.sha256) == runs[[documents.sha256_of(p.read_bytes())
                                                                        for p in runs].index(e.sha256)].read_bytes()
        assert main(["store", "copy", spec, destination]) == 0   # again: nothing new, nothing doubled
        assert "0 run(s) copied, 5 already there" in capsys.readouterr().out


def test_a_series_exports_as_csv(spec, tmp_path, capsys):
    assert main(["store", "add", "--store", spec, *map(str, files(tmp_path, 4, tests=HOSTILE[:2]))]) == 0
    capsys.readouterr()
    assert main(["store", "export", "--store", spec, "--hardware-id", HW, "--test", HOSTILE[1], "--metric",
                 "busbw_gbps"]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert [float(r["median"]) for r in rows] == [10.0, 11.0, 12.0, 13.0] and rows[0]["commit"] == "c00000000000"


def test_trends_and_the_page_read_every_machine_of_a_store(spec, tmp_path, capsys):
    runs = files(tmp_path, 6) + files(tmp_path, 6, hw="cpu-other-4c")
    assert main(["store", "add", "--store", spec, *map(str, runs)]) == 0
    capsys.readouterr()
    assert main(["trends", "--store", spec]) == 0
    assert "12 runs, 2 series" in capsys.readouterr().out
    out = tmp_path / "page"
    assert main(["report", "--store", spec, "--html", str(out), "--root", str(tmp_path)]) == 0
    page = (out / "index.html").read_text()
    assert HW in page and "cpu-other-4c" in page
    assert "admin-secret" not in page and "admin-secret" not in capsys.readouterr().out


def test_verify_baselines_reads_the_runs_from_any_store(spec, tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.perfgate]\n")
    runs = files(tmp_path, 3)
    assert main(["refresh", *map(str, runs), "--root", str(tmp_path), "--baselines", str(tmp_path / "b"), "--yes",
                 "--force"]) == 0
    assert main(["store", "add", "--store", spec, *map(str, runs)]) == 0
    capsys.readouterr()
    assert main(["verify-baselines", "--store", spec, "--root", str(tmp_path), "--baselines", str(tmp_path / "b")]) == 0
    assert "3 run reference(s) re-derived and equal, 0 not" in capsys.readouterr().out
    digests = tmp_path / "digests"   # what a code tree keeps serves as well
    assert main(["store", "copy", spec, str(digests), "--digest"]) == 0
    assert main(["verify-baselines", str(digests), "--root", str(tmp_path), "--baselines", str(tmp_path / "b")]) == 0
    assert "3 run reference(s) re-derived and equal, 0 not" in capsys.readouterr().out


def test_a_store_that_is_down_is_one_line_and_the_results_file_stays(postgres, tmp_path, capsys):
    [run] = files(tmp_path, 1)
    before = run.read_bytes()
    url = postgres.url(password="wrong-pw-123")
    assert main(["store", "add", "--store", url, str(run)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "password authentication failed" in err and "wrong-pw-123" not in err
    assert run.read_bytes() == before


def spread_runs(tmp_path: Path, n: int, *, hw: str = HW, regress: tuple[int, ...] = ()) -> list[Path]:
    """Runs of one test whose medians scatter (a run-to-run spread to calibrate), some judged regressions."""
    out = []
    for i in range(n):
        doc = results_doc(i, hw=hw, tests=["perf/collectives/test_a.py::test_a[x]"])
        r = doc["results"][0]
        r["summary"]["samples"] = [10.0 + (i % 3) * 0.1 + k * 0.01 for k in range(5)]
        r["summary"].update(median=r["summary"]["samples"][2], n=5)
        if i in regress:
            r["verdict"] = {"outcome": "regression", "change": 0.3}
        path = tmp_path / f"{hw}-spread{i}.json"
        path.write_bytes(raw_of(doc))
        out.append(path)
    return out


def test_refresh_and_calibrate_pool_runs_from_a_store_by_hash_or_name(spec, tmp_path, capsys):
    (tmp_path / "pyproject.toml").write_text("[tool.perfgate]\n")
    runs = spread_runs(tmp_path, 3)
    assert main(["store", "add", "--store", spec, *map(str, runs)]) == 0
    with open_store(spec) as store:
        entries = store.entries(HW)
    keys = [entries[0].sha256, entries[1].sha256[:12], entries[2].name]   # a hash, a prefix, a name
    for path in runs:
        path.unlink()  # nothing is read from the files: the store has the runs
    base = tmp_path / "b"
    assert main(["refresh", "--store", spec, *keys, "--root", str(tmp_path), "--baselines", str(base), "--yes",
                 "--force"]) == 0
    entry = json.loads((base / HW / "collectives.json").read_text())["entries"]["perf/collectives/test_a.py::test_a[x]"]
    assert [(r["file"], r["sha256"]) for r in entry["busbw_gbps"]["runs"]] == [(e.name, e.sha256) for e in entries]
    capsys.readouterr()
    assert main(["verify-baselines", "--store", spec, "--root", str(tmp_path), "--baselines", str(base)]) == 0
    assert main(["calibrate", "--from", *keys, "--store", spec, "--root", str(tmp_path), "--baselines", str(base)]) == 0
    out = capsys.readouterr().out
    assert f"perfgate calibrate: {HW}, 3 saved runs" in out and "test_a[x]" in out
    # a digest has no samples to pool, and a name no store holds is one line naming both places
    digests = tmp_path / "digests"
    assert main(["store", "copy", spec, str(digests), "--digest"]) == 0
    capsys.readouterr()
    assert main(["refresh", "--store", str(digests), entries[0].name, "--root", str(tmp_path), "--yes"]) == 2
    assert "is the digest of its run" in capsys.readouterr().err
    assert main(["calibrate", "--from", "nope-1", "nope-2", "--store", spec, "--root", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "'nope-1': no such results file, and" in err and "admin-secret" not in err


def test_power_tallies_the_gates_verdicts_in_stored_runs(spec, tmp_path, capsys):
    runs = spread_runs(tmp_path, 6, regress=(4,)) + spread_runs(tmp_path, 2, hw="cpu-other-4c")
    assert main(["store", "add", "--store", spec, *map(str, runs)]) == 0
    capsys.readouterr()
    save = tmp_path / "tally.json"
    assert main(["power", "--tally", "--store", spec, "--hardware-id", HW, "--save", str(save)]) == 0
    out = capsys.readouterr().out
    assert "6 run(s) judged by the gate" in out and "1/6" in out   # one false alarm of six A = A runs
    doc = json.loads(save.read_text())
    assert doc["runs_failed"] == {"A = A": {"failed": 1, "runs": 6}} and len(doc["tallied_from"]) == 6
    with open_store(spec) as store:
        other = [e.name for e in store.entries("cpu-other-4c")]
    assert main(["power", "--store", spec, "--tally", *other]) == 0
    assert "2 run(s) judged by the gate" in capsys.readouterr().out
    assert main(["power", "--tally", "--store", spec]) == 2
    assert "--hardware-id" in capsys.readouterr().err


def test_perf_history_pushes_each_session_to_a_store(spec, tmp_path):
    """The plugin's --perf-history takes a store (its folder form is DIR/<hardware-id>/<name>.json.gz); a
    store that refuses the push is one line in the report and the --perf-save file stays."""
    from perfgate.store.atomic import json_bytes
    from perfgate.store.run_store import push

    doc = results_doc(1)
    ref = push(spec, json_bytes(doc, finite=False), HW, "2026-12-01T000001Z-c00000000001.json")
    assert ref["file"] == f"{HW}/2026-12-01T000001Z-c00000000001.json.gz"
    with open_store(spec) as store:
        assert store.document(ref["sha256"])["commit"] == doc["commit"]
        assert push(spec, json_bytes(doc, finite=False), HW, "again.json") == ref   # stored once


def test_a_session_whose_history_store_is_down_says_so_in_one_line_and_keeps_its_file(pytester):
    pytester.makepyprojecttoml('[tool.pytest.ini_options]\naddopts = "-p no:cacheprovider"\n[tool.perfgate]\n')
    pytester.makepyfile(test_one="def test_one(perf):\n    perf.record('x_gbps', [1.0, 1.1, 0.9, 1.0, 1.05], "
                                 "unit='GB/s', better='higher')\n")
    down = "postgresql://perfgate:pw-never-shown@127.0.0.1:9/nothing"   # the discard port: nothing listens
    result = pytester.runpytest("--perf-preflight=off", "--perf-hardware-id", HW, "--perf-save", "r.json",
                                "--perf-history", down)
    text = "\n".join(result.outlines + result.errlines)
    [line] = [t for t in text.splitlines() if "--perf-history" in t]
    assert "perfgate:***@127.0.0.1:9/nothing not written" in line and "Connection refused" in line, text
    assert "pw-never-shown" not in text and json.loads((pytester.path / "r.json").read_text())["results"]
