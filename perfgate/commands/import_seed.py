"""`perfgate import-seed`: the seed report's 8x V100 PCIe numbers as baselines, with provenance.

Every number comes from perfgate/seed_v100.py, where it was typed in with its section of
the report. They are written to ``baselines/8xV100-PCIE-32GB-PCIe/<area>.json`` as
``imported`` entries (median = the reported number, n = runs the report averaged), so
the first run on such a machine is judged against the report. An imported number never
replaces a measured one unless --force: a measurement of the real machine is better
evidence than a report of another one.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from perfgate import interrupts, seed_v100
from perfgate.baselines import BaselineEntry, BaselineStore
from perfgate.config import load_settings
from perfgate.metrics import Summary
from perfgate.run_report import fmt_number, short_id
from perfgate.textable import Column, render, stdout_width
from perfgate.results import area_of


def register(sub) -> None:
    p = sub.add_parser("import-seed", aliases=["import_seed"],
                       help="write the seed report's 8x V100 PCIe numbers as imported baselines")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--dry-run", action="store_true", help="show what would be written, write nothing")
    p.add_argument("--force", action="store_true", help="also replace entries that were measured")
    p.add_argument("--check-ids", action="store_true",
                   help="collect perf/ with pytest and list imported test ids that no test has")
    p.set_defaults(func=run)


def entry_for(n: seed_v100.SeedNumber) -> BaselineEntry:
    """Median = the reported number; n = runs it averages; the number itself as the only sample."""
    v = n.value
    summary = Summary(median=v, mad=0.0, iqr=0.0, min=v, max=v, mean=v, n=n.n, samples=(v,))
    return BaselineEntry(unit=n.unit, better=n.better, summary=summary, tol=None, provenance=n.provenance,
                         when=seed_v100.WHEN, commit=None,
                         software=seed_v100.SOFTWARE_BY_AREA.get(area_of(n.test_id)), source=n.source)


def entries_by_area() -> dict[str, dict[str, dict[str, BaselineEntry]]]:
    out: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    for n in seed_v100.NUMBERS:
        out.setdefault(area_of(n.test_id), {}).setdefault(n.test_id, {})[n.metric] = entry_for(n)
    return out


def collected_ids(root: Path) -> set[str]:
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "perf/"],
                          cwd=root, capture_output=True, text=True)
    return {line.strip() for line in proc.stdout.splitlines() if "::" in line}


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None)
    store = BaselineStore(settings.baselines)
    hw = seed_v100.HARDWARE_ID
    console = Console(width=180)
    plan: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    kept = 0
    rows = []
    for area, tests in sorted(entries_by_area().items()):
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
    for line in render(columns, rows, width=stdout_width(), title=f"{seed_v100.SEED} -> {store.root / hw}"):
        print(line.text)
    if args.check_ids:
        have = collected_ids(args.root)
        missing = sorted({n.test_id for n in seed_v100.NUMBERS} - have)
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
            path = store.write(hw, area, tests, fingerprint=seed_v100.FINGERPRINT)
            console.print(f"wrote {sum(len(m) for m in tests.values())} metric(s) to {path}")
    return 0
