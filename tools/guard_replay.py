#!/usr/bin/env python3
"""Replay the gross-change guard over saved runs of one machine: would it have fired on unchanged code?

    python tools/guard_replay.py results-store/cpu-AMD-EPYC-isaunknown-2c --hardware-id cpu-AMD-EPYC-isaunknown-2c \
        --pooled 'ci-*.json*' --against-committed 'ten-run-check-*.json*' 'collectives-training-offload-*.json*'

Runs matching --pooled are judged leave-one-out (each against a baseline pooled from the others:
out of sample, as a future run meets a committed baseline; perfgate.judge.held_out, as `perfgate
calibrate --from` judges them); runs matching --against-committed
are judged against the committed baseline of --hardware-id. Both go through perfgate.judge.gate.evaluate
with the settings (tolerances.toml, [gross_change]) that apply to that id, so what this prints is
what a run would have been told. Lists every trip, the figures closest to their limit, and the
largest worsening of a not-gated figure per test function: the evidence for a [gross_change]
setting (docs/hardware-ids.md).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

try:
    import perfgate  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.judge import guard  # noqa: E402
from perfgate.judge.baseline_choice import Choice  # noqa: E402
from perfgate.store.settings import load_settings  # noqa: E402
from perfgate.judge.gate import Context, evaluate  # noqa: E402
from perfgate.judge.held_out import leave_one_out  # noqa: E402
from perfgate.store import results as results_mod  # noqa: E402
from perfgate.judge.metric_result import metric_results
from perfgate.store.baselines import BaselineStore  # noqa: E402
from perfgate.judge.baseline_entry import BaselineEntry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="folder of results files (pytest --perf-save; .json or .json.gz)")
    ap.add_argument("--hardware-id", required=True, help="whose baselines and tolerances apply")
    ap.add_argument("--pooled", nargs="*", default=[], help="globs (under RUNS) judged leave-one-out")
    ap.add_argument("--against-committed", nargs="*", default=[], help="globs judged against the committed baseline")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    settings = load_settings(args.root, hardware_id=args.hardware_id)
    context = Context.of(settings, args.hardware_id)
    judged: list[tuple[float, float, float, str, str, str, bool]] = []  # moved/limit, moved, limit, run, test, metric, tripped

    def consider(test_id: str, metric: str, entry: BaselineEntry, median: float, gated: bool, explanation: str,
                 label: str) -> None:
        """A not-gated figure (or one the guard gated by tripping): how far it moved against its limit."""
        tripped = explanation.startswith("gross change")
        if (gated and not tripped) or entry.unit == "fraction":
            return
        moved = guard.worsening_factor(entry.summary.median, median, entry.better)
        limit = guard.limit_for(settings.gross_change, test_id, metric, entry)[0]
        judged.append((moved / limit, moved, limit, label, test_id, metric, tripped))

    pooled = sorted({p for g in args.pooled for p in args.runs.glob(g)})
    if len(pooled) >= 2:  # each against the others pooled, as the gate judges (perfgate.judge.held_out)
        for (test_id, metric), held in leave_one_out([results_mod.load(p) for p in pooled],
                                                     [p.name for p in pooled], settings, args.hardware_id).items():
            for h in held:
                consider(test_id, metric, h.baseline, h.median, h.gated, h.explanation, f"{h.run} (vs the others)")
    store = BaselineStore(settings.baselines)
    for path in sorted({p for g in args.against_committed for p in args.runs.glob(g)}):
        for r in metric_results(results_mod.load(path)):
            entry = store.lookup(args.hardware_id, r.area, r.test_id, r.metric)
            if entry is None:
                continue
            res = evaluate(r.test_id, r.measured(), Choice(entry, None, False, None), context, workload=r.workload)
            consider(r.test_id, r.metric, entry, res.summary.median, res.gated,
                     res.verdict.get("explanation", ""), f"{path.relative_to(args.runs)} (vs committed)")
    trips = [j for j in judged if j[6]]
    print(f"{len(judged)} not-gated figures judged, {len(trips)} trip(s) of the gross-change guard "
          f"(factor {settings.gross_change.factor:g}, margin {settings.gross_change.margin:g}, "
          f"{len(settings.gross_change.factors)} configured factor(s))")
    for j in trips:
        print(f"  TRIP {j[1]:.2f}x > {j[2]:.1f}x  {j[4]} {j[5]}  [{j[3]}]")
    print("closest to their limit:")
    for j in sorted(judged, reverse=True)[:args.top]:
        print(f"  {j[0]:.2f} of the limit: {j[1]:.2f}x of {j[2]:.1f}x  {j[4]} {j[5]}  [{j[3]}]")
    worst: dict[str, tuple] = {}
    for j in judged:
        fn = j[4].split("[")[0]
        if fn not in worst or j[1] > worst[fn][1]:
            worst[fn] = j
    print("largest worsening per test function:")
    for j in sorted(worst.values(), key=lambda j: -j[1])[:args.top * 2]:
        print(f"  {j[1]:6.2f}x (limit {j[2]:.1f}x)  {j[4]} {j[5]}  [{j[3]}]")
    return 1 if trips else 0


if __name__ == "__main__":
    raise SystemExit(main())
