"""`perfgate power [options] [--] PYTEST_ARGS`: how often `perfgate ab` cries wolf, how often it sees.

A gate is worth what its verdicts are worth, so measure them: repeat a same-machine A/B
(`perfgate ab`'s rounds and verdict) ``--repeats`` times for A = A (false alarms) and for
each injected slowdown of a test-only knob (default the mutation ``collective_slowdown`` at
1.05, 1.10, 1.25: detections), and print per metric how many repeats each condition flagged
as a regression, with the mean measured change (the true effect of the knob on this machine,
which on a busy one is not exactly the nominal one).

``--mutation NAME`` takes a graded knob of the registry (perfgate.mutations): a slowdown factor k
becomes ``PERFGATE_TEST_MUTATION=NAME:<k on the knob's scale>`` (``gpu_step_slowdown`` counts extra
work from 0, so 1.05 is ``gpu_step_slowdown:0.05``). ``--knob VAR`` takes a variable of the code
under test instead (a slowdown of the user's own), set to the factor.

Costly by design: repeats x (1 + slowdowns) x rounds x 2 pytest runs; ``--aa-repeats`` sets the
A = A count apart (the detections usually need more). Run it on a quiet
machine, and keep the selection small. Nothing measured is lost to a time limit: ``--save`` is
rewritten after every A/B (``"complete": false`` until the last), and ``--keep`` keeps every
round's results document, one folder per repeat and condition. ``--time-limit SECONDS`` (a batch job's
time limit, a CI job's timeout) starts no A/B and no round that the pace so far says cannot finish: an
A/B cut short has no verdict, so its rounds would be time spent for nothing; what is done is saved
with ``"complete": false`` and the reason under ``"stopped"``, and the exit status is 3.

``--env K=V`` sets a variable on both sides of every A/B, and ``--b-env-at FACTOR:K=V`` gives B its
slowdown through its environment instead of the knob, for a slowdown planted where the tests cannot
set it: a server started with the knob and attached to (PERFGATE_SERVING_URL, docs/serving.md:
``--env PERFGATE_SERVING_URL=<plain server> --b-env-at 1.05:PERFGATE_SERVING_URL=<planted server>``).

``--against-baselines`` measures the gate instead of `perfgate ab`: each repeat is one pytest run
judged against the committed baselines, as CI runs it, and the table counts the runs that failed and,
per test function and metric, the runs in which a case regressed or was tainted
(perfgate/commands/gate_power.py).

``--tally COUNTS...`` measures nothing: it adds up the counts files ``--save`` wrote, complete or
cut short, for one selection measured on several machines or in several sessions (a GPU session's
time holds two or three A/Bs of a device-bound case), and prints the table over all of
them. Files of another selection, knob, round count or threshold are refused, naming the field.
``--tally RUN...`` counts the gate's verdicts in runs already judged instead, as ``--against-baselines``
does: results files, or runs of the results store (``--store``) by hash or name; ``--tally --store STORE
--hardware-id ID`` takes every stored run of that id (perfgate.commands.gate_power.tally_runs).
"""
from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path


from perfgate import mutations
from perfgate.commands.store import add_store_option
from perfgate.machine.hardware_id import check_hardware_id
from perfgate.store import run_store
from perfgate.store.backends import describe, spec_of
from perfgate.judge import ab_stats
from perfgate.commands import ab as ab_cmd
from perfgate.options import number, output_file, output_folder
from perfgate.commands import gate_power
from perfgate.judge.metric_result import short_id
from perfgate.report.textable import Column, render, stdout_width
from perfgate.store.atomic import write_json_atomic
from perfgate.judge.metric_result import MetricResult

DEFAULT_MUTATION = "collective_slowdown"
_OWN_OPTIONS = {"--knob", "--mutation", "--keep", "--slowdowns", "--repeats", "--aa-repeats", "--rounds", "--threshold", "--confidence",
                "--save", "--root", "--hardware-id", "--tally", "--store", "--time-limit", "--env", "--b-env-at",
                "--against-baselines"}
_SAME_IN_EVERY_FILE = ("knob", "rounds", "threshold", "pytest_args", "conditions")


def register(sub) -> None:
    p = sub.add_parser("power", help="false-alarm and detection rates of `perfgate ab` with injected slowdowns",
                       description="perfgate power [options] [--] PYTEST_ARGS (options go before the tests)")
    knob = p.add_mutually_exclusive_group()
    knob.add_argument("--mutation", help=f"the graded test-only mutation of the slowdown (perfgate.mutations; "
                      f"default {DEFAULT_MUTATION}), e.g. gpu_step_slowdown: factor 1.05 sets "
                      f"PERFGATE_TEST_MUTATION=gpu_step_slowdown:0.05")
    knob.add_argument("--knob", metavar="VAR",
                      help="an environment variable of the code under test instead, set to the factor")
    p.add_argument("--slowdowns", default="1.05,1.1,1.25", help="comma-separated factors (default 1.05,1.1,1.25)")
    p.add_argument("--env", action="append", default=[], metavar="K=V",
                   help="environment variable of both sides of every A/B (repeat)")
    p.add_argument("--b-env-at", action="append", default=[], metavar="FACTOR:K=V",
                   help="B's environment at that slowdown instead of the knob (repeat), e.g. "
                        "1.05:PERFGATE_SERVING_URL=http://127.0.0.1:8002, a server started with the slowdown")
    p.add_argument("--repeats", type=number("the repeats", at_least=0, whole=True), default=5, help="A/B runs per slowdown (default 5); 0 with "
                   "--aa-repeats N measures only the A = A runs a tally still lacks")
    p.add_argument("--aa-repeats", type=number("the A = A repeats", at_least=0, whole=True), metavar="N",
                   help="A = A runs (default: --repeats); fewer spends the time on detections, 0 measures none")
    p.add_argument("--rounds", type=ab_cmd.rounds, default=8, help=f"rounds per A/B (default 8): even, at least "
                   f"{ab_stats.MIN_ROUNDS + ab_stats.MIN_ROUNDS % 2}, as in `perfgate ab`")
    p.add_argument("--threshold", type=ab_cmd.threshold, default=ab_stats.DEFAULT_THRESHOLD, help="as in `perfgate ab`")
    p.add_argument("--confidence", type=ab_cmd.confidence, default=ab_stats.DEFAULT_CONFIDENCE,
                   help="as in `perfgate ab`")
    p.add_argument("--save", type=output_file, help="write the counts as JSON here (rewritten after every A/B)")
    p.add_argument("--keep", type=output_folder, help="keep every round's results JSON under this folder")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root; pytest runs here")
    p.add_argument("--hardware-id", help="passed to pytest as --perf-hardware-id")
    p.add_argument("--time-limit", type=ab_cmd.time_limit, metavar="SECONDS",
                   help="start no A/B (and no round) that the pace so far says cannot finish in this many seconds "
                        "from the start; what is done is saved with \"complete\": false, exit 3")
    p.add_argument("--against-baselines", action="store_true",
                   help="measure the gate instead of `perfgate ab`: each repeat is one pytest run judged against "
                        "the committed baselines, as CI runs it (perfgate/commands/gate_power.py)")
    p.add_argument("--tally", nargs="*", metavar="COUNTS|RUN",
                   help="measure nothing: add up counts files written by --save (several sessions of one "
                        "selection), or count the gate's verdicts in runs (results files, or runs in the results "
                        "store by sha256 or <hardware-id>/<name>; none named: every stored run of --hardware-id)")
    add_store_option(p, what="with --tally: where a RUN that is not a file is found")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="tests and pytest options")
    p.set_defaults(func=run)


@dataclass
class Tally:
    """One metric under one condition over the repeats."""

    regressions: int = 0
    runs: int = 0
    changes: list[float] = field(default_factory=list)
    outcomes: list[str] = field(default_factory=list)  # each A/B's verdict, in order
    intervals: list[list[float] | None] = field(default_factory=list)  # each A/B's worsening interval
    # each A/B's B/A of every round, in round order: what tells a drift within an A/B (a server's first
    # minutes, a clock settling) from noise; None where a file predates them
    round_ratios: list[list[float] | None] = field(default_factory=list)

    def add(self, r: MetricResult) -> None:
        self.runs += 1
        self.regressions += r.outcome == "regression"
        self.outcomes.append(r.outcome)
        self.intervals.append(r.verdict.get("change_ci"))
        self.round_ratios.append(r.verdict.get("ratios"))
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


def knob_env(args: argparse.Namespace, factor: float) -> dict[str, str]:
    """The environment of B for one slowdown factor (> 1, the nominal cost)."""
    if args.knob:
        return {args.knob: f"{factor:g}"}
    m = mutations.MUTATIONS.get(slowed_with(args))
    if m is None or not m.graded:
        graded = ", ".join(sorted(n for n, x in mutations.MUTATIONS.items() if x.graded))
        raise ValueError(f"--mutation {args.mutation!r}: not a graded mutation; graded ones: {graded}")
    # the knob's own scale: neutral 1 (a multiplier) keeps k, neutral 0 (extra work) takes k - 1
    value = round(factor - 1 + m.neutral_factor, 6)
    if not value < m.max_factor:
        raise ValueError(f"--slowdowns: {factor:g} is beyond {m.name}'s range (< {m.max_factor:g})")
    return {mutations.ENV: f"{m.name}:{value:g}"}


def slowed_with(args: argparse.Namespace) -> str:
    """The knob of the slowdowns: ``--knob``'s variable, else ``--mutation``'s name, else the default mutation."""
    return args.knob or args.mutation or DEFAULT_MUTATION


def b_env_at(pairs: list[str], slowdowns: list[float]) -> dict[float, dict[str, str]]:
    """``--b-env-at FACTOR:K=V`` -> {factor: {K: V}}; every factor must be one of ``--slowdowns``."""
    out: dict[float, dict[str, str]] = {}
    for pair in pairs:
        head, sep, kv = pair.partition(":")
        try:
            factor = float(head)
        except ValueError:
            factor = math.nan
        if not sep or factor not in slowdowns:
            raise ValueError(f"--b-env-at {pair!r}: expected FACTOR:KEY=VALUE with FACTOR one of --slowdowns "
                             f"({', '.join(f'{k:g}' for k in slowdowns)})")
        out.setdefault(factor, {}).update(ab_cmd.parse_env([kv], "b", f"--b-env-at {head}:"))
    return out


def _finite(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{where}: {value!r} is not a finite number")
    return float(value)


def _count(value, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{where}: {value!r} is not a count")
    return value


def load_counts(path: Path) -> dict:
    """A counts file of ``--save``, every field :func:`merge_counts` reads checked (numbers finite)."""
    try:
        doc = json.loads(Path(path).read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: not JSON ({exc.msg} at line {exc.lineno}); expected a counts file of "
                         f"`perfgate power --save`") from None
    if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), list) or not isinstance(
            doc.get("conditions"), dict):
        raise ValueError(f"{path}: not a counts file of `perfgate power --save` (no metrics or conditions)")
    for key in _SAME_IN_EVERY_FILE:
        if key not in doc:
            raise ValueError(f"{path}: no {key!r}: not a counts file of `perfgate power --save`")
    for cond, env in doc["conditions"].items():
        if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ValueError(f"{path}: conditions[{cond!r}]: expected the variables B ran with (names to values), "
                             f"got {env!r}"[:300])
    _count(doc["rounds"], f"{path}: rounds")
    _finite(doc["threshold"], f"{path}: threshold")
    for i, m in enumerate(doc["metrics"]):
        where = f"{path}: metrics[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("test_id"), str) or not isinstance(m.get("metric"), str):
            raise ValueError(f"{where}: no test_id and metric")
        for cond in doc["conditions"]:
            c = m.get(cond)
            if c is None:
                continue
            if not isinstance(c, dict):
                raise ValueError(f"{where}.{cond}: not a tally")
            runs, regressions = _count(c.get("runs"), f"{where}.{cond}.runs"), _count(
                c.get("regressions"), f"{where}.{cond}.regressions")
            if "outcomes" not in c and runs <= 1:  # written before the verdicts were kept: one A/B, its mean
                mean = c.get("mean_change")
                c.update(outcomes=["regression" if regressions else "not a regression"] * runs,
                         changes=[] if mean is None else [_finite(mean, f"{where}.{cond}.mean_change")] * runs,
                         intervals=[None] * runs)
            outcomes, changes, intervals = c.get("outcomes"), c.get("changes"), c.get("intervals")
            if not (isinstance(outcomes, list) and isinstance(changes, list) and isinstance(intervals, list)) or \
                    len(outcomes) != runs or len(intervals) != runs or len(changes) > runs or regressions > runs:
                raise ValueError(f"{where}.{cond}: outcomes, changes and intervals do not match runs={runs}")
            if regressions != sum(o == "regression" for o in outcomes):
                raise ValueError(f"{where}.{cond}: regressions={regressions} but the outcomes hold "
                                 f"{sum(o == 'regression' for o in outcomes)}")
            for j, x in enumerate(changes):
                _finite(x, f"{where}.{cond}.changes[{j}]")
            for j, ci in enumerate(intervals):
                if ci is not None and not (isinstance(ci, list) and len(ci) == 2):
                    raise ValueError(f"{where}.{cond}.intervals[{j}]: {ci!r} is not [low, high]")
                for x in ci or ():
                    _finite(x, f"{where}.{cond}.intervals[{j}]")
            ratios = c.setdefault("round_ratios", [None] * runs)  # written before they were kept: not known
            if not isinstance(ratios, list) or len(ratios) != runs:
                raise ValueError(f"{where}.{cond}.round_ratios: expected one list of B/A per A/B run ({runs})")
            for j, rr in enumerate(ratios):
                if rr is not None and not isinstance(rr, list):
                    raise ValueError(f"{where}.{cond}.round_ratios[{j}]: {rr!r} is not a list of B/A")
                for x in rr or ():
                    if not _finite(x, f"{where}.{cond}.round_ratios[{j}]") > 0:
                        raise ValueError(f"{where}.{cond}.round_ratios[{j}]: B/A {x!r} is not above 0")
    return doc


# plugins whose absence does not change what a run measures: pytest's cache of last failures, and
# hypothesis's reporting (the serving power script drops it: ~1 s of imports at each run's end)
_UNMEASURED_PLUGINS = ("no:cacheprovider", "no:hypothesispytest")


def _comparable(key: str, value):
    """``-p no:cacheprovider`` and ``-p no:hypothesispytest`` are not a difference between two selections."""
    if key != "pytest_args" or not isinstance(value, list):
        return value
    out, i = [], 0
    while i < len(value):
        if value[i] == "-p" and i + 1 < len(value) and value[i + 1] in _UNMEASURED_PLUGINS:
            i += 2
            continue
        out.append(value[i])
        i += 1
    return out


def merge_counts(docs: list[dict], names: list[str]) -> tuple[dict, dict[tuple[str, str], dict[str, Tally]]]:
    """Counts files of one selection -> (the first file's header, the tallies added up)."""
    first = docs[0]
    for doc, name in zip(docs[1:], names[1:]):
        for key in _SAME_IN_EVERY_FILE:
            if _comparable(key, doc[key]) != _comparable(key, first[key]):
                raise ValueError(f"{name}: {key} {doc[key]!r} is not {names[0]}'s {first[key]!r}: the files measured "
                                 f"different things and cannot be added up")
    counts: dict[tuple[str, str], dict[str, Tally]] = {}
    for doc in docs:
        for m in doc["metrics"]:
            for cond in first["conditions"]:
                c = m.get(cond)
                if c is None:
                    continue
                t = counts.setdefault((m["test_id"], m["metric"]), {}).setdefault(cond, Tally())
                t.runs += c["runs"]
                t.regressions += c["regressions"]
                t.outcomes += c["outcomes"]
                t.changes += [float(x) for x in c["changes"]]
                t.intervals += c["intervals"]
                t.round_ratios += c["round_ratios"]
    return first, counts


def _print_table(counts: dict[tuple[str, str], dict[str, Tally]], conditions, title: str) -> None:
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
    for line in render(columns, rows, width=stdout_width(), title=title):
        print(line.text)
    print("cells: regression verdicts / A/B runs (mean measured worsening of B against A)")


def slowed_by(conditions: dict[str, dict[str, str]]) -> str:
    """What gave B its slowdowns, as the counts file records the conditions: the knob's variable, or the
    variable --b-env-at set (a planted server's URL) -- not the --knob default that no A/B used."""
    names = {f"{key} by --b-env-at" if value == "(--b-env-at)" else key
             for cond, env in conditions.items() if cond != "A = A" for key, value in env.items()}
    return ", ".join(sorted(names)) or "A = A only"


def _is_counts_file(name: str) -> bool:
    """A counts file of --save (anything else named to --tally is a run: a results file or a stored run)."""
    path = Path(name)
    if not path.is_file() or name.endswith(".gz"):
        return False
    try:
        doc = json.loads(path.read_text())
    except (ValueError, OSError):
        return True  # load_counts says what is wrong with it
    return not (isinstance(doc, dict) and doc.get("kind") == "perfgate-results")


def tally_runs(args: argparse.Namespace) -> int:
    """--tally RUN...: the gate's verdicts in runs already judged, counted as --against-baselines counts them."""
    names = list(args.tally)
    if not names:
        if args.hardware_id is None:
            raise ValueError("--tally with no files counts every stored run of one machine: add --hardware-id ID "
                             "(and --store STORE), or name counts files or runs")
        check_hardware_id(args.hardware_id, source="--hardware-id")
        names = run_store.runs_of(args.store, args.hardware_id)
        if not names:
            raise ValueError(f"no runs of {args.hardware_id} in the results store {describe(spec_of(args.store))}")
    runs = run_store.load_runs(names, args.store)
    tally = gate_power.tally_runs(runs)
    when = sorted(r.doc.get("created") or "" for r in runs)
    tally.print_table(f"perfgate power --tally: {len(runs)} run(s) judged by the gate, {when[0][:10]} to "
                      f"{when[-1][:10]}")
    if args.save:
        write_json_atomic(args.save, {**tally.document([], len(runs), len(runs)), "tallied_from": [r.name for r in runs]})
        print(f"saved {args.save}")
    return 0


def tally_files(args: argparse.Namespace) -> int:
    counts_files = [_is_counts_file(str(name)) for name in args.tally]
    if not args.tally or not all(counts_files):
        if any(counts_files):
            raise ValueError("--tally adds up counts files or counts runs, not both in one table")
        return tally_runs(args)
    names = [str(p) for p in args.tally]
    first, counts = merge_counts([load_counts(p) for p in args.tally], names)
    ab_runs = sum(c.runs for by_cond in counts.values() for c in by_cond.values()) // max(len(counts), 1)
    _print_table(counts, first["conditions"],
                 f"perfgate power: {len(names)} counts file(s), {ab_runs} A/Bs x {first['rounds']} rounds, threshold "
                 f"{first['threshold'] * 100:g}% ({slowed_by(first['conditions'])}; {shlex.join(first['pytest_args'])})")
    if args.save:
        write_json_atomic(args.save, {**{k: first[k] for k in _SAME_IN_EVERY_FILE}, "tallied_from": names,
                                      "ab_runs_done": ab_runs, "complete": True,
                                      "metrics": _metrics_section(counts)})
        print(f"saved {args.save}")
    return 0


def _metrics_section(counts: dict[tuple[str, str], dict[str, Tally]]) -> list[dict]:
    return [{"test_id": test, "metric": metric,
             **{cond: {"regressions": c.regressions, "runs": c.runs, "mean_change": c.mean_change,
                       "changes": c.changes, "outcomes": c.outcomes, "intervals": c.intervals,
                       "round_ratios": c.round_ratios}
                for cond, c in by_cond.items()}} for (test, metric), by_cond in sorted(counts.items())]


def schedule(repeats: int, aa_repeats: int, conditions) -> list[tuple[int, str]]:
    """(repeat, condition) of every A/B in order: each repeat runs A = A (while ``aa_repeats`` last) and
    then every slowdown, so a run cut short holds both kinds, and a later session can ask for just the
    A = A runs its tally still lacks."""
    return [(rep, cond) for rep in range(max(repeats, aa_repeats)) for cond in conditions
            if rep < (aa_repeats if cond == "A = A" else repeats)]


def _document(args, pytest_args, conditions, base: dict[str, str], counts, done: int, total: int,
              stopped: str | None = None) -> dict:
    return {"repeats": args.repeats, "aa_repeats": args.repeats if args.aa_repeats is None else args.aa_repeats,
            "rounds": args.rounds, "threshold": args.threshold,
            "knob": slowed_with(args), "conditions": conditions, "pytest_args": pytest_args,
            **({"env": base} if base else {}),
            **({"b_env_at": args.b_env_at} if args.b_env_at else {}),
            "ab_runs_done": done, "ab_runs_planned": total, "complete": done == total,
            **({"stopped": stopped} if stopped else {}),
            "metrics": _metrics_section(counts)}


def next_ab_fits(durations: list[float], left_s: float) -> bool:
    """Whether another A/B fits in ``left_s``, at the mean pace of the A/Bs done (the first always starts:
    its rounds are checked one by one)."""
    return not durations or sum(durations) / len(durations) <= left_s


def run(args: argparse.Namespace) -> int:
    if args.store and args.tally is None:
        raise ValueError("--store names where --tally finds runs; `perfgate power` measures its own")
    if args.tally is not None:
        if args.pytest_args:
            raise ValueError("--tally adds up saved counts and measures nothing: give it no tests")
        if args.against_baselines:
            raise ValueError("--tally adds up the counts files of A/Bs; --against-baselines writes its own")
        return tally_files(args)
    aa_repeats = args.repeats if args.aa_repeats is None else args.aa_repeats
    if args.repeats == 0 and aa_repeats == 0:
        raise ValueError("nothing to measure: --repeats 0 needs --aa-repeats N >= 1 (A = A runs only)")
    slowdowns = parse_slowdowns(args.slowdowns)
    pytest_args = ab_cmd.split_args(list(args.pytest_args), _OWN_OPTIONS, "power")
    root = args.root.resolve()
    python = sys.executable
    base = ab_cmd.parse_env(args.env, "a", "--env")
    planted = b_env_at(args.b_env_at, slowdowns)
    # What the counts file says of each condition (``recorded``): a --b-env-at value (a server's URL, its
    # port new each start) is named, not kept, so the counts of several sessions add up (--tally);
    # "b_env_at" keeps it.
    conditions, recorded = {"A = A": {}}, {"A = A": {}}
    for k in slowdowns:
        name = f"x{k:g}"
        conditions[name] = planted.get(k) or knob_env(args, k)
        recorded[name] = {key: "(--b-env-at)" for key in planted[k]} if k in planted else conditions[name]
    per_condition: dict[str, list[list[MetricResult]]] = {c: [] for c in conditions}
    plan = schedule(args.repeats, aa_repeats, conditions)
    if args.against_baselines:  # the gate as CI runs it, one pytest run a repeat, not an A/B
        return gate_power.run(args, pytest_args, {c: {**base, **env} for c, env in conditions.items()}, plan)
    total = len(plan)
    deadline = time.monotonic() + args.time_limit if args.time_limit else None
    durations: list[float] = []
    stopped = None
    done = 0
    for done, (rep, cond) in enumerate(plan):
        if deadline is not None and not next_ab_fits(durations, deadline - time.monotonic()):
            stopped = (f"stopped by --time-limit before A/B {done + 1} of {total}: one A/B took "
                       f"~{sum(durations) / len(durations):.0f} s, {max(deadline - time.monotonic(), 0):.0f} s were left")
            break
        env = conditions[cond]
        shown = " ".join(f"{k}={v}" for k, v in env.items()) or "B = A"
        if base:
            shown += "; both: " + " ".join(f"{k}={v}" for k, v in base.items())
        print(f"repeat {rep + 1}/{max(args.repeats, aa_repeats)}, {cond} ({shown}), A/B {done + 1}/{total}:",
              file=sys.stderr)
        keep = args.keep / f"repeat{rep + 1}-{'AeqA' if not env else cond}" if args.keep else None
        start = time.monotonic()
        try:
            docs, _ = ab_cmd.measure({"a": (python, dict(base)), "b": (python, {**base, **env})}, args.rounds,
                                     pytest_args, root=root,
                                     hardware_id=args.hardware_id, keep=keep, deadline=deadline)
        except ab_cmd.OutOfTime as exc:
            stopped = f"stopped by --time-limit in A/B {done + 1} of {total} (not counted): {exc}"
            break
        durations.append(time.monotonic() - start)
        per_condition[cond].append(ab_cmd.compare(docs["a"], docs["b"], threshold=args.threshold,
                                                  confidence=args.confidence, rerun=""))
        if args.save:
            write_json_atomic(args.save, _document(args, pytest_args, recorded, base, tally(per_condition),
                                                   done + 1, total))
    else:
        done = total
    if stopped:
        print(f"perfgate power: {stopped}", file=sys.stderr)
        if args.save:  # the reason goes into the file too; its counts are those of the last A/B written
            write_json_atomic(args.save, _document(args, pytest_args, recorded, base, tally(per_condition),
                                                   done, total, stopped))
    _print_table(tally(per_condition), conditions,
                 f"perfgate power: {args.repeats} repeats x {args.rounds} rounds, threshold {args.threshold * 100:g}%"
                 + (f" ({done} of {total} A/Bs: stopped by --time-limit)" if stopped else ""))
    if args.save:
        print(f"saved {args.save}")
    return 3 if stopped else 0
