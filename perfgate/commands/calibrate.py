"""`perfgate calibrate [options] [--] PYTEST_ARGS`: measure run-to-run spread, propose tolerances.

`perfgate calibrate --from RUN RUN RUN ...`: the same from saved runs, e.g. one per sitting, night or node
(results files of `pytest --perf-save`, or runs of the results store by hash or name, ``--store``:
perfgate.store.run_store.load_runs): the spread a tolerance must cover comes from runs that did not
share a machine, which one sitting cannot produce.

A tolerance should sit just above what this machine does to a number from one run to
the next. Within-run samples understate that (they share the process, the clocks, the
page cache); so calibrate runs the selected tests N times in fresh pytest processes and
looks at the spread of the N run medians:

    spread  = 1.4826 * MAD(run medians) / median(run medians)   (absolute for fractions)
    propose = max(floor, k * spread)

and prints, per metric, the configured tolerance, the proposal, the false-alarm rate of
each (one run against a one-run baseline whose medians both scatter with ``spread``:
P(false alarm) = 1 - Phi(tol / (spread * sqrt 2))) and the minimum detectable regression
at the chosen false-alarm rate alpha and power: (z(1-alpha) + z(power)) * spread * sqrt 2.
These are upper bounds on false alarms: the gate also asks for a significant rank test.
Beside them, each run is judged as the gate would judge it against a baseline pooled from the
other runs (perfgate.judge.held_out, leave-one-out): the worst held-out change per metric, and
every gated metric that a held-out run of the same code would have failed -- the direct answer to
"does the configured tolerance hold on a run it has not seen?".

With --write, the N runs' pooled samples become the baseline for this hardware id, with
the proposed tolerance and the spread stored beside them (after review, or --yes), through
perfgate.store.baseline_writer: the runs must be clean (no test-only mutation, a committed tree
unless --allow-dirty), every number finite, no stored baseline of another workload replaced
unless --allow-other-workload. (Runs that disagree are not refused here, unlike refresh: the
proposed tolerance is made from their disagreement.)
"""
from __future__ import annotations

import argparse
import math
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import Progress
from scipy.stats import norm

from perfgate import mutations
from perfgate.commands.store import add_store_option
from perfgate.commands import pytest_run
from perfgate.store import baseline_writer, results as results_mod, run_store
from perfgate import interrupts
from perfgate.commands.confirm import confirmed
from perfgate.judge import pooling
from perfgate.judge.metric_result import MetricResult
from perfgate.judge.metric_result import metric_results
from perfgate.store.baseline_writer import Checks
from perfgate.store.baselines import now_iso
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.settings import load_settings
from perfgate.judge.gate import tolerance
from perfgate.judge.held_out import HeldOut, leave_one_out, sitting_note, worst
from perfgate.machine.hardware_id import check_hardware_id
from perfgate.judge.metrics import MAX_TOLERANCE, summarize
from perfgate.options import number, output_folder
from perfgate.report.run_report import fmt_number
from perfgate.judge.metric_result import short_id
from perfgate.report.textable import Column, Line, render, stdout_width, wrap_words
from perfgate.judge.metric_result import area_of
from perfgate.judge.run_noise import MAD_TO_SIGMA, robust_spread

DEFAULT_FLOOR = 0.02
DEFAULT_FRACTION_FLOOR = 0.01


# the writer's checks calibrate --write offers (it pools runs that disagree by design: force is always on)
_WRITE_CHECKS = ("allow-dirty", "allow-other-workload", "allow-other-machines", "allow-interrupted")
_OWN_OPTIONS = {"--from", "--runs", "--k", "--floor", "--fraction-floor", "--alpha", "--power", "--write", "--yes",
                "--hardware-id", "--baselines", "--root", "--keep", "--include-tainted",
                *(f"--{name}" for name in _WRITE_CHECKS)}


def register(sub) -> None:
    p = sub.add_parser("calibrate", help="run tests N times, measure run-to-run spread, propose tolerances",
                       description="perfgate calibrate [options] [--] PYTEST_ARGS (options go before the tests)")
    p.add_argument("--from", dest="saved", nargs="+", metavar="RUN",
                   help="calibrate from these saved runs instead of running pytest: results files (pytest "
                        "--perf-save; .json or .json.gz) or runs in the results store (--store) by sha256, 12+ "
                        "digit prefix or <hardware-id>/<name>; at least 2, e.g. one per sitting")
    add_store_option(p, what="with --from: where a RUN that is not a file is found; with --write and fresh runs: "
                             "where each run is kept, which the baseline names (so verify-baselines checks it)")
    # every number checked as parsed, before a run starts (options.number): --k nan once ran N sessions
    p.add_argument("--runs", type=number("the runs", at_least=3, whole=True),
                   help="fresh pytest runs (default 5; at least 3: a spread of fewer run medians is no spread)")
    p.add_argument("--k", type=number("k", above=0), default=3.0,
                   help="tolerance = max(floor, k * spread) (default 3)")
    p.add_argument("--floor", type=number("the floor", at_least=0, at_most=MAX_TOLERANCE), default=DEFAULT_FLOOR,
                   help=f"smallest relative tolerance proposed (default {DEFAULT_FLOOR})")
    p.add_argument("--fraction-floor", type=number("the fraction floor", at_least=0, below=1),
                   default=DEFAULT_FRACTION_FLOOR,
                   help=f"smallest absolute tolerance proposed for fractions (default {DEFAULT_FRACTION_FLOOR})")
    p.add_argument("--alpha", type=number("alpha", above=0, below=1), default=0.01,
                   help="false-alarm rate for the detectable regression (0.01)")
    p.add_argument("--power", type=number("the power", above=0, below=1), default=0.8,
                   help="detection probability for the detectable regression")
    p.add_argument("--write", action="store_true", help="store pooled samples, spread and proposal as the baseline")
    p.add_argument("--yes", "-y", action="store_true", help="with --write: write without asking")
    baseline_writer.add_check_options(p.add_argument, ("include-tainted",))
    baseline_writer.add_check_options(p.add_argument, _WRITE_CHECKS, when="with --write: ")
    p.add_argument("--hardware-id", help="passed to pytest as --perf-hardware-id")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root; pytest runs here")
    p.add_argument("--keep", type=output_folder, help="keep each run's results JSON in this folder")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="tests and pytest options, e.g. -m cpu perf/")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Calibration:
    """The spread of one metric over N runs and what follows from it."""

    test_id: str
    metric: str
    unit: str
    better: str
    run_medians: tuple[float, ...]
    pooled: tuple[float, ...]
    within: float | None     # median over runs of the within-run robust spread
    spread: float | None     # between-run robust spread of the medians (relative; absolute for fractions)
    proposed: float | None
    configured: float

    @property
    def absolute(self) -> bool:
        return self.unit == "fraction"


def propose(spread: float | None, *, k: float, floor: float) -> float | None:
    """k x spread, at least ``floor``, at most MAX_TOLERANCE (the readers refuse a wider one: it lets
    any change pass); None where the spread is undefined or not finite (nothing honest to store)."""
    if spread is None or not math.isfinite(spread):
        return None
    return min(MAX_TOLERANCE, max(floor, k * spread))


def false_alarm_rate(tol: float, spread: float | None) -> float | None:
    """P(one run's median is worse than a one-run baseline's by more than tol) under pure noise."""
    if spread is None:
        return None
    if spread == 0:
        return 0.0
    return float(norm.sf(tol / (spread * math.sqrt(2))))


def detectable(spread: float | None, *, alpha: float, power: float) -> float | None:
    """Smallest true regression one run flags with probability ``power`` at false-alarm rate ``alpha``."""
    if spread is None:
        return None
    return float((norm.isf(alpha) + norm.ppf(power)) * spread * math.sqrt(2))


def calibrate_docs(docs: list[dict], settings, *, k: float, floor: float, fraction_floor: float,
                   include_tainted: bool = False) -> list[Calibration]:
    """Pool N results documents into one Calibration per (test, metric)."""
    medians: dict[tuple[str, str], list[float]] = {}
    pooled: dict[tuple[str, str], list[float]] = {}
    within: dict[tuple[str, str], list[float]] = {}
    meta: dict[tuple[str, str], MetricResult] = {}
    for doc in docs:
        for r in metric_results(doc):
            if r.tainted and not include_tainted:
                continue
            key = (r.test_id, r.metric)
            meta[key] = r
            medians.setdefault(key, []).append(r.summary.median)
            pooled.setdefault(key, []).extend(r.summary.samples)
            w = robust_spread(r.summary.samples, absolute=r.unit == "fraction")
            if w is not None:
                within.setdefault(key, []).append(w)
    out = []
    for key, r in sorted(meta.items()):
        absolute = r.unit == "fraction"
        spread = robust_spread(medians[key], absolute=absolute) if len(medians[key]) >= 3 else None
        configured = tolerance(settings, r.test_id, r.measured())
        out.append(Calibration(
            test_id=r.test_id, metric=r.metric, unit=r.unit, better=r.better,
            run_medians=tuple(medians[key]), pooled=tuple(pooled[key]),
            within=float(np.median(within[key])) if within.get(key) else None, spread=spread,
            proposed=propose(spread, k=k, floor=fraction_floor if absolute else floor), configured=configured))
    return out


def _pct(x: float | None, absolute: bool) -> str:
    if x is None:
        return "-"
    return f"{x:.3f}" if absolute else f"{x * 100:.1f}%"


def _rate(x: float | None) -> str:
    return "-" if x is None else (f"{x:.1%}" if x >= 0.001 else "<0.1%")


COLUMNS = (Column("test", fold=True, group=True), Column("metric", fold=True), Column("runs", "right"),
           Column("median", "right"), Column("unit"), Column("within", "right"), Column("run-to-run", "right"),
           Column("tol", "right"), Column("alarms", "right"), Column("proposed", "right"),
           Column("alarms", "right"), Column("detectable", "right"), Column("held out", "right"))


def _held_out(held: list[HeldOut] | None, absolute: bool) -> str:
    """The worst held-out change; ``!`` where a held-out run fails a gated metric, ``~`` where the metric
    is not gated (record-only, not-comparable), ``-`` where no run was judged against the others."""
    w = worst(held or [])
    if w is None:
        return "-"
    mark = "!" if w.alarm else ("" if w.gated else "~")
    change = f"{w.change:+.3f}" if absolute else f"{w.change * 100:+.1f}%"
    return mark + change


def table_rows(cals: list[Calibration], *, alpha: float, power: float,
               held: dict[tuple[str, str], list[HeldOut]] | None = None) -> tuple[list[list[str]], list[str | None]]:
    """One row per metric; a configured tolerance that false-alarms more often than alpha, or that a
    held-out run fails, is marked ``!``."""
    rows, styles = [], []
    for c in cals:
        fa_conf = false_alarm_rate(c.configured, c.spread)
        fa_prop = false_alarm_rate(c.proposed, c.spread) if c.proposed is not None else None
        failed = any(h.alarm for h in (held or {}).get((c.test_id, c.metric), ()))
        loud = (fa_conf is not None and fa_conf > alpha) or failed
        rows.append([short_id(c.test_id), c.metric, str(len(c.run_medians)), fmt_number(float(np.median(c.run_medians))),
                     c.unit, _pct(c.within, c.absolute), _pct(c.spread, c.absolute),
                     ("!" if loud else "") + _pct(c.configured, c.absolute), _rate(fa_conf),
                     _pct(c.proposed, c.absolute), _rate(fa_prop),
                     _pct(detectable(c.spread, alpha=alpha, power=power), c.absolute),
                     _held_out((held or {}).get((c.test_id, c.metric)), c.absolute)])
        styles.append("noisy" if loud else None)
    return rows, styles


def table(cals: list[Calibration], *, alpha: float, power: float, title: str, width: int,
          held: dict[tuple[str, str], list[HeldOut]] | None = None) -> list[Line]:
    """Short headers (explained in the legend printed below) so the numbers fit at 100 columns."""
    rows, styles = table_rows(cals, alpha=alpha, power=power, held=held)
    return render(COLUMNS, rows, width=width, title=title, styles=styles)


def held_out_summary(cals: list[Calibration], held: dict[tuple[str, str], list[HeldOut]]) -> list[str]:
    """The count of gated metrics judged leave-one-out, then every held-out run that fails one (its
    explanation as the gate words it): what a run of unchanged code would be told."""
    per_metric = [(c, hs) for c in cals if (hs := held.get((c.test_id, c.metric)))]
    gated = [hs for _, hs in per_metric if any(h.gated for h in hs)]
    verdicts = sum(h.gated for hs in gated for h in hs)
    void = sum(all(h.outcome == "not-comparable" for h in hs) for _, hs in per_metric
               if not any(h.gated for h in hs))
    alarms = [(c, h) for c, hs in per_metric for h in hs if h.alarm]
    lines = [f"held out: {verdicts} verdicts on {len(gated)} gated metrics, each run against the others "
             f"pooled; {len(alarms)} would fail",
             f"gated: {len(gated)} of {len(per_metric)} metrics judged held out "
             f"({100 * len(gated) / max(len(per_metric), 1):.0f} %); not gated: "
             f"{len(per_metric) - len(gated) - void} recorded only, {void} not comparable"]
    for c, h in alarms:
        lines.append(f"  {h.run}: {short_id(c.test_id)} {c.metric}: {h.explanation}")
    return lines


def entries(cals: list[Calibration], docs: list[dict], *, k: float, floor: float, fraction_floor: float,
            names: list[str] | None = None, refs: list[dict] | None = None
            ) -> dict[str, dict[str, dict[str, BaselineEntry]]]:
    """``refs``: each saved run's results-store reference (run_store.run_reference), which the baseline's
    run summaries record, as refresh's do, so that `perfgate verify-baselines` can re-derive them."""
    last = docs[-1]
    software = (last.get("fingerprint") or {}).get("software")
    names = names or [f"run{i + 1}" for i in range(len(docs))]
    pooled = pooling.pool(docs, names, refs=refs) if len(docs) > 1 else None
    runs = {(r["test_id"], r["metric"]): tuple(r.get("runs") or ()) for r in (pooled or {}).get("results", [])}
    workloads = {(r["test_id"], r["metric"]): r.get("workload") for d in docs for r in d.get("results") or []}
    out: dict[str, dict[str, dict[str, BaselineEntry]]] = {}
    for c in cals:
        if c.proposed is None:
            continue  # too few runs measured it: nothing honest to store
        spread = {"runs": len(c.run_medians), "run_medians": list(c.run_medians), "run_to_run": c.spread,
                  "within_run": c.within if c.within is None or math.isfinite(c.within) else None, "k": k, "floor": fraction_floor if c.absolute else floor,
                  "proposed_tol": c.proposed, "absolute": c.absolute, "when": now_iso()}
        entry = BaselineEntry(unit=c.unit, better=c.better, summary=summarize(c.pooled), tol=c.proposed,
                                provenance=f"measured: calibrate, pooled over {len(c.run_medians)} runs",
                                when=last.get("created"), commit=last.get("commit"), software=software,
                                spread=spread, runs=runs.get((c.test_id, c.metric), ()),
                                workload=workloads.get((c.test_id, c.metric)))
        out.setdefault(area_of(c.test_id), {}).setdefault(c.test_id, {})[c.metric] = entry
    return out


def _saved_runs(args: argparse.Namespace) -> tuple[list[dict], list[str], list[dict]]:
    """--from: the saved runs (files or stored runs), checked as every command checks them, in the order
    given, with how a baseline names each (its run reference)."""
    if args.pytest_args:
        raise ValueError(f"--from calibrates from saved runs; it takes no tests ({' '.join(args.pytest_args)})")
    for option, value in (("--runs", args.runs), ("--keep", args.keep), ("--hardware-id", args.hardware_id)):
        if value is not None:
            raise ValueError(f"{option} is for calibrating by running pytest; --from reads saved runs")
    if len(args.saved) < 2:
        raise ValueError("--from needs at least 2 runs (3 or more for a run-to-run spread)")
    if len(set(args.saved)) != len(args.saved):
        raise ValueError("--from names a run twice; each run counts once")
    runs = run_store.load_runs(args.saved, args.store)
    names, docs = [r.name for r in runs], [r.doc for r in runs]
    reference = {r.name: r.reference for r in runs}
    for name, doc in zip(names, docs):
        if doc.get("ab"):
            raise ValueError(f"{name} is a `perfgate ab` comparison (per-round medians of two environments), not "
                             f"a run; calibrate from `pytest --perf-save` results")
        # shown, not refused: judging a planted run against clean ones is how one sees what it plants;
        # --write refuses it (baseline_writer.check_documents)
        if doc.get(mutations.RESULTS_KEY):
            mark = doc[mutations.RESULTS_KEY]
            print(f"note: {name} was measured with planted bugs ({mark.get('note') or mark.get('names')}): its "
                  f"held-out verdicts are of the planted code", file=sys.stderr)
        if doc.get("interrupted"):
            print(f"note: {name} comes from an interrupted run: it holds the tests that finished", file=sys.stderr)
    # the same content under two names is one run: held out against itself it would hide its own spread
    docs, names = baseline_writer.distinct(docs, names, lambda text: print(f"note: {text}", file=sys.stderr))
    if len(docs) < 2:
        raise ValueError("--from needs at least 2 different runs; these hold one")
    return docs, names, [reference[n] for n in names]


def _fresh_runs(args: argparse.Namespace, root: Path, settings) -> tuple[list[dict], list[str], list[dict]]:
    """N fresh pytest runs of the selection, each saved (under --keep, or a temporary folder); with --write,
    each also kept in the results store (--store, else $PERFGATE_RESULTS_STORE, else the embedded default),
    whose reference the baseline records, as `perfgate refresh` records a file's."""
    runs = 5 if args.runs is None else args.runs
    if args.hardware_id is not None:
        check_hardware_id(args.hardware_id, source="--hardware-id")
    pytest_args = list(args.pytest_args)
    if pytest_args and pytest_args[0] == "--":
        pytest_args = pytest_args[1:]
    else:
        ours = sorted({a.split("=")[0] for a in pytest_args} & _OWN_OPTIONS)
        if ours:
            raise ValueError(f"{', '.join(ours)} came after the tests and would go to pytest: put perfgate "
                             f"options first, e.g. `perfgate calibrate --runs 5 -- -m cpu perf/`")
    if args.baselines:
        pytest_args += ["--perf-baselines", str(settings.baselines)]
    console = Console(width=200)
    with tempfile.TemporaryDirectory(prefix="perfgate-calibrate-") as tmp:
        folder = args.keep or Path(tmp)
        folder.mkdir(parents=True, exist_ok=True)
        docs, refs = [], []
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"calibrating: {runs} runs of pytest {' '.join(pytest_args)}", total=runs)
            for i in range(runs):
                path = folder / f"run{i + 1}.json"
                pytest_run.run_saving([*pytest_args, "-q"], path, root=root, hardware_id=args.hardware_id)
                docs.append(results_mod.load(path))
                if args.write:
                    name = run_store.session_name(docs[-1], run_store.uncompressed_bytes(path), f"run{i + 1}")
                    refs.append(run_store.add(args.store, path, name=name)[0])
                progress.advance(task)
    return docs, [f"calibration run {i + 1}" for i in range(len(docs))], refs


def run(args: argparse.Namespace) -> int:
    root = args.root.resolve()
    settings = load_settings(root, args.baselines)
    if args.store and not (args.saved or args.write):
        raise ValueError("--store names where the runs of --from are found, or where --write keeps the fresh runs; "
                         "without either, fresh runs are saved by --keep")
    docs, names, refs = _saved_runs(args) if args.saved else _fresh_runs(args, root, settings)
    hw = {d["hardware_id"] for d in docs}
    if len(hw) != 1:
        raise ValueError(f"runs report different hardware ids {sorted(hw)}; calibrate on one machine")
    hardware_id = hw.pop()
    # the id's own tolerances.toml sets the configured tolerances and record-only rules the runs are held to
    settings = load_settings(root, args.baselines, hardware_id)
    cals = calibrate_docs(docs, settings, k=args.k, floor=args.floor, fraction_floor=args.fraction_floor,
                          include_tainted=args.include_tainted)
    console = Console(width=200)
    if not cals:
        console.print("no metrics recorded: the selected tests record nothing (or every run was tainted)")
        return 1
    held = leave_one_out(docs, names, settings, hardware_id, include_tainted=args.include_tainted)
    width = stdout_width()
    source = "saved runs" if args.saved else "runs"
    for line in table(cals, alpha=args.alpha, power=args.power, width=width, held=held,
                      title=f"perfgate calibrate: {hardware_id}, {len(docs)} {source}, k={args.k:g}"):
        print(line.text)
    legend = (f"within = within-run spread; run-to-run = {MAD_TO_SIGMA} x MAD of the run medians (relative; "
              f"absolute for fractions). tol = the configured tolerance, proposed = max(floor, k x run-to-run); "
              f"alarms (after each) = P(noise alone exceeds it) for one run vs a one-run baseline; detectable = "
              f"smallest regression flagged with probability {args.power:g} at false-alarm rate {args.alpha:g}; "
              f"held out = the worst change of one run judged by the gate against the others pooled "
              f"(~: not gated there). !: the configured tolerance false-alarms more often than alpha, or a "
              f"held-out run fails it.")
    for line in wrap_words(legend, width):
        print(line)
    note = sitting_note(docs)
    for line in ([note] if note else []) + held_out_summary(cals, held):
        print(line)
    if not args.write:
        return 0
    # force: calibrate's tolerance is made from how far its runs disagree, so their disagreement is its
    # measurement, not a reason to refuse it (refresh's check compares runs against a tolerance set before)
    checks = Checks.of(lambda name: getattr(args, name.replace("-", "_")), ("include-tainted", *_WRITE_CHECKS),
                       force=True)
    baseline_writer.check_documents(docs, names, checks)
    plan = baseline_writer.plan_from_entries(
        hardware_id, entries(cals, docs, k=args.k, floor=args.floor, fraction_floor=args.fraction_floor, names=names,
                             refs=refs or None),
        fingerprint=pooling.newest(docs).get("fingerprint"), source=f"calibrate ({len(docs)} {source})")
    store = baseline_writer.store_for_writing(settings, named=args.baselines is not None,
                                              pyproject=root / "pyproject.toml")
    if not confirmed(args.yes, f"write {plan.count} calibrated metric(s) to {store.root / hardware_id}?"):
        return 1
    baseline_writer.write_plan(store, plan, checks,
                               wrote=lambda path, prev: interrupts.say_while_writing(f"wrote {path}"))
    return 0
