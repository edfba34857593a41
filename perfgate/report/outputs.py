"""What a pytest session writes when it ends: the results file, history, Markdown summary, refresh.

Called by the plugin's ``pytest_sessionfinish`` with signals held, so a Ctrl-C never leaves a
half-written file behind.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from perfgate import mutations
from perfgate.judge import outcomes
from perfgate.judge.baseline_choice import report_notes as baseline_notes
from perfgate.machine import hardware
from perfgate.report import run_report
from perfgate.session import PerfState
from perfgate.store import results as results_mod


def document(config: pytest.Config, state: PerfState) -> dict:
    doc = results_mod.make_document(
        state.results, hardware_id=state.hardware_id, fingerprint=hardware.fingerprint(),
        commit=results_mod.git_commit(Path(config.rootpath)), attachments=state.attachments,
        interrupted=state.interrupted, skipped_by_budget=state.skipped_by_budget)
    if mutations.active_names():
        doc[mutations.RESULTS_KEY] = {"names": list(mutations.active_names()), "note": mutations.note()}
    return doc


def nothing_refreshed(config: pytest.Config, state: PerfState) -> str:
    """Why --perf-refresh had no metric to write, and what to do about it."""
    tainted = [r for r in state.results if r.tainted]
    if not tainted:
        return "perfgate: --perf-refresh wrote nothing: no metric was recorded"
    reasons = "; ".join(sorted({t for r in tainted for t in r.tainted}))
    why = f"perfgate: --perf-refresh wrote nothing: all {len(tainted)} metric(s) are tainted ({reasons}), and " \
          f"tainted results never become baselines"
    if (config.getoption("--perf-preflight") == "auto" and not state.hardware_id.startswith("cpu-")
            and hardware.gpu_count() == 0):
        return (f"{why}. The preflight check ran because hardware id {state.hardware_id!r} does not start with "
                f"'cpu-' (--perf-preflight auto treats it as a GPU machine), but this machine has no GPU: pass "
                f"--perf-preflight off, or a hardware id starting with 'cpu-'")
    return f"{why}; re-run on a quiet machine, or pass --perf-preflight off to skip the check"


def write_outputs(config: pytest.Config, state: PerfState) -> None:
    doc = document(config, state)
    doc["summary"] = outcomes.summary(state.results)  # counts, gated apart from recorded-only
    if config.getoption("--perf-save"):
        results_mod.save(Path(config.getoption("--perf-save")), doc)
        if doc["interrupted"]:
            state.save_note = (f"run interrupted: results of the {len({r.test_id for r in state.results})} "
                               f"finished test(s) saved to {config.getoption('--perf-save')} "
                               f"(marked \"interrupted\": true)")
    if config.getoption("--perf-history"):
        hist = Path(config.getoption("--perf-history"))
        stamp = doc["created"].replace(":", "").replace("+0000", "Z")
        results_mod.save(hist / f"{stamp}-{doc['commit'] or 'nocommit'}.json", doc)
    if config.getoption("--perf-markdown"):
        md = run_report.markdown(state.results, hardware_id=state.hardware_id, commit=doc["commit"],
                             current_software=doc["fingerprint"]["software"],
                             skipped_by_budget=state.skipped_by_budget, notes=report_notes(state))
        Path(config.getoption("--perf-markdown")).parent.mkdir(parents=True, exist_ok=True)
        Path(config.getoption("--perf-markdown")).write_text(md)
    if config.getoption("--perf-refresh"):
        if doc["interrupted"]:
            state.refresh_note = "run was interrupted: baselines NOT refreshed (re-run to completion)"
        elif not results_mod.baseline_entries(doc):
            state.refresh_note = nothing_refreshed(config, state)
            state.refresh_failed = True
        else:
            written = []
            try:
                for area, entries in results_mod.baseline_entries(doc).items():
                    written.append(state.store.write(state.hardware_id, area, entries, fingerprint=doc["fingerprint"]))
            except ValueError as exc:  # a test folder that cannot name a baseline file, a link out of the tree
                state.refresh_note = f"perfgate: --perf-refresh stopped: {exc}" + (
                    f" (already written: {', '.join(map(str, written))})" if written else " (nothing written)")
                state.refresh_failed = True
                return
            state.refresh_note = "refreshed baselines: " + ", ".join(str(p) for p in written)


WATCHED_NOTE_TESTS = 5  # tests named in the busy-while-measuring note; the rest are counted


def report_notes(state: PerfState) -> list[str]:
    """What qualifies the run's verdict (a busy machine), said right under it."""
    notes = []
    gate_note = "gated anyway (--perf-allow-tainted)" if state.allow_tainted else \
        "not gated (--perf-allow-tainted to gate anyway)"
    if state.tainted:
        notes.append(f"machine tainted, metrics {gate_note}: " + "; ".join(state.tainted))
    watched: dict[str, list[str]] = {}  # found by perfgate.machine.load_watch while a test measured
    for r in state.results:
        if any(t not in state.tainted for t in r.tainted):
            watched.setdefault(r.test_id, [t for t in r.tainted if t not in state.tainted])
    if watched:
        named = [f"{run_report.short_id(t)}: {'; '.join(reasons)}" for t, reasons in
                 list(watched.items())[:WATCHED_NOTE_TESTS]]
        more = len(watched) - len(named)
        notes.append(f"{len(watched)} test(s) measured while the machine was busy, their metrics tainted and "
                     f"{gate_note}: " + "; ".join(named)
                     + (f"; and {more} more (each result's reasons are in its 'tainted')" if more else ""))
    notes.extend(baseline_notes(state.results, state.hardware_id))  # fallback baselines, fingerprint changes
    return notes
