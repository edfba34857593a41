"""`perfgate import-seed`: the seed report's 8x V100 PCIe numbers as baselines, with provenance.

Every number comes from baselines-imported/seed-v100.json (beside baselines/), where it was
typed in with its section of the report; data, not code, so a reviewer checks numbers
against the report without reading Python. They are written to ``baselines/8xV100-PCIE-32GB-PCIe/<area>.json`` as
``imported`` entries (median = the reported number, n = runs the report averaged), so
the first run on such a machine is judged against the report. An imported number never
replaces a measured one unless --force: a measurement of the real machine is better
evidence than a report of another one.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from perfgate.store import interrupts
from perfgate.store.baselines import BaselineEntry, BaselineStore
from perfgate.judge.config import load_settings
from perfgate.judge.metrics import Summary
from perfgate.report.run_report import fmt_number, short_id
from perfgate.report.textable import Column, render, stdout_width
from perfgate.store.readers import Checker, read_json
from perfgate.store.results import area_of


DEFAULT_SEED = Path(__file__).resolve().parents[2] / "baselines-imported" / "seed-v100.json"


@dataclass(frozen=True)
class SeedNumber:
    """One number of the report, for one metric of one test."""

    test_id: str
    metric: str
    value: float
    unit: str
    better: str
    section: str   # "§4.4"
    n: int         # runs the report averaged
    what: str      # the report's own words for the cell, for the reviewer
    seed: str = field(default="", compare=False)        # "seed report 000 (8x V100 PCIe)"
    seed_short: str = field(default="", compare=False)  # "seed 000"

    @property
    def provenance(self) -> str:
        return f"imported: {self.seed}, {self.section}"

    @property
    def source(self) -> str:
        return f"{self.seed_short} {self.section}: {self.what}"


@dataclass(frozen=True)
class Seed:
    """A seed report's numbers and the machine it describes (the JSON file's content)."""

    name: str
    short_name: str
    seed_file: str                  # the report's text, relative to the folder above the project
    hardware_id: str
    when: str
    fingerprint: dict[str, Any]
    software_by_area: dict[str, dict[str, Any]]
    numbers: tuple[SeedNumber, ...]
    not_imported: tuple[tuple[str, str], ...] = ()
    pending_test_files: tuple[str, ...] = ()  # test files the numbers point at that do not exist yet


def load_seed(path: Path = DEFAULT_SEED) -> Seed:
    """Read a seed file; a missing or malformed one is a one-line error naming the file and the key."""
    fix = "restore it from git or pass --seed PATH"
    try:  # the one reader: size cap, regular files only, no nesting bomb (perfgate.store.readers)
        doc = read_json(Path(path), fix=fix, error=ValueError)
    except FileNotFoundError:
        raise ValueError(f"{path}: no such seed file; {fix}") from None
    c = Checker(Path(path), fix=fix, error=ValueError)  # each value finite, each n a whole count of runs
    try:
        name, short = doc["seed"], doc["seed_short"]
        numbers = tuple(SeedNumber(**{k: n[k] for k in ("test_id", "metric", "unit", "better", "section", "what")},
                                   value=c.number(n["value"], f"numbers[{i}].value"),
                                   n=c.integer(n["n"], f"numbers[{i}].n", minimum=1), seed=name, seed_short=short)
                        for i, n in enumerate(doc["numbers"]))
        return Seed(name=name, short_name=short, seed_file=doc["seed_file"], hardware_id=doc["hardware_id"],
                    when=doc["when"], fingerprint=doc["fingerprint"], software_by_area=doc["software_by_area"],
                    numbers=numbers, not_imported=tuple(tuple(x) for x in doc.get("not_imported", ())),
                    pending_test_files=tuple(doc.get("pending_test_files", ())))
    except (KeyError, TypeError) as exc:
        raise ValueError(f"{path}: malformed seed file (missing or wrong key {exc}); "
                         "restore it from git") from None


def register(sub) -> None:
    p = sub.add_parser("import-seed", aliases=["import_seed"],
                       help="write the seed report's 8x V100 PCIe numbers as imported baselines")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--seed", type=Path, default=DEFAULT_SEED,
                   help="the seed numbers (default: baselines-imported/seed-v100.json beside baselines/)")
    p.add_argument("--dry-run", action="store_true", help="show what would be written, write nothing")
    p.add_argument("--force", action="store_true", help="also replace entries that were measured")
    p.add_argument("--check-ids", action="store_true",
                   help="collect perf/ with pytest and list imported test ids that no test has")
    p.set_defaults(func=run)


def entry_for(n: SeedNumber, seed: Seed) -> BaselineEntry:
    """Median = the reported number; n = runs it averages; the number itself as the only sample."""
    v = n.value
    summary = Summary(median=v, mad=0.0, iqr=0.0, min=v, max=v, mean=v, n=n.n, samples=(v,))
    return BaselineEntry(unit=n.unit, better=n.better, summary=summary, tol=None, provenance=n.provenance,
                         when=seed.when, commit=None,
                         software=seed.software_by_area.get(area_of(n.test_id)), source=n.source)


def entries_by_area(seed: Seed) -> dict[str, dict[str, dict[str, BaselineEntry]]]:
    out: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    for n in seed.numbers:
        out.setdefault(area_of(n.test_id), {}).setdefault(n.test_id, {})[n.metric] = entry_for(n, seed)
    return out


def collected_ids(root: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "perf/"],
                          cwd=root, capture_output=True, text=True)
    return {line.strip() for line in proc.stdout.splitlines() if "::" in line}


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None)
    store = BaselineStore(settings.baselines)
    seed = load_seed(args.seed)
    hw = seed.hardware_id
    console = Console(width=180)
    plan: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    kept = 0
    rows = []
    for area, tests in sorted(entries_by_area(seed).items()):
        existing = store.load(hw, area)
        for test, metrics in sorted(tests.items()):
            for metric, entry in sorted(metrics.items()):
                old = existing.get(test, {}).get(metric)
                if old is not None and not old.is_imported and not args.force:
                    action = "kept measured"
                    kept += 1
                else:
                    action = "write" if old is None else ("update" if old.summary.median != entry.summary.median
                                                          else "same")
                    plan.setdefault(area, {}).setdefault(test, {})[metric] = entry
                rows.append([short_id(test), metric, fmt_number(entry.summary.median), entry.unit,
                             str(entry.summary.n), entry.source or "", action])
    columns = (Column("test", fold=True, group=True), Column("metric", fold=True), Column("value", "right"),
               Column("unit"), Column("n", "right"), Column("source", fold=True), Column("action"))
    for line in render(columns, rows, width=stdout_width(), title=f"{seed.name} -> {store.root / hw}"):
        print(line.text)
    if args.check_ids:
        have = collected_ids(args.root)
        missing = sorted({n.test_id for n in seed.numbers} - have)
        console.print(f"{len(missing)} imported test id(s) are not collected here"
                      + (" (pair placements exist only where GPUs have several link classes):" if missing else "."))
        for tid in missing:
            console.print(f"  {escape(tid)}")
    if kept:
        console.print(f"{kept} metric(s) already measured on {hw} were kept (--force replaces them)")
    if args.dry_run:
        console.print("dry run: nothing written")
        return 0
    with interrupts.writing(f"the imported baselines in {store.root / hw}"):
        for area, tests in sorted(plan.items()):
            path = store.write(hw, area, tests, fingerprint=seed.fingerprint)
            interrupts.say_while_writing(f"wrote {sum(len(m) for m in tests.values())} metric(s) to {path}",
                                         console.print)
    return 0
