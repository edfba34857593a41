"""`perfgate trends HISTORY...`: where each metric's run medians changed level (Apache Otava).

One series per (hardware id, test, metric) of the run medians in the history folders or
results files; for each change point: the run and commit it starts at, the levels before and
after (medians of the segments on either side), the change and its p-value
(perfgate.report.changepoints). Worse changes first; what was left out (tainted runs, series
too short to split) is counted on the first line. ``--fail-on-worse`` exits 1 while a series'
latest change point is for the worse (a nightly job's alarm for a change that no single run's
gate fails, green again once the series is back).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from perfgate.machine.hardware_id import check_hardware_id
from perfgate.commands.store import add_store_option
from perfgate.report import changepoints, json_output, trends
from perfgate.store.backends import describe, open_store, spec_of
from perfgate.judge.metric_result import short_id
from perfgate.report.textable import Column, render, stdout_width
from perfgate.options import number


def add_detection_options(p) -> None:
    """The change-point options `perfgate trends` and `perfgate report` share."""
    p.add_argument("--hardware-id", help="only this hardware id (default: every id in the history)")
    p.add_argument("-k", "--match", metavar="TEXT", help="only test ids that contain TEXT (e.g. all_reduce)")
    p.add_argument("--max-pvalue", type=number("the p-value", above=0, below=1), default=changepoints.MAX_PVALUE,
                   help=f"a change point's t-test p-value must be below this (default {changepoints.MAX_PVALUE})")
    p.add_argument("--min-magnitude", type=number("the magnitude", at_least=0), default=changepoints.MIN_MAGNITUDE,
                   help=f"and its relative change above this (default {changepoints.MIN_MAGNITUDE})")
    p.add_argument("--window", type=number("the window", at_least=2, whole=True), default=changepoints.WINDOW,
                   help=f"Otava's sliding window in runs (default {changepoints.WINDOW})")
    p.add_argument("--include-tainted", action="store_true", help="let tainted runs count")
    add_store_option(p, what="read the runs from this results store when no HISTORY is given")


def register(sub) -> None:
    p = sub.add_parser("trends", help="change points of each metric over a history of runs (Apache Otava)")
    p.add_argument("history", nargs="*", type=Path,
                   help="history folders (pytest --perf-history DIR) or results files (--perf-save); none: "
                        "the results store (--store)")
    add_detection_options(p)
    add_fail_on_worse(p)
    json_output.add_json_option(p, "the change points and what was left out")
    p.set_defaults(func=run)


def add_fail_on_worse(p) -> None:
    """``--fail-on-worse``, as `perfgate trends` and `perfgate report` share it."""
    p.add_argument("--fail-on-worse", action="store_true",
                   help="exit 1 while a series' latest change point is for the worse (the nightly alarm)")


def exit_status(args: argparse.Namespace, found: list[changepoints.ChangePoint]) -> int:
    """1 under ``--fail-on-worse`` when a series sits at a worse level (changepoints.alarms), else 0."""
    return 1 if args.fail_on_worse and changepoints.alarms(found) else 0


def headline(args: argparse.Namespace, runs, series, found) -> str:
    """'11 runs, 3 series; 1 change point(s) (...); left out: ...': what was judged and what was not."""
    skipped = changepoints.left_out(series, include_tainted=args.include_tainted)
    return (f"{len(runs)} runs, {len(series)} series; {len(found)} change point(s) (Otava on log run medians, "
            f"p < {args.max_pvalue:g}, |change| > {args.min_magnitude:.0%}); {skipped.describe()}")


def history_name(args: argparse.Namespace) -> str:
    """What the history is called on a page and in messages: its paths, or the store (never a password)."""
    if args.history:
        return " ".join(map(str, args.history))
    store = getattr(args, "opened_store", None)
    return store.where if store is not None else f"results store {describe(spec_of(args.store))}"


def detect(args: argparse.Namespace) -> tuple[list[trends.Run], list[trends.Series], list[changepoints.ChangePoint]]:
    if args.hardware_id is not None:
        check_hardware_id(args.hardware_id, source="--hardware-id")
    if args.history:
        runs = trends.load_history(*args.history)
    else:  # the store stays open: a page reads the documents of the runs it shows
        args.opened_store = open_store(args.store)
        runs = trends.history_from_store(args.opened_store, hardware_id=args.hardware_id)
    if not runs:
        raise ValueError(f"{history_name(args)}: no runs; write some with `pytest --perf-history DIR` or "
                         f"`perfgate store add`")
    series = [s for s in trends.build_series(runs, hardware_id=args.hardware_id)
              if not args.match or args.match in s.test_id]
    found = changepoints.all_change_points(series, max_pvalue=args.max_pvalue, min_magnitude=args.min_magnitude,
                                           window=args.window, include_tainted=args.include_tainted)
    return runs, series, sorted(found, key=lambda c: (not c.worse, c.series.hardware_id, c.series.test_id))


def change_point_record(c: changepoints.ChangePoint) -> dict:
    """One row of the table, numbers as numbers (``change``: relative, or absolute for a fraction)."""
    s = c.series
    return {"hardware_id": s.hardware_id, "test_id": s.test_id, "metric": s.metric, "from_run": c.point.created,
            "commit": c.point.commit, "before": c.before, "after": c.after, "unit": s.unit,
            "runs_before": c.runs_before, "runs_after": c.runs_after, "change": c.change,
            "change_is_absolute": s.absolute, "p_value": c.p_value, "direction": "worse" if c.worse else "better"}


def run(args: argparse.Namespace) -> int:
    runs, series, found = detect(args)
    if args.json:
        skipped = changepoints.left_out(series, include_tainted=args.include_tainted)
        json_output.emit("trends", {
            "history": history_name(args), "runs": len(runs), "series": len(series),
            "rule": {"max_pvalue": args.max_pvalue, "min_magnitude": args.min_magnitude, "window": args.window,
                     "include_tainted": args.include_tainted},
            "left_out": {"tainted_run_medians": skipped.tainted_points, "runs_tainted_throughout": skipped.tainted_runs,
                         "short_series": skipped.short_series, "says": skipped.describe()},
            "alarm": bool(changepoints.alarms(found)), "exit_status": exit_status(args, found),
            "change_points": [change_point_record(c) for c in found]})
        return exit_status(args, found)
    print(headline(args, runs, series, found))
    rows = [[c.series.hardware_id, short_id(c.series.test_id), c.series.metric, c.point.created[:16].replace("T", " "),
             (c.point.commit or "?")[:12], f"{c.before:.4g}", f"{c.after:.4g}", c.series.unit,
             f"{c.runs_before}/{c.runs_after}", c.shown_change,
             f"{c.p_value:.2g}", "worse" if c.worse else "better"] for c in found]
    columns = (Column("hardware"), Column("test", fold=True, group=True), Column("metric", fold=True),
               Column("from run"), Column("commit"), Column("before", "right"), Column("after", "right"),
               Column("unit"), Column("runs", "right"), Column("change", "right"), Column("p", "right"), Column("direction"))
    if rows:
        for line in render(columns, rows, width=stdout_width()):
            print(line.text)
    return exit_status(args, found)
