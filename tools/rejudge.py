"""Judge a saved results file against the committed baselines, as the plugin would have.

    python tools/rejudge.py results-store/1xH200/training-2026-12-02-lease1-all.json.gz [--baselines DIR]

A run saved with --perf-save keeps every metric's samples; this replays the plugin's verdict for
each against today's baselines and tolerances (no re-measurement, no retry), and prints the counts:
how many metrics were gated, not-comparable, recorded only, new -- the question "would this run
have passed, and how much of it does the gate judge?" without a GPU.
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from perfgate.judge.baseline_choice import BaselineChooser  # noqa: E402
from perfgate.store.settings import load_settings  # noqa: E402
from perfgate.judge.gate import Context, evaluate  # noqa: E402
from perfgate.store import results as results_mod  # noqa: E402
from perfgate.judge.metric_result import metric_results
from perfgate.store.baselines import BaselineStore  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", type=Path)
    ap.add_argument("--baselines", type=Path)
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[1])
    ap.add_argument("--show", default="regression", help="comma-separated outcomes to list (default regression)")
    ap.add_argument("--skip", action="append", default=[], help="leave out test ids containing this text (repeatable)")
    args = ap.parse_args(argv)
    doc = results_mod.load(args.results)
    hw = doc["hardware_id"]
    settings = load_settings(args.root, args.baselines, hw)
    chooser = BaselineChooser(BaselineStore(settings.baselines), hw, lambda: doc["fingerprint"])
    context = Context.of(settings, hw)
    counts: collections.Counter = collections.Counter()
    shown = set(args.show.split(","))
    for r in metric_results(doc):
        if any(s in r.test_id for s in args.skip):
            continue
        metric = r.measured()
        got = evaluate(r.test_id, metric, chooser.choose(r.test_id, r.metric, dependency=metric.dependency),
                       context, workload=r.workload)
        kind = "gated" if got.gated else "recorded only"
        counts[(kind, got.outcome)] += 1
        if got.outcome in shown:
            print(f"{got.outcome}: {r.test_id} {r.metric}: {got.verdict.get('explanation', '')[:160]}")
    total = sum(counts.values())
    for (kind, outcome), n in sorted(counts.items()):
        print(f"{n:5d}  {kind:<14} {outcome}")
    gated = sum(n for (kind, outcome), n in counts.items() if kind == "gated" and outcome not in ("new",))
    with_base = sum(n for (kind, outcome), n in counts.items() if outcome != "new")
    print(f"{total} metrics; {with_base} with a baseline, of which {gated} gated and judged "
          f"({100 * gated / max(with_base, 1):.0f} %)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
