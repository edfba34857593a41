"""`perfgate refresh RUN...`: turn a run's results into baselines, after review.

A RUN is a results file (`pytest --perf-save`) or a run of the results store (``--store``; by its sha256,
a 12+ digit prefix of it, or ``<hardware-id>/<name>``: perfgate.store.run_store.load_runs), and the
baseline names each pooled run as the store does, by name and hash.

Shows old vs new per metric with provenance and software versions, then writes only
after confirmation (or --yes). It writes only the results' own hardware id folder, so
a machine change creates a new folder and leaves every other one untouched; the file it
replaces is kept as ``<area>.json.prev``.

Several results files are pooled (perfgate.judge.pooling.pool), each metric keeping one summary
per run for the between-run noise model; a gated metric whose run medians disagree beyond
its tolerance stops the refresh with the runs side by side (``--force`` pools them anyway),
``--test``/``--metric`` take only the named figures of the runs (the rest of the baselines stay as
they are: what a harness fix that changed one metric's meaning re-measures), runs from an uncommitted tree need ``--allow-dirty``, an interrupted run ``--allow-interrupted`` (its
file holds only the tests that finished), and replacing a baseline of another
workload needs ``--allow-other-workload``: the checks of perfgate.store.baseline_writer, the
same on every path that writes baselines. A baselines folder that does not exist is created
only where it is named (``--baselines`` or ``[tool.perfgate]``). Names from the files are
shown escaped (a control character in an id cannot rewrite the terminal).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path


from perfgate.commands.store import add_store_option
from perfgate.store.settings import load_settings
from perfgate.report.textable import printable
from perfgate.store import baseline_writer, run_store
from perfgate import interrupts
from perfgate.commands.confirm import confirmed
from perfgate.store.baseline_writer import Checks
from perfgate.store.baselines import BaselineStore
from perfgate.judge.fingerprint_check import compare as compare_fingerprints, workload_changes
from perfgate.report.run_report import fmt_number
from perfgate.judge.metric_result import short_id
from perfgate.report.textable import Column, render, stdout_width, wrap_words


def register(sub) -> None:
    p = sub.add_parser("refresh", help="write baselines from a results file (shows a diff first)")
    p.add_argument("results", nargs="+", metavar="RUN",
                   help="results JSON written by `pytest --perf-save`, or a run in the results store (--store) by "
                        "its sha256, a 12+ digit prefix or <hardware-id>/<name>; several runs of one id are pooled")
    add_store_option(p, what="where a RUN that is not a file is found")
    p.add_argument("--baselines", type=Path,
                   help="baseline folder (default: [tool.perfgate] baselines; created if named here)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--yes", "-y", action="store_true", help="write without asking")
    baseline_writer.add_check_options(p.add_argument, baseline_writer.CHECK_FLAGS)
    p.add_argument("--test", dest="tests", action="append", default=[], metavar="TEXT",
                   help="take only tests whose id contains TEXT (repeatable; plain text, not a pattern)")
    p.add_argument("--metric", dest="metrics", action="append", default=[], metavar="GLOB",
                   help="take only metrics matching GLOB (repeatable): re-measured figures replace theirs, "
                        "every other baseline stays as it is")
    p.set_defaults(func=run)


def _software_line(sw: dict | None) -> str:
    if not sw:
        return "?"
    return ", ".join(f"{k} {v}" for k, v in sw.items() if v and k in ("torch", "nccl", "driver", "cuda_driver",
                                                                        "vllm", "megatron_core", "python"))


def _diff_table(rows: list[list[str]], provenances: list[str], *, width: int, title: str) -> list[str]:
    """Old vs new per metric. A provenance shared by every row (one earlier refresh wrote
    them all) is said once above the table instead of in a column of identical text."""
    columns = [Column("test", fold=True, group=True), Column("metric", fold=True), Column("old", "right"),
               Column("new", "right"), Column("unit"), Column("change", "right"), Column("runs", "right")]
    head = [title]
    if len(set(provenances)) == 1:
        head.append(f"  old provenance (every row): {provenances[0]}")
    else:
        columns.append(Column("old provenance", fold=True))
        rows = [row + [prov] for row, prov in zip(rows, provenances)]
    lines = [t for h in head for t in wrap_words(h, width, "    ")]
    return lines + [line.text for line in render(columns, rows, width=width)]


def run(args: argparse.Namespace) -> int:
    runs = run_store.load_runs(args.results, args.store)
    names, docs = [r.name for r in runs], [r.doc for r in runs]
    checks = Checks.of(lambda name: getattr(args, name.replace("-", "_")), baseline_writer.CHECK_FLAGS)
    refs = [r.reference for r in runs]
    # the id's committed table judges whether the runs agree (as its sessions will judge them)
    settings = load_settings(args.root, args.baselines, hardware_id=docs[0]["hardware_id"])
    try:
        plan = baseline_writer.plan_from_results(docs, names, checks, say=baseline_writer.stderr, refs=refs,
                                                 settings=settings, tests=tuple(args.tests),
                                                 metrics=tuple(args.metrics))
    except baseline_writer.RunsDisagree as exc:
        for line in _disagreement_table(exc.clash, names, [r["sha256"] for r in refs], width=stdout_width()):
            print(line)
        print(exc, file=sys.stderr)
        return 1
    hw, doc = plan.hardware_id, plan.doc
    if not plan.by_area:
        why = (f"no metric of {', '.join(names)} matches --test {args.tests or 'any'} --metric {args.metrics or 'any'}"
               if (args.tests or args.metrics) and (doc.get("results") or []) else _why_nothing(doc, ', '.join(names)))
        print(printable(f"perfgate refresh: nothing written: {why}"), file=sys.stderr)
        return 1
    store = baseline_writer.store_for_writing(settings, named=args.baselines is not None,
                                              pyproject=Path(args.root) / "pyproject.toml")
    baseline_writer.check_machine(store, hw, plan.fingerprint, plan.by_area, checks)  # before the question
    width = stdout_width()

    def say(text: str) -> None:
        for line in wrap_words(text, width, "    "):
            print(line)

    others = [printable(h) for h in store.hardware_ids() if h != hw]
    if hw not in store.hardware_ids():
        say(f"hardware id {hw} has no baselines yet: a new folder {store.root / hw} will be created; existing "
            f"folders ({', '.join(others) or 'none'}) stay untouched")
    for area, entries in sorted(plan.by_area.items()):
        _review_area(store, hw, area, entries, doc, width=width, say=say)
    say(f"  new software: {_software_line((doc.get('fingerprint') or {}).get('software'))}; "
        f"commit {printable(str(doc.get('commit')))}, measured {printable(str(doc.get('created')))}")
    if not confirmed(args.yes, f"write {plan.count} metric(s) to {store.root / hw}?"):
        return 1
    baseline_writer.write_plan(store, plan, checks, wrote=lambda path, prev: interrupts.say_while_writing(
        f"wrote {path}" + (f" (previous kept as {path.name}.prev)" if prev else "")))
    return 0


def _review_area(store: BaselineStore, hw: str, area: str, entries: dict, doc: dict, *, width: int, say) -> None:
    """Old vs new for one area, with what the old numbers were measured on where it differs."""
    old = store.load(hw, area)
    old_doc = store.document(hw, area)
    rows, provenances = [], []
    changed_workloads: dict[str, set[str]] = {}  # what changed -> tests
    for test, metrics in sorted(entries.items()):
        for name, new in sorted(metrics.items()):
            prev = old.get(test, {}).get(name)
            moved = workload_changes(prev.workload if prev else None, new.workload)
            if moved:
                changed_workloads.setdefault(moved, set()).add(short_id(test))
            change = "new"
            if prev is not None and prev.summary.median:
                change = f"{(new.summary.median / prev.summary.median - 1) * 100:+.1f}%"
            provenances.append(printable(f"{prev.provenance}, {prev.when}, {prev.commit}") if prev else "-")
            rows.append([printable(short_id(test)), printable(name), fmt_number(prev.summary.median if prev else None),
                         fmt_number(new.summary.median), printable(new.unit), change, str(len(new.runs))])
    print()
    for line in _diff_table(rows, provenances, width=width, title=printable(f"{hw}/{area}.json")):
        print(line)
    old_sw = ((old_doc.get("fingerprint") or {}).get("software")) if old_doc else None
    if old_sw:
        say(f"  old software: {_software_line(old_sw)}")
    if old_doc and old_doc.get("fingerprint"):
        moved = compare_fingerprints(old_doc["fingerprint"], doc.get("fingerprint") or {}).relevant
        if moved:
            say(printable(f"  the old numbers were measured on a machine that differs in: {'; '.join(moved)}"))
    for moved, tests in sorted(changed_workloads.items()):
        say(printable(f"  the old numbers of {len(tests)} test(s) ({', '.join(sorted(tests))}) measured another "
                      f"workload: {moved}"))


def _why_nothing(doc: dict, names: str) -> str:
    """One line: why a results document gives no baseline entry, and what to do."""
    results = doc.get("results") or []
    if not results:
        return (f"{names} holds no metrics (no selected test recorded one); run tests that use the perf "
                f"fixture with --perf-save")
    reasons = sorted({t for r in results for t in (r.get("tainted") or [])})
    if not reasons:
        return f"every metric in {names} measured nothing (left out above); re-measure"
    return (f"all {len(results)} metric(s) in {names} are tainted ({'; '.join(reasons)}): measured on a busy "
            f"machine, so not baseline material; re-run on a quiet machine, or pass --include-tainted")


def _disagreement_table(clash: list[dict], files: list[str], hashes: list[str], *, width: int) -> list[str]:
    """The run medians of each refused metric side by side, one column per results file (found by its hash)."""
    columns = [Column("test", fold=True, group=True), Column("metric", fold=True), Column("unit"),
               Column("tol", "right"), *(Column(f"run {i + 1}", "right") for i in range(len(files)))]
    rows = []
    for r in clash:
        median = {x.get("sha256"): x["median"] for x in r["runs"]}
        tol = f"{r['tol']:.3f}" if r["unit"] == "fraction" else f"{r['tol'] * 100:.0f}%"
        rows.append([printable(short_id(r["test_id"])), printable(r["metric"]), printable(r["unit"]), tol,
                     *(fmt_number(median.get(h)) for h in hashes)])
    legend = [f"  run {i + 1}: {printable(f)}" for i, f in enumerate(files)]
    return ["runs that disagree beyond tolerance (not pooled)", *legend,
            *(line.text for line in render(columns, rows, width=width))]
