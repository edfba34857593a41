"""`perfgate compare A.json B.json`: B against A with the verdict logic of a live run."""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from perfgate.store import results as results_mod
from perfgate import interrupts
from perfgate.judge.metric_result import metric_results
from perfgate.report import run_report
from perfgate.judge.baseline_choice import Choice, report_notes
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.settings import load_settings
from perfgate.judge.fingerprint_check import compare as compare_fingerprints
from perfgate.judge.gate import Context, evaluate
from perfgate.report.textable import stdout_width, wrap_words
from perfgate.judge.verdict import fails, Outcome


def register(sub) -> None:
    p = sub.add_parser("compare", help="compare two results files; exit 1 on a regression")
    p.add_argument("baseline", type=Path, help="results JSON taken as the reference")
    p.add_argument("current", type=Path, help="results JSON to judge")
    p.add_argument("--strict", action="store_true", help="fail on noisy verdicts too")
    p.add_argument("--gate", choices=("auto", "all", "ratios"), help="which metrics can fail")
    p.add_argument("--allow-hardware-mismatch", action="store_true",
                   help="compare results from different hardware ids anyway")
    p.add_argument("--markdown", type=Path, help="also write a Markdown summary here")
    p.add_argument("--table", choices=run_report.TABLE_CHOICES, default="attention",
                   help="rows to print: attention (default: regression, noisy, new, improved, tainted), all, off")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.set_defaults(func=run)


def _shown(path: Path) -> str:
    """A results file as the user would type it here: relative to the working directory when
    it lies under it (shorter, still copyable), else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def run(args: argparse.Namespace) -> int:
    a, b = results_mod.load(args.baseline), results_mod.load(args.current)
    if a["hardware_id"] != b["hardware_id"] and not args.allow_hardware_mismatch:
        raise ValueError(f"{args.current} is from hardware id {b['hardware_id']!r} but {args.baseline} is from "
                         f"{a['hardware_id']!r}: numbers from different machines are not comparable; pass "
                         f"--allow-hardware-mismatch to compare anyway")
    settings = load_settings(args.root, hardware_id=b["hardware_id"])  # tolerances.toml: this id's, else its family's
    if args.gate:
        settings.gate = args.gate
    context = Context.of(settings, b["hardware_id"])
    ref = {(r.test_id, r.metric): r for r in metric_results(a)}
    diff = compare_fingerprints(a.get("fingerprint"), b.get("fingerprint") or {})
    out = []
    for r in metric_results(b):
        base = ref.get((r.test_id, r.metric))
        choice = Choice.none()
        if base is not None:
            entry = BaselineEntry(unit=base.unit, better=base.better, summary=base.summary, tol=base.tol,
                                  provenance=f"results file {args.baseline}", when=a.get("created"),
                                  commit=a.get("commit"), software=(a.get("fingerprint") or {}).get("software"),
                                  workload=base.workload, depends=base.depends, device_busy=base.device_busy)
            choice = Choice(entry, a["hardware_id"], False, diff)
        metric = replace(r.measured(), tol=r.tol)  # the tolerance the current run was judged at
        out.append(evaluate(r.test_id, metric, choice, context, workload=r.workload))
    software = (b.get("fingerprint") or {}).get("software")
    width = stdout_width()
    title = f"perfgate compare: {_shown(args.current)} vs {_shown(args.baseline)} ({b['hardware_id']})"
    for line in wrap_words(title, width, "    ", fold_long=True):
        print(line)
    for line in run_report.terminal_lines(out, hardware_id=b["hardware_id"], width=width, table=args.table,
                                          full_table_at=str(args.markdown) if args.markdown else None,
                                          all_option="--table all", current_software=software,
                                          notes=report_notes(out, b["hardware_id"])):
        print(line.text)
    failing = [r for r in out if r.gated and fails(Outcome(r.outcome), strict=args.strict)]
    if args.strict:
        for r in failing:
            if r.outcome != "regression":
                print("FAILS (--strict) " + run_report.regression_line(r, software))
    if args.markdown:
        text = run_report.markdown(out, hardware_id=b["hardware_id"], commit=b.get("commit"),
                                   current_software=software)
        with interrupts.writing(str(args.markdown)):
            args.markdown.write_text(text)
    return 1 if failing else 0
