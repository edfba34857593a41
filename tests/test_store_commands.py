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
