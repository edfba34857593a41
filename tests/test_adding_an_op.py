"""docs/adding-a-measurement.md's "Adding an op" walk-through, followed literally (issue 50 §1).

Adding a collective must be adding a row: the engine, the area, the mesh's step and the nccl-tests
importer read every per-op rule from the op's ``OpDef``. The only proof that holds is doing what the
doc says, word for word, and seeing it work the first time: this test copies the code of the
repository into a fresh git repository, takes the doc's code blocks out of the doc file itself (so
the doc and this test cannot drift apart), puts each where the doc says, and runs the doc's commands:
a real 2-rank gloo sweep of the new ``reduce`` in which only the root's output is checked (gloo
leaves partial sums in the other rank's buffer), each case ``new``; the commit; ``--perf-refresh``;
``perfgate verify-baselines`` re-deriving every written entry from its stored run. The copy's nccl-tests
importer maps a ``reduce_perf`` table to the new test's ids with no change of its own.
"""
from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "adding-a-measurement.md"
OPS_PY = Path("perfgate/workloads/collectives/ops.py")
TESTS_PY = Path("perf/collectives/test_collectives.py")
# What the copy needs to run a perf test: the package, the root conftest and its fixtures, the settings.
COPIED = ("perfgate", "fixtures", "perf/collectives", "conftest.py", "pyproject.toml")


def _section() -> str:
    text = DOC.read_text()
    start = text.index("## Adding an op: one row of `OP_DEFS`")
    return text[start:text.index("\n## ", start + 1)]


def _block(section: str, lang: str, first_line: str | None = None) -> str:
    """The one fenced ``lang`` block of the section that opens with ``first_line`` (the doc's comment
    naming where the block goes), without that line."""
    blocks = re.findall(rf"```{lang}\n(.*?)```", section, re.S)
    found = [b for b in blocks if first_line is None or b.startswith(first_line + "\n")]
    assert len(found) == 1, f"the doc's section has {len(found)} {lang} blocks opening with {first_line!r}"
    return found[0] if first_line is None else found[0].split("\n", 1)[1]


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


def _argv(line: str, extra: list[str]) -> list[str]:
    """A doc command as this interpreter runs it: ``pytest`` and ``perfgate`` are this environment's."""
    words = shlex.split(line)
    head = {"pytest": [sys.executable, "-m", "pytest"], "perfgate": [sys.executable, "-m", "perfgate"]}
    return [*head.get(words[0], words[:1]), *words[1:], *extra]


def test_adding_reduce_as_the_doc_says_works_first_time(tmp_path):
    section = _section()
    call = _block(section, "python", "# perfgate/workloads/collectives/ops.py, above OP_DEFS")
    row = _block(section, "python", "# perfgate/workloads/collectives/ops.py, the last row of OP_DEFS")
    test = _block(section, "python", "# perf/collectives/test_collectives.py, at the end")
    commands = [line for line in _block(section, "bash").splitlines() if line.strip()]

    # the user's tree: the repository's code, committed
    repo = tmp_path / "repo"
    for name in COPIED:
        src, dst = ROOT / name, repo / name
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, dst)
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "the tree before the op")

    # steps 1-3: the call above OP_DEFS, the row as its last row, the test at the end of the test file
    ops_py = repo / OPS_PY
    source = ops_py.read_text()
    table = source.index("\nOP_DEFS: dict[str, OpDef] = {\n")
    end = source.index("\n}\n", table)
    ops_py.write_text(source[:table] + "\n\n" + call + "\n" + source[table:end + 1] + row + source[end + 1:])
    tests_py = repo / TESTS_PY
    tests_py.write_text(tests_py.read_text() + "\n\n" + test)

    env = {k: v for k, v in os.environ.items() if not k.startswith(("PERFGATE_", "PYTEST_"))}
    env.update(PYTHONPATH=str(repo), XDG_DATA_HOME=str(tmp_path / "xdg-data"), GIT_AUTHOR_NAME="t",
               GIT_AUTHOR_EMAIL="t@example.com", GIT_COMMITTER_NAME="t", GIT_COMMITTER_EMAIL="t@example.com")
    # step 4, command by command. What this test adds, to read the outcome: --perf-save to each pytest and
    # --json to verify-baselines; and --perf-preflight off to each pytest: this test shares its machine with
    # other tests, so a load watch would find it busy and label the timings tainted, which a refresh rightly
    # leaves out (the doc's user measures on a quiet machine).
    runs = []
    for i, line in enumerate(commands):
        extra = (["--perf-save", str(tmp_path / f"run{i}.json"), "--perf-preflight", "off"]
                 if line.startswith("pytest") else ["--json"] if line.startswith("perfgate verify-baselines") else [])
        proc = subprocess.run(_argv(line, extra), cwd=repo, env=env, capture_output=True, text=True, timeout=200)
        assert proc.returncode == 0, f"`{line}` exited {proc.returncode}:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        runs.append(proc)

    # the first run: every size of the 2-rank sweep, each new, no rank's check failed (only the root's counted)
    first = json.loads((tmp_path / "run0.json").read_text())
    ids = {r["test_id"] for r in first["results"]}
    assert len(ids) == 7 and all(i.startswith(f"{TESTS_PY}::test_reduce[gloo-2rank-") for i in ids), ids
    assert {r["verdict"]["outcome"] for r in first["results"]} == {"new"}
    assert {r["metric"] for r in first["results"]} == {"time_us", "busbw_gbps", "time_over_p2p"}
    for r in first["results"]:  # nccl-tests' bus factor of a reduce is 1: busbw is algbw
        if r["metric"] == "busbw_gbps":
            algbw = first["attachments"][r["test_id"]]["sample"]["algbw_gbps"]
            assert r["summary"]["samples"] == pytest.approx(algbw) and r["summary"]["median"] > 0
    # the refresh wrote the committed tree's baselines, and verify-baselines re-derived every entry of them
    refreshed = json.loads((tmp_path / f"run{len(commands) - 2}.json").read_text())
    assert "-dirty" not in refreshed["commit"]
    written = list((repo / "baselines").glob("*/collectives.json"))
    assert len(written) == 1, written
    entries = json.loads(written[0].read_text())["entries"]
    assert set(entries) == ids and all(set(m) == {"time_us", "busbw_gbps", "time_over_p2p"} for m in entries.values())
    verified = json.loads(runs[-1].stdout)
    assert (verified["checked"], verified["not_equal"], verified["without_hash"]) == (21, 0, 0), verified

    # the copy's importer: a reduce_perf table becomes the new test's ids (GPU cases of the same area)
    probe = (
        "import sys; from pathlib import Path\n"
        "from fixtures.cases import params\n"
        "from perfgate.workloads.collectives import AREA\n"
        "from perfgate.importers import nccl_tests\n"
        "got = nccl_tests.read([Path(sys.argv[1])], '2xH200-NV18')\n"
        f"ids = {{'{TESTS_PY}::test_reduce[' + p.id + ']' for p in params(AREA, 'reduce')}}\n"
        "print(sorted({n.test_id for n in got.numbers}), all(n.test_id in ids for n in got.numbers), got.left_out)\n")
    log = tmp_path / "reduce_perf.txt"
    log.write_text(
        "# Collective test starting: reduce_perf\n"
        "# nThread 1 nGpus 2 minBytes 1024 maxBytes 1048576 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1 "
        "validation: 1 graph: 1 unalign: 0\n"
        "#  Rank  0 Group  0 Pid   1525 on         vm device  0 [0000:00:06] NVIDIA H200\n"
        "#  Rank  1 Group  0 Pid   1525 on         vm device  1 [0000:00:07] NVIDIA H200\n"
        "        1024           256     float     sum       0    12.10    0.08    0.08       0    11.90    0.09    0.09"
        "       0\n"
        "     1048576        262144     float     sum       0    20.50   51.15   51.15       0    20.10   52.17   52.17"
        "       0\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(log)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (f"['{TESTS_PY}::test_reduce[nccl-2gpu-1KiB]', "
                                   f"'{TESTS_PY}::test_reduce[nccl-2gpu-1MiB]'] True []"), proc.stdout
