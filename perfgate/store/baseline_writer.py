"""The one way baselines are written: the same checks on every path, then the writes.

``pytest --perf-refresh``, ``perfgate refresh``, ``perfgate calibrate --write`` and
``perfgate import`` all build a :class:`Plan` here and write it with :func:`write_plan`;
none of them calls ``BaselineStore.write`` itself. So each refuses the same things, in one
line naming the file, test and metric, with nothing written:

- results of an interrupted run (unless ``perfgate refresh --allow-interrupted``: its file holds only
  the tests that finished), of a ``perfgate ab`` comparison, or measured with a test-only
  mutation or slowdown knob on (perfgate.mutations);
- results measured on a tree with uncommitted changes (commit ``...-dirty-<hash>``), unless
  allowed (``--allow-dirty`` / ``--perf-allow-dirty``);
- runs of another hardware id or another workload pooled together (perfgate.judge.pooling.pool),
  and gated metrics whose run medians disagree beyond the tolerance stored with them (unless
  ``--force``);
- replacing a baseline that measured another workload (another model or engine flags under the
  same test id), unless allowed (``--allow-other-workload`` / ``--perf-allow-other-workload``);
- any number that is not finite (every sample 1e308 has the median inf; a NaN in a seed table), or of a
  sign its unit does not allow (a negative duration, a subnormal anything: perfgate.judge.signs); a
  duration, rate or bandwidth whose every sample is 0 is left out of a refresh, with a line saying so.

Stored samples are a summary of at most MAX_STORED_SAMPLES per metric (metrics.stored_samples: a
results file with 50 million samples must not become an 850 MB baseline), and a file given twice is
pooled once.
"""
from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import sys
from pathlib import Path
from typing import Callable

from perfgate import mutations
from perfgate.judge import run_noise, signs
from perfgate.judge.fingerprint_check import compare, workload_changes
from perfgate.judge.metric_result import short_id
from perfgate.store import locks
from perfgate import interrupts
from perfgate.judge import pooling
from perfgate.machine.hardware_id import parse_hardware_id
from perfgate.store.baselines import BaselineStore
from perfgate.judge.baseline_entry import BaselineEntry

ByArea = dict[str, dict[str, dict[str, BaselineEntry]]]


class WriteRefused(ValueError):
    """A check refused the write; one line: what, where, and the option or fix."""


class RunsDisagree(WriteRefused):
    """Gated metrics whose run medians disagree beyond their tolerance; ``clash`` has them."""

    def __init__(self, message: str, clash: list[dict]):
        super().__init__(message)
        self.clash = clash


# The checks a caller may be allowed past, defined once: each front door offers the ones it can meet under
# its own prefix (`perfgate refresh --force`, `pytest --perf-allow-dirty`) with these words
# (:func:`add_check_options`), and reads them back into :class:`Checks` (:meth:`Checks.of`).
CHECK_FLAGS = {
    "include-tainted": "also take metrics measured on a busy machine",
    "force": "pool runs even where their medians disagree beyond the tolerance",
    "allow-dirty": "accept runs measured on a tree with uncommitted changes (the commit ends in -dirty-<diff hash>, "
                   "recorded as provenance)",
    "allow-other-machines": "pool runs whose machines differ in compared fingerprint fields (cores, ISA, GPU "
                            "settings; the baseline keeps the newest run's fingerprint), and write runs of a "
                            "machine of another id (an AVX2 run labelled with an AVX-512 id) into this id's folder",
    "allow-other-workload": "replace stored baselines that measured another workload (model, engine flags)",
    "allow-interrupted": "take the finished tests of a run that was stopped early (by a time limit or a signal): "
                         "its results hold only the tests that ran to the end",
}
# what a session's --perf-refresh can be allowed past (it measures one run of one machine: nothing to force or
# pool, and an interrupted session refreshes nothing)
SESSION_CHECKS = ("allow-dirty", "allow-other-workload")


def add_check_options(add: Callable[..., object], names, *, prefix: str = "--", when: str = "") -> None:
    """Offer the checks ``names`` of CHECK_FLAGS through ``add`` (argparse's ``add_argument`` or pytest's
    ``addoption``), each as ``<prefix><name>``; ``when`` opens each help text ("with --write: ")."""
    for name in names:
        add(f"{prefix}{name}", action="store_true", help=when + CHECK_FLAGS[name])


@dataclasses.dataclass(frozen=True)
class Checks:
    """What the caller allows beyond the defaults, and its option names (for the messages)."""

    allow_dirty: bool = False
    force: bool = False
    include_tainted: bool = False
    allow_other_workload: bool = False
    allow_interrupted: bool = False  # refresh only: the finished tests of a run cut short
    # pool runs whose machines differ in compared fields; write runs of a machine of another id (machine_of_another_id)
    allow_other_machines: bool = False
    prefix: str = "--"  # "--perf-" in a pytest session: --perf-allow-dirty

    @classmethod
    def of(cls, given: Callable[[str], object], names, *, prefix: str = "--", **fixed: bool) -> "Checks":
        """The checks ``names`` as the user gave them (``given(name)``: an option's value), and ``fixed``
        ones a front door always allows (calibrate pools disagreeing runs by design: ``force=True``)."""
        return cls(**{n.replace("-", "_"): bool(given(n)) for n in names}, **fixed, prefix=prefix)

    def option(self, name: str) -> str:
        if name in ("force", "allow-other-machines") and self.prefix == "--perf-":  # refresh's; a session saves
            return f"--perf-save and then `perfgate refresh --{name}` on the saved file"
        return f"{self.prefix}{name}"


@dataclasses.dataclass
class Plan:
    """What will be written: entries per area for one hardware id, and where they came from."""

    hardware_id: str
    by_area: ByArea
    fingerprint: dict | None
    source: str
    doc: dict | None = None  # the (pooled) results document, for refresh's review

    @property
    def count(self) -> int:
        return sum(len(m) for tests in self.by_area.values() for m in tests.values())


def check_documents(docs: list[dict], names: list[str], checks: Checks) -> None:
    """The refusals that results documents earn by what they say about their runs: each run's own, then
    the set's (machines that differ, :func:`other_machines`)."""
    for name, d in zip(names, docs):
        if d.get("interrupted") and not checks.allow_interrupted:
            raise WriteRefused(f"{name} comes from an interrupted run; re-run to completion before refreshing, or "
                               f"pass {checks.option('allow-interrupted')} to take the tests that finished (the "
                               f"file holds no other)")
        if d.get(mutations.RESULTS_KEY):
            mark = d[mutations.RESULTS_KEY]
            raise WriteRefused(f"{name} was measured with planted bugs ({mark.get('note') or mark.get('names')}); "
                               f"re-run without the test-only mutation variables ({mutations.ENV} and the older "
                               f"knobs, perfgate/mutations.py) before refreshing")
        if d.get("ab"):
            raise WriteRefused(f"{name} is a `perfgate ab` comparison (per-round medians of two environments), not "
                               f"a run; refresh from `pytest --perf-save` results")
    dirty = [f"{n} (commit {d.get('commit')})" for n, d in zip(names, docs) if "-dirty" in (d.get("commit") or "")]
    if dirty and not checks.allow_dirty:
        raise WriteRefused(f"measured on an uncommitted tree: {', '.join(dirty)}; commit and re-run, or pass "
                           f"{checks.option('allow-dirty')} to record the dirty tree's commit and diff hash as "
                           f"provenance")
    mixed = other_machines(docs, names)
    if mixed and not checks.allow_other_machines:
        raise WriteRefused(f"not written: the runs come from machines that differ where the gate compares them "
                           f"({'; '.join(mixed)}); a baseline keeps one machine's fingerprint, so pool the runs of "
                           f"one machine, or pass {checks.option('allow-other-machines')} to pool them anyway")


def distinct(docs: list[dict], names: list[str], say: Callable[[str], object]) -> tuple[list[dict], list[str]]:
    """The documents with each content once: a file given twice is one run, not two that agree."""
    seen: dict[str, str] = {}
    kept_docs, kept_names = [], []
    for d, n in zip(docs, names):
        key = json.dumps(d, sort_keys=True)
        if key in seen:
            say(f"{n} has the same content as {seen[key]}: pooled once")
            continue
        seen[key] = n
        kept_docs.append(d)
        kept_names.append(n)
    return kept_docs, kept_names


def other_machines(docs: list[dict], names: list[str]) -> list[str]:
    """``run: cpu.cores 32 -> 16 (newest.json)`` for each run whose machine differs from the newest run's
    in a field the gate compares (perfgate.judge.fingerprint_check). A pooled baseline stores the newest
    run's fingerprint: runs of another machine in it would be judged as if measured on that one."""
    if len(docs) < 2:
        return []
    last = pooling.newest(docs)
    ref, last_name = last.get("fingerprint") or {}, names[next(i for i, d in enumerate(docs) if d is last)]
    out = []
    for doc, name in zip(docs, names):
        if doc is last or not doc.get("fingerprint") or not ref:
            continue
        fields = compare(doc["fingerprint"], ref).relevant
        if fields:
            shown = ", ".join(f.replace(" (baseline) ->", " ->").replace(" (here)", "") for f in fields)
            out.append(f"{name}: {shown} ({last_name})")
    return out


def disagreeing(by_area: ByArea, ungated: set[tuple[str, str]], settings=None) -> list[dict]:
    """Gated entries pooled from runs whose medians would fail against one another at their tolerance.

    ``settings`` (perfgate.judge.config.Settings of the hardware id, as its sessions will read them):
    the committed table decides, not the one the runs were measured under, so a metric made
    ``[record_only]`` or given an ``[overrides]`` tolerance from these very runs is judged as the gate
    will judge it. Without it, each entry's own tol (what its runs were judged with)."""
    out = []
    for tests in by_area.values():
        for test, metrics in sorted(tests.items()):
            for metric, e in sorted(metrics.items()):
                if (test, metric) in ungated or e.tol is None or len(e.runs) < 2:
                    continue
                tol = e.tol
                if settings is not None:
                    if settings.record_only_reason(test, metric) is not None:
                        continue
                    override = settings.override_for(test, metric)
                    tol = tol if override is None else override
                if run_noise.disagree([r["median"] for r in e.runs], tol, absolute=e.unit == "fraction"):
                    out.append({"test_id": test, "metric": metric, "unit": e.unit, "tol": tol, "runs": list(e.runs)})
    return out


def _non_finite(value, key: str) -> tuple[str, object] | None:
    """The first number under ``value`` that is not finite, with its key (``summary.median``)."""
    if isinstance(value, float) and not math.isfinite(value):
        return key, value
    if isinstance(value, dict):
        children = ((f"{key}.{k}" if key else str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        children = ((f"{key}[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for child_key, v in children:
        found = _non_finite(v, child_key)
        if found:
            return found
    return None


def _sign_problem(e: BaselineEntry) -> tuple[str, str] | None:
    """The first value of ``e`` that cannot be a measurement in its unit (perfgate.judge.signs), with its key;
    or a duration, rate or bandwidth that measured nothing (every sample 0)."""
    s = e.summary
    values = [("summary.median", s.median), ("summary.min", s.min), ("summary.max", s.max), ("summary.mean", s.mean),
              *((f"summary.samples[{i}]", v) for i, v in enumerate(s.samples)),
              *((f"runs[{i}].median", r.get("median")) for i, r in enumerate(e.runs)),
              *((f"spread.run_medians[{i}]", v) for i, v in enumerate((e.spread or {}).get("run_medians") or ()))]
    for key, v in values:
        problem = signs.problem(e.unit, (v,)) if isinstance(v, (int, float)) else None
        if problem:
            return key, problem
    nothing = signs.measured_nothing(e.unit, (*s.samples, s.median))
    return ("summary.samples", nothing) if nothing else None


def checked_entries(by_area: ByArea, source: str) -> ByArea:
    """Every number finite and of a sign its unit allows (else WriteRefused naming source, test, metric and
    key); samples capped."""
    out: ByArea = {}
    for area, tests in by_area.items():
        for test, metrics in tests.items():
            for metric, e in metrics.items():
                bad = _non_finite(e.to_dict(), "")
                if bad:
                    raise WriteRefused(f"{source}: {test} {metric}: {bad[0]} is {bad[1]!r}, not a finite number "
                                       f"(a sample overflowed or a measurement failed upstream); nothing written: "
                                       f"re-measure, or fix the number at its source")
                signed = _sign_problem(e)
                if signed:
                    raise WriteRefused(f"{source}: {test} {metric}: {signed[0]}: {signed[1]}; nothing written: "
                                       f"re-measure, or fix the number at its source")
                out.setdefault(area, {}).setdefault(test, {})[metric] = e
    return out


def plan_from_entries(hardware_id: str, by_area: ByArea, *, fingerprint: dict | None, source: str,
                      doc: dict | None = None) -> Plan:
    """A plan of entries built elsewhere (calibrate's pooled runs, the seed table), checked."""
    return Plan(hardware_id, checked_entries(by_area, source), fingerprint, source, doc)


def selected(by_area: ByArea, tests: tuple[str, ...] = (), metrics: tuple[str, ...] = ()) -> ByArea:
    """The entries whose test id contains one of ``tests`` (plain text: ids hold brackets) and whose
    metric matches one of the ``metrics`` globs; an empty tuple selects all. What a refresh takes when
    only some figures are re-measured (a harness fix that changed one metric's meaning): the others keep
    their pooled baselines."""
    out: ByArea = {}
    for area, entries in by_area.items():
        for test, per_metric in entries.items():
            if tests and not any(t in test for t in tests):
                continue
            for metric, e in per_metric.items():
                if not metrics or any(fnmatch.fnmatchcase(metric, m) for m in metrics):
                    out.setdefault(area, {}).setdefault(test, {})[metric] = e
    return out


def without_nothing_measured(by_area: ByArea, say: Callable[[str], object]) -> ByArea:
    """The entries less those whose every sample is 0 of a duration, rate or bandwidth (perfgate.judge.signs):
    no baseline, said in one line each. Left out rather than refusing the run: perfgate's own runs
    record them (a p50 gap of 0 ms between tokens that arrive in one chunk), and the stored entry, if
    any, stays as it was."""
    out: ByArea = {}
    for area, tests in by_area.items():
        for test, metrics in tests.items():
            for metric, e in metrics.items():
                nothing = signs.measured_nothing(e.unit, (*e.summary.samples, e.summary.median))
                if nothing:
                    say(f"left out {short_id(test)} {metric}: {nothing}")
                    continue
                out.setdefault(area, {}).setdefault(test, {})[metric] = e
    return out


def plan_from_results(docs: list[dict], names: list[str], checks: Checks, *,
                      say: Callable[[str], object] = print, refs: list[dict] | None = None, settings=None,
                      tests: tuple[str, ...] = (), metrics: tuple[str, ...] = ()) -> Plan:
    """Results documents -> a checked plan (RunsDisagree when runs disagree and not ``force``).

    ``refs``: each document's results-store reference (perfgate.store.run_store.run_reference),
    which the baseline's run summaries record instead of a path. ``settings``: the hardware id's
    tolerance table that judges the runs' agreement (:func:`disagreeing`). ``tests``/``metrics``:
    take only those entries (:func:`selected`)."""
    check_documents(docs, names, checks)
    ref_of = dict(zip(names, refs)) if refs else {}
    docs, names = distinct(docs, names, say)
    doc = pooling.pool(docs, names, include_tainted=checks.include_tainted,
                           refs=[ref_of[n] for n in names] if refs else None)
    by_area = selected(pooling.baseline_entries(doc, include_tainted=checks.include_tainted), tests, metrics)
    by_area = without_nothing_measured(by_area, say)
    ungated = {(r["test_id"], r["metric"]) for r in doc.get("results") or [] if not r.get("gated", True)}
    clash = disagreeing(by_area, ungated, settings)
    if clash and not checks.force:
        raise RunsDisagree(f"not written: {len(clash)} gated metric(s) whose run medians disagree beyond their "
                           f"tolerance (one run would fail against another); find out why, or pass "
                           f"{checks.option('force')} to pool them anyway", clash)
    return plan_from_entries(doc["hardware_id"], by_area, fingerprint=doc.get("fingerprint"),
                             source=", ".join(names), doc=doc)


def other_workloads(store: BaselineStore, plan: Plan) -> dict[str, set[str]]:
    """What changed -> the tests whose stored entry measured another workload than the plan's."""
    out: dict[str, set[str]] = {}
    for area, tests in plan.by_area.items():
        old = store.load(plan.hardware_id, area)
        for test, metrics in tests.items():
            for metric, new in metrics.items():
                prev = old.get(test, {}).get(metric)
                moved = workload_changes(prev.workload if prev else None, new.workload)
                if moved:
                    out.setdefault(moved, set()).add(short_id(test))
    return out


def _derived_id(fingerprint: dict | None) -> str | None:
    """The hardware id a fingerprint derives to (perfgate.machine.hardware.hardware_id); None where it is too
    incomplete to say (an import's, an older file's)."""
    from perfgate.machine import hardware

    try:
        return hardware.hardware_id(fingerprint) if fingerprint else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def machine_of_another_id(store: BaselineStore, hardware_id: str, fingerprint: dict | None,
                          areas) -> str | None:
    """Why numbers measured on ``fingerprint`` do not belong in ``hardware_id``'s folder, or None.

    The machine they were measured on derives to another id of the same family (an AVX2 machine's run
    labelled with an AVX-512 id: `perfgate refresh --yes` wrote it into the AVX-512 folder after only
    printing the difference), or the folder's baselines of ``areas`` were measured on a machine that
    derives to ``hardware_id`` itself and this one does not. A chosen id that names no machine
    (``--perf-hardware-id lab-B``), and a machine of the id that differs only in fields outside it (a
    partial refresh, BaselineStore.write keeps each entry's machine), are not another id's."""
    measured_as = _derived_id(fingerprint)
    if measured_as is None or _same_id(measured_as, hardware_id):
        return None
    folder = store.root / hardware_id
    if _family(measured_as) == _family(hardware_id):
        return (f"the runs were measured on a machine whose fingerprint makes it {measured_as}, another variant of "
                f"the family of {hardware_id} (its baselines are {folder})")
    for area in sorted(areas):
        stored_as = _derived_id(store.document(hardware_id, area).get("fingerprint"))
        if stored_as is not None and _same_id(stored_as, hardware_id):
            return (f"the baselines in {folder / f'{area}.json'} were measured on a {hardware_id} machine, the runs "
                    f"on a machine whose fingerprint makes it {measured_as}")
    return None


def _family(hardware_id: str) -> str:
    return parse_hardware_id(hardware_id).family


def _same_id(a: str, b: str) -> bool:
    """The same id, or the same family where either variant is not known (a CPU id from before the ISA was
    part of it, ``cpu-AMD-EPYC-2c``, is the ``isaunknown`` variant: it may be any ISA)."""
    from perfgate.machine import cpu_info

    pa, pb = parse_hardware_id(a), parse_hardware_id(b)
    return a == b or (pa.family == pb.family and cpu_info.UNKNOWN_ISA in (pa.variant, pb.variant))


def check_machine(store: BaselineStore, hardware_id: str, fingerprint: dict | None, areas, checks: Checks) -> None:
    """WriteRefused where :func:`machine_of_another_id` says the numbers are another id's, unless allowed."""
    other = machine_of_another_id(store, hardware_id, fingerprint, areas)
    if other and not checks.allow_other_machines:
        raise WriteRefused(f"not written: {other}; refresh under the id the runs were measured on (`perfgate "
                           f"fingerprint` on that machine prints it), or pass {checks.option('allow-other-machines')} "
                           f"to write them into {store.root / hardware_id} anyway")


def write_plan(store: BaselineStore, plan: Plan, checks: Checks, *, hold: bool = True,
               wrote: Callable[[Path, bool], object] | None = None) -> list[Path]:
    """Write every area of the plan (signals held until all are written, when ``hold``).

    A failing write (read-only folder, disk full, lock timeout) ends in one WriteRefused line
    naming the file, the cause and what was already written."""
    check_machine(store, plan.hardware_id, plan.fingerprint, plan.by_area, checks)
    moved = other_workloads(store, plan)
    if moved and not checks.allow_other_workload:
        said = "; ".join(f"{', '.join(sorted(tests))}: {what}" for what, tests in sorted(moved.items()))
        raise WriteRefused(f"not written: the stored baselines of {sum(map(len, moved.values()))} test(s) measured "
                           f"another workload ({said}); pass {checks.option('allow-other-workload')} to replace "
                           f"them, or measure the baseline's workload")
    written: list[Path] = []
    with interrupts.writing(f"the baselines in {store.root / plan.hardware_id}", hold=hold):
        for area, entries in sorted(plan.by_area.items()):
            done = f"already written: {', '.join(map(str, written))}" if written else "nothing written"
            try:
                path = store.write(plan.hardware_id, area, entries, fingerprint=plan.fingerprint)
            except locks.LockTimeout as exc:
                raise WriteRefused(f"{exc}; {done}") from None
            except OSError as exc:
                target = store.root / plan.hardware_id / f"{area}.json"
                raise WriteRefused(f"cannot write {target}: {exc.strerror or exc}"
                                   f"{f' ({exc.filename})' if exc.filename else ''}; {done}; make the folder "
                                   f"writable (and free space) and re-run") from None
            written.append(path)
            if wrote:
                wrote(path, Path(str(path) + ".prev").exists())
    return written


def write_baselines(docs: list[dict], names: list[str], *, store: BaselineStore, checks: Checks,
                    hold: bool = True, say: Callable[[str], object] = print,
                    refs: list[dict] | None = None) -> list[Path]:
    """Results documents -> baselines, every check on the way (``pytest --perf-refresh``); ``refs``: each
    run's results-store reference (perfgate.store.run_store), which the baseline records."""
    return write_plan(store, plan_from_results(docs, names, checks, say=say, refs=refs), checks, hold=hold)


def store_for_writing(settings, *, named: bool, pyproject: Path) -> BaselineStore:
    """The store to write to. A baselines folder that does not exist is created only where it was
    named (``--baselines``, or ``[tool.perfgate] baselines`` in pyproject.toml): a command run from
    another folder must not quietly start a ``./baselines`` there."""
    root = Path(settings.baselines)
    configured = str(pyproject) in settings.sources
    if not root.exists() and not root.is_symlink() and not named and not configured:
        raise WriteRefused(f"no baselines folder at {root} (the default, with no [tool.perfgate] in {pyproject}); "
                           f"run from the project root or pass --root PROJECT, or name the folder with "
                           f"--baselines DIR to create it")
    return BaselineStore(root)


def stderr(text: str) -> None:
    print(text, file=sys.stderr)
