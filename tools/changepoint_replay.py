#!/usr/bin/env python3
"""Otava's change points against the old sustained-step rule, on synthetic and on real histories.

    python tools/changepoint_replay.py synthetic --series 100 --noise 0.02
    python tools/changepoint_replay.py history runs/cpu-AMD-EPYC-avx512-2c runs/2xH200-NV18/ten-run-check ...

synthetic: per step size (0 = flat, 5, 10, 20 %) ``--series`` series of ``--runs`` run medians,
level 100 with Gaussian run-to-run noise of ``--noise`` (relative), the step injected at the
middle run. A change point within two runs of the injected one is *found*; any other is
*false*; an injected step with none near it is *missed*. Both detectors get the same series:
perfgate.report.changepoints (Otava) and perfgate.report.trends.find_steps (the sustained-step
rule of `perfgate report`, with the metric tolerance ``--tol``).
history: every (hardware id, test, metric) series of the given folders; no step was injected
there (the runs are of unchanged or unrelated commits), so each detection is listed for a look.
"""
from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.report import changepoints, trends  # noqa: E402


def synthetic_series(step: float, *, runs: int, noise: float, rng: random.Random, tol: float) -> trends.Series:
    s = trends.Series("synthetic", "t::test_x", "time_us", "us", "lower", tol)
    for i in range(runs):
        level = 100.0 * (1 + step if i >= runs // 2 else 1)
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
    print(f"{args.series} series of {args.runs} runs per step, run-to-run noise {args.noise:.0%}, tolerance {args.tol:.0%}")
    print("| step | detector | found | missed | false change points |")
    print("|---:|---|---:|---:|---:|")
    for step in (0.0, 0.05, 0.10, 0.20):
        tallies = {"otava": [0, 0, 0], "sustained-step rule": [0, 0, 0]}
        for _ in range(args.series):
            s = synthetic_series(step, runs=args.runs, noise=args.noise, rng=rng, tol=args.tol)
            injected = args.runs // 2 if step else None
            got = {"otava": [c.at for c in changepoints.find_change_points(s)],
                   "sustained-step rule": [st.at for st in trends.find_steps(s)]}
            for name, at in got.items():
                for k, v in enumerate(score(at, injected)):
                    tallies[name][k] += v
        for name, (f, m, x) in tallies.items():
            shown = f"{step:.0%}" if step else "flat"
            print(f"| {shown} | {name} | {f if step else '-'} | {m if step else '-'} | {x} |")


def history(args) -> None:
    runs = []
    for folder in args.folders:
        runs += trends.load_history(Path(folder))
    runs.sort(key=lambda r: (r.created, r.path.name))
    series = [s for s in trends.build_series(runs) if len(s.points) >= 4]
    cps = changepoints.all_change_points(series)
    steps = trends.all_steps(series)
    ids = sorted({r.hardware_id for r in runs})
    by_otava = {id(c.series) for c in cps}
    by_rule = {id(st.series) for st in steps}
    print(f"{len(runs)} runs, {len(series)} series of >= 4 runs ({', '.join(ids)}): otava {len(cps)} change point(s) "
          f"in {len(by_otava)} series, sustained-step rule {len(steps)} step(s) in {len(by_rule)} series, "
          f"both {len(by_otava & by_rule)} series")
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
        for st in steps:
            print("  step rule:", st.describe())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("synthetic")
    s.add_argument("--series", type=int, default=100)
    s.add_argument("--runs", type=int, default=30)
    s.add_argument("--noise", type=float, default=0.02)
    s.add_argument("--tol", type=float, default=0.05)
    s.add_argument("--seed", type=int, default=0)
    h = sub.add_parser("history")
    h.add_argument("folders", nargs="+")
    h.add_argument("--verbose", action="store_true", help="list every change point and step")
    args = p.parse_args()
    synthetic(args) if args.what == "synthetic" else history(args)


if __name__ == "__main__":
    main()
