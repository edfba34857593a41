"""`perfgate power [options] [--] PYTEST_ARGS`: how often `perfgate ab` cries wolf, how often it sees.

A gate is worth what its verdicts are worth, so measure them: repeat a same-machine A/B
(`perfgate ab`'s rounds and verdict) ``--repeats`` times for A = A (false alarms) and for
each injected slowdown of a test-only knob (default PERFGATE_TEST_COLLECTIVE_SLOWDOWN =
1.05, 1.10, 1.25: detections), and print per metric how many repeats each condition flagged
as a regression, with the mean measured change (the true effect of the knob on this machine,
which on a busy one is not exactly the nominal one).

Costly by design: repeats x (1 + slowdowns) x rounds x 2 pytest runs. Run it on a quiet
machine, and keep the selection small.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path


from perfgate.judge import ab_stats
from perfgate.commands import ab as ab_cmd
from perfgate.report.run_report import short_id
from perfgate.report.textable import Column, render, stdout_width
from perfgate.store.results import MetricResult

DEFAULT_KNOB = "PERFGATE_TEST_COLLECTIVE_SLOWDOWN"
_OWN_OPTIONS = {"--knob", "--slowdowns", "--repeats", "--rounds", "--threshold", "--confidence",
                "--save", "--root", "--hardware-id"}


def register(sub) -> None:
    p = sub.add_parser("power", help="false-alarm and detection rates of `perfgate ab` with injected slowdowns",
                       description="perfgate power [options] [--] PYTEST_ARGS (options go before the tests)")
    p.add_argument("--knob", default=DEFAULT_KNOB, help=f"environment variable of the slowdown (default {DEFAULT_KNOB})")
    p.add_argument("--slowdowns", default="1.05,1.1,1.25", help="comma-separated factors (default 1.05,1.1,1.25)")
    p.add_argument("--repeats", type=int, default=5, help="A/B runs per condition (default 5)")
    p.add_argument("--rounds", type=int, default=8, help=f"rounds per A/B (default 8): even, at least "
                   f"{ab_stats.MIN_ROUNDS + ab_stats.MIN_ROUNDS % 2}, as in `perfgate ab`")
    p.add_argument("--threshold", type=float, default=ab_stats.DEFAULT_THRESHOLD, help="as in `perfgate ab`")
    p.add_argument("--confidence", type=float, default=ab_stats.DEFAULT_CONFIDENCE, help="as in `perfgate ab`")
    p.add_argument("--save", type=Path, help="write the counts as JSON here")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root; pytest runs here")
    p.add_argument("--hardware-id", help="passed to pytest as --perf-hardware-id")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="tests and pytest options")
    p.set_defaults(func=run)


@dataclass
class Tally:
    """One metric under one condition over the repeats."""

    regressions: int = 0
    runs: int = 0
    changes: list[float] = field(default_factory=list)

    def add(self, r: MetricResult) -> None:
        self.runs += 1
        self.regressions += r.outcome == "regression"
        if r.verdict.get("change") is not None:
            self.changes.append(float(r.verdict["change"]))

    @property
    def mean_change(self) -> float | None:
        return sum(self.changes) / len(self.changes) if self.changes else None


def tally(per_condition: dict[str, list[list[MetricResult]]]) -> dict[tuple[str, str], dict[str, Tally]]:
    """{condition: [results of each repeat]} -> {(test, metric): {condition: Tally}}."""
    out: dict[tuple[str, str], dict[str, Tally]] = {}
    for cond, repeats in per_condition.items():
        for results in repeats:
            for r in results:
                out.setdefault((r.test_id, r.metric), {}).setdefault(cond, Tally()).add(r)
    return out


def parse_slowdowns(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--slowdowns {text!r}: expected comma-separated numbers, e.g. 1.05,1.1,1.25") from None
    if not values or any(not (v > 1 and math.isfinite(v)) for v in values):
        raise ValueError(f"--slowdowns {text!r}: each factor must be a finite number above 1")
    return values


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if args.rounds < ab_stats.MIN_ROUNDS:
        raise ValueError(f"--rounds must be >= {ab_stats.MIN_ROUNDS}")
    if args.rounds % 2:
        raise ValueError(f"--rounds must be even (got {args.rounds}), as in `perfgate ab`")
    slowdowns = parse_slowdowns(args.slowdowns)
    pytest_args = ab_cmd.split_args(list(args.pytest_args), _OWN_OPTIONS, "power")
    root = args.root.resolve()
    python = sys.executable
    conditions = {"A = A": {}} | {f"x{k:g}": {args.knob: f"{k:g}"} for k in slowdowns}
    per_condition: dict[str, list[list[MetricResult]]] = {c: [] for c in conditions}
    for rep in range(args.repeats):
        for cond, env in conditions.items():
            print(f"repeat {rep + 1}/{args.repeats}, {cond}:", file=sys.stderr)
            docs, _ = ab_cmd.measure({"a": (python, {}), "b": (python, env)}, args.rounds, pytest_args, root=root,
                                     hardware_id=args.hardware_id)
            per_condition[cond].append(ab_cmd.compare(docs["a"], docs["b"], threshold=args.threshold,
                                                      confidence=args.confidence, rerun=""))
    counts = tally(per_condition)
    columns = [Column("test", fold=True, group=True), Column("metric", fold=True),
               *(Column("false alarms" if cond == "A = A" else f"detected {cond}", "right") for cond in conditions)]
    rows = []
    for (test, metric), by_cond in sorted(counts.items()):
        cells = []
        for cond in conditions:
            c = by_cond.get(cond, Tally())
            mean = "" if c.mean_change is None else f" ({c.mean_change * 100:+.1f}%)"
            cells.append(f"{c.regressions}/{c.runs}{mean}")
        rows.append([short_id(test), metric, *cells])
    title = f"perfgate power: {args.repeats} repeats x {args.rounds} rounds, threshold {args.threshold * 100:g}%"
    for line in render(columns, rows, width=stdout_width(), title=title):
        print(line.text)
    print("cells: regression verdicts / A/B runs (mean measured worsening of B against A)")
    if args.save:
        args.save.write_text(json.dumps({
            "repeats": args.repeats, "rounds": args.rounds, "threshold": args.threshold, "knob": args.knob,
            "pytest_args": pytest_args,
            "metrics": [{"test_id": test, "metric": metric,
                         **{cond: {"regressions": c.regressions, "runs": c.runs, "mean_change": c.mean_change}
                            for cond, c in by_cond.items()}} for (test, metric), by_cond in sorted(counts.items())]},
            indent=1))
        print(f"saved {args.save}")
    return 0
