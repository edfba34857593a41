#!/usr/bin/env python3
"""Otava's change points on synthetic and on real histories: found, missed and false ones.

    python tools/changepoint_replay.py synthetic --series 200
    git archive bcd9d34 results-store | tar -x -C /tmp/h    # the raw runs, before results-store kept digests
    python tools/changepoint_replay.py history /tmp/h/results-store/*/

synthetic: ``--series`` series per row; each cell counts, per detector and p-value, the false
change points (flat rows: any change point; step rows: any not within two runs of the step) or
the steps found (a change point within two runs of it). Noise models of the run medians:
``gauss`` (level x (1 + N(0, s))), ``lognormal`` (level x exp(N(0, s))) and ``outliers``
(lognormal, and one run in ten 1.5-3x slower: a busy neighbour, a descheduled rank).
Detectors: ``log``, perfgate.report.changepoints as it is (Otava on the logarithms, levels and
magnitude from the segments' medians), and ``raw``, Otava on the run medians themselves with its
own magnitude rule: what perfgate did until issue 47, kept here as the comparison.
history: every (hardware id, test, metric) series of the given folders with at least
changepoints.MIN_RUNS clean runs, the change points per detector and p-value, and the runs the
current detector's start at (a machine-wide shift moves many series at once). No step was planted
there: the runs span commits, sittings and real changes, so these counts bound the false ones.
The comparison with the sustained-step rule that `perfgate report` used before (trends.find_steps,
removed) in docs/lifecycle.md was made by this tool at commit 504c373, which still has both.
"""
from __future__ import annotations

import argparse
import math
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.report import changepoints, trends  # noqa: E402
from perfgate.store.results import ResultsError  # noqa: E402

PVALUES = (1e-3, 1e-4, 1e-5)
DETECTORS = ("raw", "log")


def series_of(values: list[float], better: str = "lower") -> trends.Series:
    s = trends.Series("synthetic", "t::test_x", "time_us", "us", better, 0.05)
    s.points = [trends.Point(run=i, created=f"run{i:03d}", commit=None, median=m, q1=m, q3=m, n=7, tainted=False,
                             outcome="pass") for i, m in enumerate(values)]
    return s


def noisy(level: float, model: str, noise: float, rng: random.Random) -> float:
    if model == "gauss":
        return level * (1 + rng.gauss(0, noise))
    x = level * math.exp(rng.gauss(0, noise))
    if model == "outliers" and rng.random() < 0.1:
        x *= rng.uniform(1.5, 3.0)
    return x


def levels(runs: int, step_at: int | None, factor: float, pulse: int | None = None) -> list[float]:
    """100 until ``step_at``, then 100 x ``factor`` (for ``pulse`` runs only, if given)."""
    return [100.0 * (factor if step_at is not None and i >= step_at and (pulse is None or i < step_at + pulse)
                     else 1.0) for i in range(runs)]


def raw_change_points(values: list[float], p: float, window: int) -> list[int]:
    """Otava on the run medians themselves, its own magnitude rule (perfgate until issue 47)."""
    from otava.analysis import compute_change_points

    found, _ = compute_change_points(values, window_len=window, max_pvalue=p, min_magnitude=changepoints.MIN_MAGNITUDE)
    return [int(c.index) for c in found]


def change_points(detector: str, values: list[float], p: float, window: int) -> list[int]:
    if detector == "raw":
        return raw_change_points(values, p, window)
    return [c.at for c in changepoints.find_change_points(series_of(values), max_pvalue=p, window=window)]


# (row label, runs, step at, factor, pulse, noise model, noise)
ROWS = [
    ("flat, gauss 2 %", 30, None, 1.0, None, "gauss", 0.02),
    ("flat, gauss 5 %", 30, None, 1.0, None, "gauss", 0.05),
    ("flat, lognormal 10 %", 30, None, 1.0, None, "lognormal", 0.10),
    ("flat, lognormal 30 %", 30, None, 1.0, None, "lognormal", 0.30),
    ("flat, outliers 5 %", 30, None, 1.0, None, "outliers", 0.05),
    ("flat, outliers 20 %", 30, None, 1.0, None, "outliers", 0.20),
    ("5 % step at run 15 of 30, gauss 2 %", 30, 15, 1.05, None, "gauss", 0.02),
    ("10 % step at run 15 of 30, gauss 2 %", 30, 15, 1.10, None, "gauss", 0.02),
    ("15 % for 8 runs then back, gauss 2 % (2 edges)", 30, 15, 1.15, 8, "gauss", 0.02),
    ("4x after 5 runs, 5 after, lognormal 5 %", 10, 5, 4.0, None, "lognormal", 0.05),
    ("4x after 5 runs, 5 after, lognormal 30 %", 10, 5, 4.0, None, "lognormal", 0.30),
    ("4x after 5 runs, 5 after, outliers 20 %", 10, 5, 4.0, None, "outliers", 0.20),
    ("4x after 6 runs, 5 after, outliers 20 %", 11, 6, 4.0, None, "outliers", 0.20),
]


def synthetic(args) -> None:
    rng = random.Random(args.seed)
    cols = [(d, p) for p in PVALUES for d in DETECTORS]
    print(f"{args.series} series per row; window {args.window}; |change| > {changepoints.MIN_MAGNITUDE:.0%}")
    print("| series | counted | " + " | ".join(f"{d} {p:g}" for d, p in cols) + " |")
    print("|---|---|" + "---:|" * len(cols))
    for label, runs, step_at, factor, pulse, model, noise in ROWS:
        edges = [] if step_at is None else [step_at] + ([step_at + pulse] if pulse else [])
        found = [0] * len(cols)
        false = [0] * len(cols)
        for _ in range(args.series):
            values = [noisy(lv, model, noise, rng) for lv in levels(runs, step_at, factor, pulse)]
            for k, (d, p) in enumerate(cols):
                at = change_points(d, values, p, args.window)
                found[k] += sum(any(abs(a - e) <= 2 for a in at) for e in edges)
                false[k] += sum(not any(abs(a - e) <= 2 for e in edges) for a in at)
        if edges:
            cells = [f"{f}/{args.series * len(edges)}, {x} false" for f, x in zip(found, false)]
            print(f"| {label} | found | " + " | ".join(cells) + " |")
        else:
            print(f"| {label} | false | " + " | ".join(map(str, false)) + " |")


def history(args) -> None:
    cols = [(d, p) for p in PVALUES for d in DETECTORS]
    print("| history | runs | series | " + " | ".join(f"{d} {p:g}" for d, p in cols) + " |")
    print("|---|---:|---:|" + "---:|" * len(cols))
    starts: dict[str, int] = {}
    for folder in args.folders:
        runs = []
        for path in sorted([*Path(folder).glob("*.json"), *Path(folder).glob("*.json.gz")]):
            try:
                runs += trends.load_history(path)
            except ResultsError:  # a counts file of `perfgate power`, a log: not a run
                continue
        runs.sort(key=lambda r: (r.created, r.path.name))
        series = [s for s in trends.build_series(runs)
                  if len([p for p in s.points if not p.tainted]) >= changepoints.MIN_RUNS]
        counts = [0] * len(cols)
        for s in series:
            values = [p.median for p in s.points if not p.tainted]
            for k, (d, p) in enumerate(cols):
                counts[k] += len(raw_change_points(values, p, args.window) if d == "raw" else
                                 changepoints.find_change_points(s, max_pvalue=p, window=args.window))
            for c in changepoints.find_change_points(s, window=args.window):
                key = f"{s.hardware_id} {c.point.created[:16]} {(c.point.commit or '?')[:7]}"
                starts[key] = starts.get(key, 0) + 1
        print(f"| {Path(folder).name} | {len(runs)} | {len(series)} | " + " | ".join(map(str, counts)) + " |")
    print("change points with the defaults, by the run they start at (a machine-wide shift moves many series):")
    for key, n in sorted(starts.items(), key=lambda kv: -kv[1])[:8]:
        print(f"  {n:4d}  {key}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    s = sub.add_parser("synthetic")
    s.add_argument("--series", type=int, default=200)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--window", type=int, default=changepoints.WINDOW)
    h = sub.add_parser("history")
    h.add_argument("folders", nargs="+")
    h.add_argument("--window", type=int, default=changepoints.WINDOW)
    args = p.parse_args()
    synthetic(args) if args.what == "synthetic" else history(args)


if __name__ == "__main__":
    main()
