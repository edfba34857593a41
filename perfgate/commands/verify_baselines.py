"""`perfgate verify-baselines [STORE]`: re-derive every committed baseline's run medians from the store.

A baseline entry pooled from runs keeps one summary per run, each naming its results file by store
name and sha256 (perfgate.store.run_store). This command finds each run in a results store (any backend:
perfgate.store.backends; a code tree's digests of its runs serve as well as the runs), checks its hash,
and recomputes that test and metric's median and sample count from it, as `perfgate refresh` did (the
median exact, or to the digits a baseline written since 2026-12-07 keeps: perfgate.store.baselines.kept_median):
a baseline edited by hand, a results file changed after the fact, or one missing from the store are
reported, and any of them exits 1. Every front door that writes baselines from runs names them by hash
(`pytest --perf-refresh` and `calibrate --write` push their sessions' runs to the store first); a run
summary without a hash (written before they did) is counted as not checkable, never passed off as checked.
"""
from __future__ import annotations

import argparse
import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path

from perfgate.judge import run_noise
from perfgate.store.settings import load_settings
from perfgate.commands.store import add_store_option
from perfgate.report import json_output
from perfgate.store.backends import ResultsStore, StoreError, documents, open_store
from perfgate.store.baselines import BaselineStore, kept_median
from perfgate.store.readers import Checker

SHOWN = 50  # problems listed one per line; the rest are counted


def register(sub) -> None:
    p = sub.add_parser("verify-baselines", help="re-derive the baselines' run medians from the results store")
    p.add_argument("store_positional", nargs="?", metavar="STORE",
                   help="the results store (as --store): this repository's digests are results-store/")
    add_store_option(p)
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    json_output.add_json_option(p, "the counts and every problem")
    p.set_defaults(func=run)


@dataclass
class Check:
    """What one pass found: counts of run references and one line per problem."""

    checked: int = 0        # run references with a hash, file found, hash and summary equal
    no_hash: int = 0        # run references without a hash: not checkable
    entries_without_runs: int = 0
    problems: list[str] = field(default_factory=list)


class _Runs:
    """Each stored run read once from the store: its entry by hash or name, its results by (test id, metric)."""

    def __init__(self, store: ResultsStore):
        self.store, self._results = store, {}

    def find(self, name: str, sha: str):
        """The run this reference names: by its hash (under any name, in any store), else by its name."""
        documents.check_name(name)
        return self.store.entry(sha) or self.store.entry(name)

    def results(self, sha: str) -> tuple[dict, dict]:
        if sha not in self._results:
            doc = self.store.document(sha)
            self._results[sha] = (doc, {(r["test_id"], r["metric"]): r for r in doc.get("results") or []})
        return self._results[sha]


def _problem(runs: _Runs, run: dict, test: str, metric: str) -> str | None:
    """Why this run summary does not follow from its stored run (or digest), or None when it does."""
    name, sha = run["file"], run["sha256"]
    try:
        found = runs.find(name, sha)
    except StoreError as exc:
        return str(exc)
    if found is None:
        return (f"missing: {name} (sha256 {sha[:12]}) is not in the {runs.store.where} (fetch the store, or "
                f"`perfgate store add` the file)")
    if found.sha256 != sha:
        return f"{name}: sha256 {found.sha256[:12]} in the store, {sha[:12]} in the baseline (the file was changed, replaced)"
    try:
        doc, by_key = runs.results(found.sha256)
    except StoreError as exc:
        return str(exc)
    r = by_key.get((test, metric))
    if r is None:
        return f"{name}: holds no result for this test and metric"
    absolute = r["unit"] == "fraction"
    # a run pooled before every sample counted (issue 47) was summarised from the samples the file stored
    # (a digest keeps five quantiles of the stored samples and their count: the same median, the same n)
    stored = run_noise.run_summary(r["summary"]["samples"] or [r["summary"]["median"]], absolute=absolute)
    derived = (run_noise.run_summary_of(r["summary"], absolute=absolute),
               dataclasses.replace(stored, n=documents.stored_count(r["summary"])))
    problems = []
    for again in derived:
        differs = [f"{what} {mine} in the baseline, {theirs} from the file" for what, mine, theirs in (
            ("median", run["median"], again.median), ("n", run["n"], again.n),
            ("when", run.get("when", doc.get("created")), doc.get("created")),
            ("commit", run.get("commit", doc.get("commit")), doc.get("commit")))
            if mine != theirs and not (what == "median" and (math.isclose(mine, theirs, rel_tol=1e-12)
                                                             or mine == kept_median(theirs)))]
        if not differs:
            return None
        problems.append(differs)
    return f"{name}: {'; '.join(problems[0])}"


def verify(results: ResultsStore, baselines_root: Path) -> Check:
    """Every run reference with a hash in every baseline file under ``baselines_root``, against the store."""
    store, files, out = BaselineStore(baselines_root), _Runs(results), Check()
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
    baselines = load_settings(args.root, args.baselines.resolve() if args.baselines else None).baselines
    with open_store(args.store_positional or args.store) as results:
        found = verify(results, baselines)
        where = results.where
    if args.json:
        json_output.emit("verify-baselines", {
            "baselines": str(baselines), "store": where, "checked": found.checked, "not_equal": len(found.problems),
            "without_hash": found.no_hash, "entries_without_runs": found.entries_without_runs,
            "problems": found.problems, "exit_status": 1 if found.problems else 0})
        return 1 if found.problems else 0
    print(f"perfgate verify-baselines: {baselines} against the {where}: {found.checked} run reference(s) "
          f"re-derived and equal, {len(found.problems)} not; {found.no_hash} without a hash (not checkable); "
          f"{found.entries_without_runs} entries without run summaries")
    for line in found.problems[:SHOWN]:
        print(f"  {line}")
    if len(found.problems) > SHOWN:
        print(f"  ... and {len(found.problems) - SHOWN} more")
    return 1 if found.problems else 0
