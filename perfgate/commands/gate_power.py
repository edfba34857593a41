"""`perfgate power --against-baselines`: how often the gate itself cries wolf, and how often it sees.

`perfgate power` measures `perfgate ab`, a same-machine A/B with both sides interleaved. What CI
runs is the gate: one pytest run judged against the committed baselines of its hardware id. This
mode repeats that run ``--repeats`` times per condition (A = A: the code as it is; each slowdown:
the test-only knob on, perfgate.mutations) in the order `perfgate power` uses (each repeat runs
every condition, so a machine that gets busier hits all of them), with the run's own
re-measurements (``--perf-retries`` as configured, as in CI), and counts:

- per condition, the runs that failed (pytest exit 1: some gated metric regressed);
- per test function and metric (``test_all_reduce time_over_p2p``: every case of the op), the runs
  in which at least one of its cases regressed, and the runs in which some of its cases were
  tainted (measured on a busy machine: not gated, so such a run can neither cry wolf nor see).

The table is what "a 2x slowdown of any collective fails >= 9 of 10 runs, with 0 of 10 A = A false
alarms" asks of the CPU collectives (docs/lifecycle.md, "The gate itself"). ``--save`` is rewritten after every
run (``"complete": false`` until the last), each run's results document kept under ``--keep``.

:func:`tally_runs` counts the same from runs already judged (``perfgate power --tally RUN...``: results
files, or runs of a results store by hash or name, or every stored run of ``--hardware-id``): each run is
one verdict of the gate, under the condition its document records (the test-only knobs it was measured
with, perfgate.mutations; none: A = A). Runs of several sessions or machines' stores add up this way.
"""
from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from perfgate import mutations
from perfgate.commands import pytest_run
from perfgate.report.textable import Column, render, stdout_width
from perfgate.report.trends import family_of
from perfgate.store import results as results_mod
from perfgate.judge.metric_result import metric_results
from perfgate.store.atomic import write_json_atomic
from perfgate.judge.metric_result import MetricResult


@dataclass
class RunCount:
    """One (test function, metric) under one condition, over the runs."""

    runs: int = 0
    regressed: int = 0       # runs in which a gated case of it read `regression`
    tainted: int = 0         # runs in which some case of it was tainted
    worst: list[float] = field(default_factory=list)  # each run's worst change among its cases

    def add(self, results: list[MetricResult]) -> None:
        self.runs += 1
        self.regressed += any(r.gated and r.outcome == "regression" for r in results)
        self.tainted += any(bool(r.tainted) for r in results)
        changes = [float(r.verdict["change"]) for r in results if isinstance(r.verdict.get("change"), (int, float))]
        if changes:
            self.worst.append(max(changes))


def group(results: list[MetricResult]) -> dict[tuple[str, str], list[MetricResult]]:
    """Results by (test function, metric): a slowdown of one collective is seen if any size is."""
    out: dict[tuple[str, str], list[MetricResult]] = {}
    for r in results:
        out.setdefault((family_of(r.test_id), r.metric), []).append(r)
    return out


@dataclass
class GateTally:
    conditions: dict[str, dict[str, str]]
    failed: dict[str, int] = field(default_factory=dict)     # runs that exited 1, per condition
    runs: dict[str, int] = field(default_factory=dict)
    counts: dict[tuple[str, str], dict[str, RunCount]] = field(default_factory=dict)

    def add(self, cond: str, exit_status: int, results: list[MetricResult]) -> None:
        self.runs[cond] = self.runs.get(cond, 0) + 1
        self.failed[cond] = self.failed.get(cond, 0) + (exit_status == 1)
        for key, rs in group(results).items():
            self.counts.setdefault(key, {}).setdefault(cond, RunCount()).add(rs)

    def document(self, pytest_args: list[str], done: int, total: int, stopped: str | None = None) -> dict:
        return {"mode": "against-baselines", "conditions": self.conditions, "pytest_args": pytest_args,
                "runs_done": done, "runs_planned": total, "complete": done == total and not stopped,
                **({"stopped": stopped} if stopped else {}),
                "runs_failed": {c: {"failed": self.failed.get(c, 0), "runs": self.runs.get(c, 0)}
                                for c in self.conditions},
                "metrics": [{"test": test, "metric": metric,
                             **{c: {"runs": n.runs, "regressed": n.regressed, "tainted": n.tainted,
                                    "worst_change": n.worst} for c, n in by_cond.items()}}
                            for (test, metric), by_cond in sorted(self.counts.items())]}

    def print_table(self, title: str) -> None:
        conds = list(self.conditions)
        columns = [Column("test", fold=True, group=True), Column("metric", fold=True),
                   *(Column("false alarms" if c == "A = A" else f"detected {c}", "right") for c in conds)]
        rows = [["(whole run)", "exit 1", *(f"{self.failed.get(c, 0)}/{self.runs.get(c, 0)}" for c in conds)]]
        for (test, metric), by_cond in sorted(self.counts.items()):
            cells = []
            for c in conds:
                n = by_cond.get(c, RunCount())
                cells.append(f"{n.regressed}/{n.runs}" + (f" ({n.tainted} tainted)" if n.tainted else ""))
            rows.append([test, metric, *cells])
        for line in render(columns, rows, width=stdout_width(), title=title):
            print(line.text)
        print("cells: runs in which a gated case of the test function regressed / runs (runs in which some case was "
              "tainted: measured on a busy machine, so not gated)")


def run(args: argparse.Namespace, pytest_args: list[str], conditions: dict[str, dict[str, str]],
        plan: list[tuple[int, str]]) -> int:
    """Every (repeat, condition) of ``plan`` as one pytest run against the baselines."""
    tally = GateTally(conditions)
    total, done, stopped = len(plan), 0, None
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    durations: list[float] = []
    root = args.root.resolve()
    with tempfile.TemporaryDirectory(prefix="perfgate-gate-power-") as scratch:
        for done, (rep, cond) in enumerate(plan):
            if deadline is not None and durations and sum(durations) / len(durations) > deadline - time.monotonic():
                stopped = (f"stopped by --time-limit before run {done + 1} of {total}: one run took "
                           f"~{sum(durations) / len(durations):.0f} s")
                break
            env = conditions[cond]
            shown = " ".join(f"{k}={v}" for k, v in env.items()) or "as committed"
            print(f"repeat {rep + 1}, {cond} ({shown}), run {done + 1}/{total}", file=sys.stderr)
            keep = args.keep / f"repeat{rep + 1}-{'AeqA' if not env else cond}.json" if args.keep else None
            save = keep or Path(scratch) / f"run{done}.json"
            if keep:
                keep.parent.mkdir(parents=True, exist_ok=True)
            start = time.monotonic()
            status = pytest_run.run_saving(pytest_args, save, root=root, hardware_id=args.hardware_id,
                                           env_extra=env, remeasure=True)
            durations.append(time.monotonic() - start)
            tally.add(cond, status, metric_results(results_mod.load(save)))
            if args.save:
                write_json_atomic(args.save, tally.document(pytest_args, done + 1, total))
        else:
            done = total
    if stopped:
        print(f"perfgate power: {stopped}", file=sys.stderr)
        if args.save:
            write_json_atomic(args.save, tally.document(pytest_args, done, total, stopped))
    tally.print_table(f"perfgate power --against-baselines: {done} of {total} runs of {shlex.join(pytest_args)}")
    if args.save:
        print(f"saved {args.save}")
    return 3 if stopped else 0


def condition_of(doc: dict) -> str:
    """The condition a results document was measured under: ``A = A``, or the planted knobs and factors."""
    mark = doc.get(mutations.RESULTS_KEY) or {}
    factors = mark.get("factors") or {}
    names = [str(n) for n in mark.get("names") or []]
    return ", ".join(f"{n} {factors[n]:g}" if isinstance(factors.get(n), (int, float)) else n
                     for n in names) or ("planted" if mark else "A = A")


def tally_runs(runs) -> GateTally:
    """The gate's verdicts in runs already judged (perfgate.store.run_store.LoadedRun each): a run failed
    where a gated metric read ``regression`` (what made its pytest exit 1), per condition."""
    conditions = sorted({condition_of(r.doc) for r in runs}, key=lambda c: (c != "A = A", c))
    tally = GateTally({c: {} for c in conditions})
    for r in runs:
        results = metric_results(r.doc)
        tally.add(condition_of(r.doc), int(any(x.gated and x.outcome == "regression" for x in results)), results)
    return tally
