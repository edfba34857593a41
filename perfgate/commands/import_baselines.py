"""``perfgate import FORMAT PATH... [--hardware-id ID]``: other tools' results as baselines.

Formats (perfgate.importers): ``pytest-benchmark`` JSON, ``nccl-tests`` stdout, ``vllm-bench``
(``vllm bench serve --save-result`` JSON) and ``seed`` (the seed report's 8x V100 numbers,
baselines-imported/seed-v100.json by default). Every entry gets provenance ``imported: <tool>
<file>`` (the seed keeps its report section), the files' samples pooled per metric. An
imported number never replaces a measured one unless ``--force``: a measurement of the real
machine is better evidence than another tool's run. Shows a table of what would be written
and every row left out with its reason; ``--dry-run`` writes nothing. An import with nothing to
write (every row left out, or every metric already measured) exits 1, as `perfgate refresh` does.
"""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import subprocess
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from perfgate.importers import FORMATS, Imported, ImportedNumber
from perfgate.store.settings import load_settings
from perfgate.judge.metrics import summarize
from perfgate.machine.hardware_id import check_hardware_id
from perfgate.report.run_report import fmt_number
from perfgate.judge.metric_result import short_id
from perfgate.report.textable import Column, printable, render, stdout_width
from perfgate.store import baseline_writer
from perfgate import interrupts
from perfgate.store.baseline_writer import Checks
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.metric_result import area_of

Plan = dict[str, dict[str, dict[str, BaselineEntry]]]  # area -> test id -> metric -> entry


def register(sub) -> None:
    p = sub.add_parser("import", help="turn other tools' result files into baselines (pytest-benchmark, "
                                      "nccl-tests, vllm bench serve, the seed report)")
    p.add_argument("format", choices=sorted(FORMATS), help="the files' tool")
    p.add_argument("paths", nargs="*", type=Path, metavar="PATH",
                   help="result files (seed: default baselines-imported/seed-v100.json)")
    p.add_argument("--hardware-id", help="the perfgate hardware id the files were measured on "
                                         "(`perfgate fingerprint` on that machine prints it)")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--dry-run", action="store_true", help="show what would be written, write nothing")
    p.add_argument("--force", action="store_true", help="also replace entries that were measured")
    p.add_argument("--check-ids", action="store_true",
                   help="collect the imported ids' test files with pytest and list ids that no test has")
    p.set_defaults(func=run)


def read(fmt: str, paths: list[Path], hardware_id: str | None) -> Imported:
    module = importlib.import_module(f"perfgate.importers.{FORMATS[fmt]}")
    paths = list(paths) or list(module.DEFAULT_PATHS)
    if not paths:
        raise ValueError(f"import {fmt}: name at least one file")
    return module.read(paths, hardware_id)


def entries(imported: Imported) -> Plan:
    """One entry per (test, metric): the files' samples pooled, n summed where a tool kept fewer samples."""
    pooled: dict[tuple[str, str], list[ImportedNumber]] = {}
    for num in imported.numbers:
        pooled.setdefault((num.test_id, num.metric), []).append(num)
    plan: Plan = {}
    for (test_id, metric), nums in pooled.items():
        first = nums[0]
        if any((x.unit, x.better) != (first.unit, first.better) for x in nums):
            raise ValueError(f"{test_id} {metric}: the files disagree on its unit or direction")
        summary = summarize([v for x in nums for v in x.samples])
        summary = dataclasses.replace(summary, n=sum(x.n or len(x.samples) for x in nums))
        files = list(dict.fromkeys(x.file for x in nums))
        provenance = first.provenance or f"imported: {imported.tool} {', '.join(files)}"
        source = first.source if len(nums) == 1 else f"{len(nums)} values: {first.source} ..."
        plan.setdefault(area_of(test_id), {}).setdefault(test_id, {})[metric] = BaselineEntry(
            unit=first.unit, better=first.better, summary=summary, tol=None, provenance=provenance,
            when=imported.when, commit=imported.commit, software=first.software, source=source)
    return plan


def collected_ids(root: Path, test_ids) -> set[str]:
    files = sorted({t.split("::", 1)[0] for t in test_ids if (root / t.split("::", 1)[0]).exists()})
    if not files:
        return set()
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *files],
                          cwd=root, capture_output=True, text=True)
    return {line.strip() for line in proc.stdout.splitlines() if "::" in line}


def write_plan(store: BaselineStore, hardware_id: str, plan: Plan, fingerprint, say, source: str) -> None:
    """Through the one baseline writer (perfgate.store.baseline_writer): every number checked finite,
    no write through a link, all areas or none."""
    checked = baseline_writer.plan_from_entries(hardware_id, plan, fingerprint=fingerprint, source=source)
    counts = {area: sum(len(m) for m in tests.values()) for area, tests in plan.items()}
    baseline_writer.write_plan(store, checked, Checks(), wrote=lambda path, prev: interrupts.say_while_writing(
        f"wrote {counts[path.stem]} metric(s) to {path}", say))


def run(args: argparse.Namespace) -> int:
    hw_option = check_hardware_id(args.hardware_id, source="--hardware-id") if args.hardware_id else None
    imported = read(args.format, args.paths, hw_option)
    hw = imported.hardware_id or hw_option
    if hw is None:
        raise ValueError(f"{imported.tool} files do not say which perfgate hardware id they were measured on: "
                         f"pass --hardware-id ID (`perfgate fingerprint` on that machine prints it)")
    settings = load_settings(args.root, args.baselines)
    store = baseline_writer.store_for_writing(settings, named=args.baselines is not None,
                                              pyproject=Path(args.root) / "pyproject.toml")
    console = Console(width=180)
    plan: Plan = {}
    kept, rows = 0, []
    for area, tests in sorted(entries(imported).items()):
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
    for line in render(columns, rows, width=stdout_width(), title=f"{imported.tool} -> {store.root / hw}"):
        print(line.text)
    if imported.left_out:
        console.print(f"{len(imported.left_out)} row(s) left out:")
        for what, why in imported.left_out:
            console.print(f"  {escape(what)}: {escape(why)}")
    if args.check_ids:
        ids = {n.test_id for n in imported.numbers}
        missing = sorted(ids - collected_ids(args.root, ids))
        console.print(f"{len(missing)} imported test id(s) are not collected here"
                      + (" (pair placements exist only where GPUs have several link classes):" if missing else "."))
        for tid in missing:
            console.print(f"  {escape(tid)}")
    if kept:
        console.print(f"{kept} metric(s) already measured on {hw} were kept (--force replaces them)")
    if not plan:  # like `perfgate refresh`: a run that wrote nothing must not look like a green one
        why = (f"every metric is already measured on {hw} (--force replaces them)" if kept else
               f"{'every row of the files was left out (above)' if imported.left_out else 'the files hold no metric'}")
        print(printable(f"perfgate import: nothing {'to write' if args.dry_run else 'written'}: {why}"),
              file=sys.stderr)
        return 1
    if args.dry_run:
        console.print("dry run: nothing written")
        return 0
    write_plan(store, hw, plan, imported.fingerprint, console.print, source=", ".join(map(str, args.paths)))
    return 0
