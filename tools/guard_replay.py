#!/usr/bin/env python3
"""Replay the gross-change guard over saved runs of one machine: would it have fired on unchanged code?

    python tools/guard_replay.py results-store/cpu-AMD-EPYC-isaunknown-2c --hardware-id cpu-AMD-EPYC-isaunknown-2c \
        --pooled 'ci-*.json*' --against-committed 'ten-run-check-*.json*' 'collectives-training-offload-*.json*'

Runs matching --pooled are judged leave-one-out (each against a baseline pooled from the others:
out of sample, as a future run meets a committed baseline); runs matching --against-committed
are judged against the committed baseline of --hardware-id. Both go through perfgate.judge.gate.evaluate
with the settings (tolerances.toml, [gross_change]) that apply to that id, so what this prints is
what a run would have been told. Lists every trip, the figures closest to their limit, and the
largest worsening of a not-gated figure per test function: the evidence for a [gross_change]
setting (docs/hardware-ids.md).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import perfgate  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.judge import guard
from perfgate.judge.baseline_choice import Choice
from perfgate.store.baselines import BaselineEntry, BaselineStore
from perfgate.judge.config import load_settings
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.metrics import Metric, summarize


def _results(path: Path) -> dict[tuple[str, str], dict]:
    return {(r["test_id"], r["metric"]): r for r in json.loads(path.read_text())["results"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, help="folder of results files (pytest --perf-save)")
    ap.add_argument("--hardware-id", required=True, help="whose baselines and tolerances apply")
    ap.add_argument("--pooled", nargs="*", default=[], help="globs (under RUNS) judged leave-one-out")
    ap.add_argument("--against-committed", nargs="*", default=[], help="globs judged against the committed baseline")
    ap.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    ap.add_argument("--top", type=int, default=8)
    args = ap.parse_args(argv)
    settings = load_settings(args.root, hardware_id=args.hardware_id)
    context = Context.of(settings, args.hardware_id)
    judged: list[tuple[float, float, float, str, str, str, bool]] = []  # moved/limit, moved, limit, run, test, metric, tripped

    def judge(r: dict, entry: BaselineEntry, label: str) -> None:
        m = Metric(name=r["metric"], unit=r["unit"], better=r["better"], summary=summarize(r["summary"]["samples"]))
        res = evaluate(r["test_id"], m, Choice(entry, None, False, None), context)
        tripped = res.verdict.get("explanation", "").startswith("gross change")
        if (res.gated and not tripped) or m.family == "fraction":
            return
        moved = guard.worsening_factor(entry.summary.median, res.summary.median, entry.better)
        limit = guard.limit_for(settings.gross_change, r["test_id"], r["metric"], entry)[0]
        judged.append((moved / limit, moved, limit, label, r["test_id"], r["metric"], tripped))

    pooled = sorted({p for g in args.pooled for p in args.runs.glob(g)})
    docs = {p: _results(p) for p in pooled}
    for held in pooled:
        for key, r in docs[held].items():
            samples = [s for p in pooled if p != held and key in docs[p] for s in docs[p][key]["summary"]["samples"]]
            if len(samples) >= 3:
                entry = BaselineEntry(unit=r["unit"], better=r["better"], summary=summarize(samples), tol=None,
                                      provenance="leave-one-out")
                judge(r, entry, f"{held.name} (vs the others)")
    store = BaselineStore(settings.baselines)
    for path in sorted({p for g in args.against_committed for p in args.runs.glob(g)}):
        for (test_id, metric), r in _results(path).items():
            entry = store.lookup(args.hardware_id, r["area"], test_id, metric)
            if entry is not None:
                judge(r, entry, f"{path.relative_to(args.runs)} (vs committed)")
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
