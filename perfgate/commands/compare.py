"""`perfgate compare [BASELINE.json] CURRENT.json`: judge a saved run with the verdict logic of a live run.

Two files: CURRENT against BASELINE, metric by metric. One file: CURRENT against the committed baselines
of its hardware id (this id's, its family's for ratios, any id's for exact counts, as the plugin chooses)
at today's tolerances: "would this run pass the gate now, and how much of it does the gate judge?",
with no re-measurement, e.g. after a tolerance or a baseline changed.
"""
from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from perfgate.store import results as results_mod
from perfgate import interrupts
from perfgate.judge import outcomes
from perfgate.judge.metric_result import MetricResult, metric_results
from perfgate.report import json_output, run_report
from perfgate.judge.baseline_choice import BaselineChooser, Choice, report_notes
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.baselines import BaselineStore
from perfgate.store.settings import load_settings
from perfgate.judge.fingerprint_check import compare as compare_fingerprints
from perfgate.judge.gate import Context, evaluate
from perfgate.report.textable import stdout_width, wrap_words
from perfgate.judge.verdict import fails, Outcome


def register(sub) -> None:
    p = sub.add_parser("compare", help="judge a results file against another one, or against the committed "
                                       "baselines; exit 1 on a regression")
    p.add_argument("baseline", type=Path, nargs="?",
                   help="results JSON taken as the reference; without it, CURRENT is judged against the committed "
                        "baselines of its hardware id")
    p.add_argument("current", type=Path, help="results JSON to judge")
    p.add_argument("--baselines", type=Path,
                   help="with one results file: the baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--strict", action="store_true", help="fail on noisy verdicts too")
    p.add_argument("--gate", choices=("auto", "all", "ratios"), help="which metrics can fail")
    p.add_argument("--allow-hardware-mismatch", action="store_true",
                   help="compare results from different hardware ids anyway")
    p.add_argument("--markdown", type=Path, help="also write a Markdown summary here")
    p.add_argument("--table", choices=run_report.TABLE_CHOICES, default="attention",
                   help="rows to print: attention (default: regression, noisy, new, improved, tainted), all, off")
    json_output.add_json_option(p, "every metric's verdict and the counts")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.set_defaults(func=run)


def _shown(path: Path) -> str:
    """A results file as the user would type it here: relative to the working directory when
    it lies under it (shorter, still copyable), else as given."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def _against_results(args: argparse.Namespace, b: dict, context: Context) -> list[MetricResult]:
    """Every metric of ``b`` judged against the same test and metric of the results file ``args.baseline``."""
    a = results_mod.load(args.baseline)
    if a["hardware_id"] != b["hardware_id"] and not args.allow_hardware_mismatch:
        raise ValueError(f"{args.current} is from hardware id {b['hardware_id']!r} but {args.baseline} is from "
                         f"{a['hardware_id']!r}: numbers from different machines are not comparable; pass "
                         f"--allow-hardware-mismatch to compare anyway")
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
    return out


def _against_baselines(b: dict, baselines: Path, context: Context) -> list[MetricResult]:
    """Every metric of ``b`` judged as the plugin would judge it today: the baseline it would choose, the
    tolerance the test declared under today's tolerances files (no re-measurement, no retry)."""
    chooser = BaselineChooser(BaselineStore(baselines), b["hardware_id"], lambda: b.get("fingerprint") or {})
    out = []
    for r in metric_results(b):
        metric = r.measured()
        choice = chooser.choose(r.test_id, r.metric, dependency=metric.dependency)
        out.append(evaluate(r.test_id, metric, choice, context, workload=r.workload))
    return out


def run(args: argparse.Namespace) -> int:
    if args.baseline is not None and args.baselines is not None:
        raise ValueError(f"--baselines {args.baselines} is for judging one results file against committed baselines; "
                         f"with two files the first ({args.baseline}) is the reference: give one of them")
    if args.baseline is None and args.allow_hardware_mismatch:
        raise ValueError("--allow-hardware-mismatch compares two results files; against committed baselines the "
                         "results' own hardware id chooses them")
    b = results_mod.load(args.current)
    # tolerances.toml: this id's, else its family's
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None, b["hardware_id"])
    if args.gate:
        settings.gate = args.gate
    context = Context.of(settings, b["hardware_id"])
    if args.baseline is not None:
        out, reference = _against_results(args, b, context), _shown(args.baseline)
    else:
        out, reference = _against_baselines(b, settings.baselines, context), f"the baselines in {settings.baselines}"
    software = (b.get("fingerprint") or {}).get("software")
    failing = [r for r in out if r.gated and fails(Outcome(r.outcome), strict=args.strict)]
    notes = report_notes(out, b["hardware_id"])
    if args.json:
        failed = {id(r) for r in failing}
        json_output.emit("compare", {
            "hardware_id": b["hardware_id"], "current": str(args.current),
            "reference": {"results": str(args.baseline)} if args.baseline is not None
            else {"baselines": str(settings.baselines)},
            "strict": args.strict, "exit_status": 1 if failing else 0, "summary": outcomes.summary(out),
            "notes": notes, "metrics": [json_output.metric_record(r) | {"fails": id(r) in failed} for r in out]})
    else:
        _print_table(args, out, failing, notes, software, b["hardware_id"], reference)
    if args.markdown:
        text = run_report.markdown(out, hardware_id=b["hardware_id"], commit=b.get("commit"),
                                   current_software=software)
        with interrupts.writing(str(args.markdown)):
            args.markdown.write_text(text)
    return 1 if failing else 0


def _print_table(args: argparse.Namespace, out: list[MetricResult], failing: list[MetricResult], notes: list[str],
                 software: dict | None, hardware_id: str, reference: str) -> None:
    width = stdout_width()
    title = f"perfgate compare: {_shown(args.current)} vs {reference} ({hardware_id})"
    for line in wrap_words(title, width, "    ", fold_long=True):
        print(line)
    for line in run_report.terminal_lines(out, hardware_id=hardware_id, width=width, table=args.table,
                                          full_table_at=str(args.markdown) if args.markdown else None,
                                          all_option="--table all", current_software=software, notes=notes):
        print(line.text)
    if args.strict:
        for r in failing:
            if r.outcome != "regression":
                print("FAILS (--strict) " + run_report.regression_line(r, software))
