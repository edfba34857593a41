#!/usr/bin/env python3
"""Otava's change points on synthetic and on real histories: found, missed and false ones.

    python tools/changepoint_replay.py synthetic --series 100 --noise 0.02
    python tools/changepoint_replay.py history results-store/cpu-AMD-EPYC-avx512-2c results-store/2xH200-NV18 ...

synthetic: per step size (0 = flat, 5, 10, 20 %) ``--series`` series of ``--runs`` run medians,
level 100 with Gaussian run-to-run noise of ``--noise`` (relative), the step injected at the
middle run. A change point within two runs of the injected one is *found*; any other is
*false*; an injected step with none near it is *missed*.
history: every (hardware id, test, metric) series of the given folders, and the runs the
change points start at (a machine-wide shift moves many series at once).
The comparison with the sustained-step rule that `perfgate report` used before (trends.find_steps,
removed) in docs/lifecycle.md was made by this tool at commit 504c373, which still has both.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.report import changepoints, trends  # noqa: E402


def synthetic_series(step: float, *, runs: int, noise: float, rng: random.Random, tol: float,
                     pulse: int | None = None) -> trends.Series:
    """Level 100, then 100 x (1 + step) from the middle run on (for ``pulse`` runs only, if given)."""
    s = trends.Series("synthetic", "t::test_x", "time_us", "us", "lower", tol)
    mid = runs // 2
    for i in range(runs):
        stepped = i >= mid and (pulse is None or i < mid + pulse)
        level = 100.0 * (1 + step if stepped else 1)
        m = level * (1 + rng.gauss(0, noise))
        s.points.append(trends.Point(run=i, created=f"run{i:03d}", commit=None, median=m, q1=m, q3=m, n=7,
                                     tainted=False, outcome="pass"))
    return s


def score(found_at: list[int], injected: int | None) -> tuple[int, int, int]:
    """(found, missed, false) for one series."""
    near = [i for i in found_at if injected is not None and abs(i - injected) <= 2]
    false = len(found_at) - len(near)
    if injected is None:
        return 0, 0, false
    return (1, 0, false) if near else (0, 1, false)


def synthetic(args) -> None:
    rng = random.Random(args.seed)
    print(f"{args.series} series of {args.runs} runs per step, run-to-run noise {args.noise:.0%}, tolerance "
          f"{args.tol:.0%}; Otava p < {args.max_pvalue:g}, window {args.window}")
    print("| step | detector | found | missed | false change points |")
    print("|---:|---|---:|---:|---:|")
    for step, pulse in ((0.0, None), (0.05, None), (0.10, None), (0.20, None), (0.15, 8)):
        found = missed = false = 0
        for _ in range(args.series):
            s = synthetic_series(step, runs=args.runs, noise=args.noise, rng=rng, tol=args.tol, pulse=pulse)
            at = [c.at for c in changepoints.find_change_points(s, max_pvalue=args.max_pvalue, window=args.window)]
            injected = [args.runs // 2] + ([args.runs // 2 + pulse] if pulse else []) if step else [None]
            for k, inj in enumerate(injected):
                f, m, x = score(at if k == 0 else [a for a in at if a > args.runs // 2 + 2], inj)
                found, missed = found + f, missed + m
            false += sum(1 for a in at if not any(i is not None and abs(a - i) <= 2 for i in injected))
        shown = "flat" if not step else (f"{step:.0%}" + (f" for {pulse} runs, then back" if pulse else ""))
        print(f"| {shown} | otava | {found if step else '-'} | {missed if step else '-'} | {false} |")


def history(args) -> None:
    runs = []
    for folder in args.folders:
        runs += trends.load_history(Path(folder))  # per folder: a folder's subfolders are other histories
    runs.sort(key=lambda r: (r.created, r.path.name))
    series = [s for s in trends.build_series(runs) if len(s.points) >= 4]
    cps = changepoints.all_change_points(series)
    ids = sorted({r.hardware_id for r in runs})
    print(f"{len(runs)} runs, {len(series)} series of >= 4 runs ({', '.join(ids)}): otava {len(cps)} change point(s) "
          f"in {len({id(c.series) for c in cps})} series")
    starts: dict[str, int] = {}
    for c in cps:
        key = f"{c.point.created[:16]} {(c.point.commit or '?')[:7]}"
        starts[key] = starts.get(key, 0) + 1
    print("otava change points by the run they start at (a machine-wide shift moves many series at once):")
    for key, n in sorted(starts.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:4d}  {key}")
    if args.verbose:
        for c in cps:
            print("  otava:", c.describe())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("synthetic")
    s.add_argument("--series", type=int, default=100)
    s.add_argument("--runs", type=int, default=30)
    s.add_argument("--noise", type=float, default=0.02)
    s.add_argument("--tol", type=float, default=0.05)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--max-pvalue", type=float, default=changepoints.MAX_PVALUE)
    s.add_argument("--window", type=int, default=changepoints.WINDOW)
    h = sub.add_parser("history")
    h.add_argument("folders", nargs="+")
    h.add_argument("--verbose", action="store_true", help="list every change point and step")
    args = p.parse_args()
    synthetic(args) if args.what == "synthetic" else history(args)


if __name__ == "__main__":
    main()
