"""`perfgate verify-baselines [STORE]`: re-derive every committed baseline's run medians from the store.

A baseline entry pooled from runs keeps one summary per run, each naming its results file by store
name and sha256 (perfgate.store.run_store). This command finds each file, checks its hash, and
recomputes that test and metric's median and sample count from it, as `perfgate refresh` did: a
baseline edited by hand, a results file changed after the fact, or one missing from the store are
reported, and any of them exits 1. Run summaries without a hash (from `pytest --perf-refresh` or
`perfgate calibrate --write`, which refresh from no results file) are counted as not checkable,
never passed off as checked.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.judge import run_noise
from perfgate.judge.config import load_settings
from perfgate.store import results as results_mod, run_store
from perfgate.store.baselines import BaselineStore
from perfgate.store.readers import Checker

SHOWN = 50  # problems listed one per line; the rest are counted


def register(sub) -> None:
    p = sub.add_parser("verify-baselines", help="re-derive the baselines' run medians from the results store")
    p.add_argument("store", type=Path, nargs="?", help=f"the results store's folder (default: ${run_store.ENV})")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.set_defaults(func=run)


@dataclass
class Check:
    """What one pass found: counts of run references and one line per problem."""

    checked: int = 0        # run references with a hash, file found, hash and summary equal
    no_hash: int = 0        # run references without a hash: not checkable
    entries_without_runs: int = 0
    problems: list[str] = field(default_factory=list)


class _Files:
    """Each stored file read once: its hash, and its results by (test id, metric)."""

    def __init__(self, root: Path):
        self.root, self._hash, self._results = root, {}, {}

    def sha256(self, name: str) -> str | None:
        if name not in self._hash:
            path = run_store.path_of(self.root, name)
            self._hash[name] = run_store.content_sha256(path) if path.is_file() else None
        return self._hash[name]

    def results(self, name: str) -> tuple[dict, dict]:
        if name not in self._results:
            doc = results_mod.load(run_store.path_of(self.root, name))
            self._results[name] = (doc, {(r["test_id"], r["metric"]): r for r in doc.get("results") or []})
        return self._results[name]


def _problem(files: _Files, run: dict, test: str, metric: str) -> str | None:
    """Why this run summary does not follow from its stored file, or None when it does."""
    name, sha = run["file"], run["sha256"]
    try:
        found = files.sha256(name)
    except run_store.StoreError as exc:
        return str(exc)
    if found is None:
        return f"missing: {files.root / name} is not in the store (fetch the store, or `perfgate store add` the file)"
    if found != sha:
        return f"{name}: sha256 {found[:12]} in the store, {sha[:12]} in the baseline (the file was changed, replaced)"
    doc, by_key = files.results(name)
    r = by_key.get((test, metric))
    if r is None:
        return f"{name}: holds no result for this test and metric"
    absolute = r["unit"] == "fraction"
    # a run pooled before every sample counted (issue 47) was summarised from the samples the file stored
    derived = (run_noise.run_summary_of(r["summary"], absolute=absolute),
               run_noise.run_summary(r["summary"]["samples"] or [r["summary"]["median"]], absolute=absolute))
    problems = []
    for again in derived:
        differs = [f"{what} {mine} in the baseline, {theirs} from the file" for what, mine, theirs in (
            ("median", run["median"], again.median), ("n", run["n"], again.n),
            ("when", run.get("when", doc.get("created")), doc.get("created")),
            ("commit", run.get("commit", doc.get("commit")), doc.get("commit")))
            if mine != theirs and not (what == "median" and math.isclose(mine, theirs, rel_tol=1e-12))]
        if not differs:
            return None
        problems.append(differs)
    return f"{name}: {'; '.join(problems[0])}"


def verify(store_root: Path, baselines_root: Path) -> Check:
    """Every run reference with a hash in every baseline file under ``baselines_root``, against the store."""
    store, files, out = BaselineStore(baselines_root), _Files(store_root), Check()
    for hw in store.hardware_ids():
        for path in sorted((store.root / hw).glob("*.json")):
            doc = store.document(hw, path.stem)
            c = Checker(path, fix="restore the baseline from git, or re-create it with `perfgate refresh`")
            for test, metrics in doc["entries"].items():
                for metric, entry in metrics.items():
                    runs = c.list(entry.get("runs"), f"entries[{test!r}][{metric!r}].runs", optional=True)
                    out.entries_without_runs += not runs
                    for i, run in enumerate(runs):
                        key = f"entries[{test!r}][{metric!r}].runs[{i}]"
                        run = c.table(run, key)
                        if run.get("sha256") is None:
                            out.no_hash += 1
                            continue
                        c.string(run["sha256"], f"{key}.sha256")
                        c.string(run.get("file"), f"{key}.file")
                        c.number(run.get("median"), f"{key}.median")
                        c.integer(run.get("n"), f"{key}.n", minimum=1)
                        problem = _problem(files, run, test, metric)
                        if problem:
                            out.problems.append(f"{hw}/{path.name} {test} {metric}: {problem}")
                        else:
                            out.checked += 1
    return out


def run(args: argparse.Namespace) -> int:
    root = run_store.root_of(args.store)
    if not root.is_dir():
        raise run_store.StoreError(f"results store {root}: no such folder; fetch or create the store first")
    baselines = load_settings(args.root, args.baselines.resolve() if args.baselines else None).baselines
    found = verify(root, baselines)
    print(f"perfgate verify-baselines: {baselines} against the store {root}: {found.checked} run reference(s) "
          f"re-derived and equal, {len(found.problems)} not; {found.no_hash} without a hash (not checkable); "
          f"{found.entries_without_runs} entries without run summaries")
    for line in found.problems[:SHOWN]:
        print(f"  {line}")
    if len(found.problems) > SHOWN:
        print(f"  ... and {len(found.problems) - SHOWN} more")
    return 1 if found.problems else 0
