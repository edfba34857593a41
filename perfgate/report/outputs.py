"""What a pytest session writes when it ends: the results file, history, Markdown summary, refresh.

Called by the plugin's ``pytest_sessionfinish`` with signals held, so a Ctrl-C never leaves a
half-written file behind. A write that fails (read-only folder, ``/proc/x.json``, disk full, a
held lock) is one line under the report, which is still printed, and the session fails.
``--perf-refresh`` goes through perfgate.store.baseline_writer, so it refuses what
``perfgate refresh`` refuses; :func:`check_before_run` says the refusals known at start-up.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from perfgate import mutations
from perfgate.store import run_store
from perfgate.store.atomic import json_bytes
from perfgate.store.backends import describe, spec_of
from perfgate.judge import outcomes, pooling
from perfgate.judge.baseline_choice import report_notes as baseline_notes
from perfgate.machine import hardware
from perfgate.report import run_report
from perfgate.report.errors import os_error
from perfgate.session import PerfState
from perfgate.store import baseline_writer, results as results_mod
from perfgate.store.baseline_writer import SESSION_CHECKS, Checks
from perfgate.store.safe_paths import PathError, check_writable_folder, outside_root


def document(config: pytest.Config, state: PerfState) -> dict:
    doc = results_mod.make_document(
        state.results, hardware_id=state.hardware_id,
        fingerprint=dict(hardware.fingerprint(), software=state.software()),
        commit=results_mod.git_commit(Path(config.rootpath)), attachments=state.attachments,
        interrupted=state.interrupted, skipped_by_budget=state.skipped_by_budget)
    mark = mutations.results_mark()
    if mark:
        doc[mutations.RESULTS_KEY] = mark
    return doc


def nothing_refreshed(config: pytest.Config, state: PerfState) -> str:
    """Why --perf-refresh had no metric to write, and what to do about it."""
    tainted = [r for r in state.results if r.tainted]
    if not tainted:
        return "perfgate: --perf-refresh wrote nothing: no metric was recorded"
    why = (f"perfgate: --perf-refresh wrote nothing: all {len(tainted)} metric(s) are tainted "
           f"({taint_summary([r.tainted for r in tainted])}), and tainted results never become baselines")
    return f"{why}; re-run on a quiet machine, or pass --perf-preflight off to skip the checks"


def refresh_checks(config: pytest.Config) -> Checks:
    """What this session's --perf-refresh allows: the same checks as `perfgate refresh`."""
    return Checks.of(lambda name: config.getoption(f"--perf-{name}"), SESSION_CHECKS, prefix="--perf-")


def check_before_run(config: pytest.Config, state: PerfState) -> None:
    """Refusals that are known before a test runs, so a long session is not spent for nothing:
    a mutation with --perf-refresh, a dirty tree or a baselines folder that is a link with --perf-refresh,
    a results file, history folder or Markdown summary inside the baselines root (a results file over a
    committed baseline)."""
    try:
        names = mutations.describe(mutations.active_factors())
    except mutations.MutationError as exc:
        raise pytest.UsageError(f"perfgate: {exc}") from None
    if hasattr(config, "workerinput"):
        return  # the controller checked; workers write nothing
    if config.getoption("--perf-refresh"):
        if names:
            raise pytest.UsageError(f"perfgate: --perf-refresh refused: test-only mutation(s) {names} are on "
                                    f"({mutations.ENV} or an older knob, perfgate/mutations.py): planted performance "
                                    f"bugs; unset them to refresh baselines")
        commit = results_mod.git_commit(Path(config.rootpath)) or ""
        if "-dirty" in commit and not config.getoption("--perf-allow-dirty"):
            raise pytest.UsageError(f"perfgate: --perf-refresh refused: {config.rootpath} has uncommitted changes to "
                                    f"tracked files (commit {commit}); commit them and re-run, or pass "
                                    f"--perf-allow-dirty to record the dirty tree's commit and diff hash as provenance")
        folder = Path(state.settings.baselines) / state.hardware_id
        try:  # an alias id (a link to another id's folder) was refused only after every test had run
            check_writable_folder(Path(state.settings.baselines), state.hardware_id)
            baseline_writer.check_machine(state.store, state.hardware_id, hardware.fingerprint(),
                                          [p.stem for p in folder.glob("*.json")], refresh_checks(config))
        except (PathError, baseline_writer.WriteRefused) as exc:
            raise pytest.UsageError(f"perfgate: --perf-refresh refused: {exc}") from None
    for option in ("--perf-save", "--perf-history", "--perf-markdown"):
        value = config.getoption(option)
        try:
            if value:
                outside_root(Path(state.settings.baselines), Path(value), option=option,
                             example=f"runs/{Path(value).name}")
        except PathError as exc:
            raise pytest.UsageError(f"perfgate: {exc}") from None


def _written(what: str, write) -> str | None:
    """Run one output's write; a failure is one line (the report is still printed), not a traceback."""
    try:
        write()
    except (OSError, ValueError) as exc:  # `ulimit -f` gives an OSError with no file name: ``what`` names it
        return f"perfgate: {what} not written: {os_error(exc) if isinstance(exc, OSError) else exc}"
    return None


def write_outputs(config: pytest.Config, state: PerfState) -> None:
    doc = document(config, state)
    doc["summary"] = outcomes.summary(state.results)  # counts, gated apart from recorded-only
    failures = []
    if config.getoption("--perf-save"):
        failures.append(_written(f"--perf-save {config.getoption('--perf-save')}",
                                 lambda: results_mod.save(Path(config.getoption("--perf-save")), doc)))
        if doc["interrupted"] and not failures[-1]:
            state.save_note = (f"run interrupted: results of the {len({r.test_id for r in state.results})} "
                               f"finished test(s) saved to {config.getoption('--perf-save')} "
                               f"(marked \"interrupted\": true)")
    if config.getoption("--perf-history"):  # a results store: a folder, an SQLite file or PostgreSQL
        hist, raw = str(config.getoption("--perf-history")), json_bytes(doc, finite=False)
        failures.append(_written(f"--perf-history {describe(hist)}", lambda: run_store.push(
            hist, raw, doc["hardware_id"], run_store.session_name(doc, raw))))
    if config.getoption("--perf-markdown"):
        md = run_report.markdown(state.results, hardware_id=state.hardware_id, commit=doc["commit"],
                             current_software=doc["fingerprint"]["software"],
                             skipped_by_budget=state.skipped_by_budget, notes=report_notes(state))
        target = Path(config.getoption("--perf-markdown"))

        def write_markdown() -> None:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(md)
        failures.append(_written(f"--perf-markdown {target}", write_markdown))
    failures = [f for f in failures if f]
    if failures:
        state.save_note = "; ".join(filter(None, [state.save_note, *failures]))
        state.refresh_failed = True  # a requested output that is missing must not look like a green run
    if config.getoption("--perf-refresh"):
        _refresh(config, state, doc)


def _refresh(config: pytest.Config, state: PerfState, doc: dict) -> None:
    """--perf-refresh: this session's results through perfgate.store.baseline_writer, like `perfgate refresh`."""
    if doc["interrupted"]:
        state.refresh_note = "run was interrupted: baselines NOT refreshed (re-run to completion)"
        return
    if not pooling.baseline_entries(doc):
        state.refresh_note = nothing_refreshed(config, state)
        state.refresh_failed = True
        return
    left_out: list[str] = []  # metrics that measured nothing (every sample 0 ms): said, not written
    # the run itself goes to the results store (--perf-history's, else $PERFGATE_RESULTS_STORE, else the embedded
    # default) and the baseline names it by store name and hash, as `perfgate refresh` does: so `perfgate
    # verify-baselines` can re-derive every entry this session writes
    kept_in = str(config.getoption("--perf-history") or "") or None
    try:
        raw = json_bytes(doc, finite=False)
        ref = run_store.push(kept_in, raw, doc["hardware_id"], run_store.session_name(doc, raw))
        written = baseline_writer.write_baselines([doc], ["this session"], store=state.store, refs=[ref],
                                                  checks=refresh_checks(config), hold=False, say=left_out.append)
    except OSError as exc:  # the store's folder or file cannot be written
        state.refresh_note = f"perfgate: --perf-refresh stopped: the run could not be stored: {os_error(exc)}"
        state.refresh_failed = True
        return
    except ValueError as exc:  # a check refused, a name that cannot be a file, a failing write: one line
        state.refresh_note = "; ".join([f"perfgate: --perf-refresh stopped: {exc}", *left_out])
        state.refresh_failed = True
        return
    if not written:
        state.refresh_note = "; ".join(["perfgate: --perf-refresh wrote nothing", *left_out])
        state.refresh_failed = True
        return
    state.refresh_note = "; ".join(["refreshed baselines: " + ", ".join(str(p) for p in written),
                                    f"their run is {ref['file']} in {describe(spec_of(kept_in))}", *left_out])


REASON_SHOWN_CHARS = 240  # of the one reason a taint summary quotes; the results file keeps them whole


def taint_summary(reason_lists: list[list[str]]) -> str:
    """Many taint reasons in one short clause: how many there are and the most frequent, shortened; the
    results file keeps every result's own (``tainted``). One busy launch taints each test that reads it
    with its own sentence (its numbers and process ids), so listing them printed one 6,000-character
    line, or one sentence five times and "and 164 more" (issue 47)."""
    counts: dict[str, int] = {}
    for reasons in reason_lists:
        for reason in dict.fromkeys(reasons):
            counts[reason] = counts.get(reason, 0) + 1
    if not counts:
        return "no reason recorded"
    top = max(counts, key=lambda r: (counts[r], r))
    shown = top if len(top) <= REASON_SHOWN_CHARS else top[:REASON_SHOWN_CHARS - 3].rstrip() + "..."
    if len(counts) == 1:
        return shown
    return (f"{len(counts)} distinct reasons, most often ({counts[top]} of {len(reason_lists)}): {shown}; every "
            f"result's own are under 'tainted' in the results file (--perf-save)")


def report_notes(state: PerfState) -> list[str]:
    """What qualifies the run's verdict (a busy machine), said right under it."""
    notes = []
    gate_note = "gated anyway (--perf-allow-tainted)" if state.allow_tainted else \
        "not gated (--perf-allow-tainted to gate anyway)"
    if state.tainted:
        notes.append(f"machine tainted, metrics {gate_note}: " + taint_summary([state.tainted]))
    watched: dict[str, list[str]] = {}  # found by perfgate.machine.load_watch while a test measured
    for r in state.results:
        if any(t not in state.tainted for t in r.tainted):
            watched.setdefault(r.test_id, [t for t in r.tainted if t not in state.tainted])
    if watched:
        notes.append(f"{len(watched)} test(s) measured while the machine was busy, their timings tainted and "
                     f"{gate_note}; counts and structural ratios stay gated: " + taint_summary(list(watched.values())))
    notes.extend(baseline_notes(state.results, state.hardware_id))  # fallback baselines, fingerprint changes
    unmatched = ids_match_no_baseline(state)
    if unmatched:
        notes.append(unmatched)
    return notes


def ids_match_no_baseline(state: PerfState) -> str | None:
    """Where this hardware id has baselines and not one of this run's test ids is among them: what the
    ids are relative to, and a stored id that looks like one of them. A test's id once moved with the
    command line (perfgate.node_ids), and a run 2x slower read ``new``, with nothing said."""
    folder = Path(state.settings.baselines) / state.hardware_id
    ids = sorted({r.test_id for r in state.results})
    if not ids or not folder.is_dir():
        return None
    stored: set[str] = set()
    for path in sorted(folder.glob("*.json")):
        stored.update(state.store.load(state.hardware_id, path.stem))
    if not stored or stored.intersection(ids):
        return None
    alike = next(((i, s) for i in ids for s in sorted(stored) if s.endswith("/" + i) or i.endswith("/" + s)), None)
    seen = (f"; e.g. this run's {alike[0]} is stored as {alike[1]}" if alike else
            f" (e.g. {sorted(stored)[0]})")
    return (f"none of this run's {len(ids)} test id(s) is in the {len(stored)} of the baselines in {folder}{seen}: "
            f"every metric reads 'new'. Test ids are paths relative to the project's root (the folder of its "
            f"pyproject.toml or pytest.ini, else where pytest was started); run from where the baselines were "
            f"recorded, or refresh them under these ids")
