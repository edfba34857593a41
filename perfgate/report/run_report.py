"""What a person reads after a run: the run's verdict, per-area counts, the rows that need a
look, then where the full table is; on the terminal and as the Markdown job summary.

The order answers "did it fail, where, which rows" before anything else, so a CI log of a
747-metric run opens with its verdict instead of a table. Every regression line is
actionable: it names the baseline's provenance (date, commit, software) beside the current
software, and the command that re-runs just that case. Tables go through perfgate.report.textable,
so numbers, headers and verdict words are never split at any width.
"""
from __future__ import annotations

from typing import Iterable

from perfgate.judge import outcomes
from perfgate.judge.policy import GatePolicy
from perfgate.judge.metric_result import MetricResult, short_id
from perfgate.report.textable import Column, Line, printable, render, wrap_words

TERMINAL_ATTENTION_LIMIT = 50  # rows of the attention table on a terminal; failing rows always shown
TABLE_CHOICES = ("attention", "all", "off")
# GitHub's job summary takes 1 MiB per step; leave room for what else a workflow appends
MARKDOWN_LIMIT_BYTES = 1024 * 1024 - 64 * 1024
MARKDOWN_ATTENTION_LIMIT = 1000  # a first run on a new machine: every metric is new


def fmt_number(x: float | None) -> str:
    if x is None:
        return "-"
    ax = abs(x)
    if ax == 0:
        return "0"
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 10:
        return f"{x:.1f}"
    if ax >= 0.01:
        return f"{x:.3f}"
    return f"{x:.3g}"


def change_text(r: MetricResult) -> str:
    change = r.verdict.get("change")
    if change is None:
        return "-"
    if r.unit == "fraction":
        return f"{-change if r.better == 'higher' else change:+.3f}"
    # show the change of the value (not of "worseness"), so +5% means the number went up
    rel = -change if r.better == "higher" else change
    return f"{rel * 100:+.1f}%"


def tol_text(r: MetricResult) -> str:
    return f"{r.tol:.3f}" if r.unit == "fraction" else f"{r.tol * 100:.0f}%"


METRIC_COLUMNS = (Column("test", fold=True, group=True), Column("metric", fold=True),
                  Column("baseline", "right"), Column("current", "right"), Column("unit"),
                  Column("change", "right"), Column("tol", "right"), Column("verdict"))


def baseline_median(r: MetricResult) -> float | None:
    """The figure the change was computed from: the verdict's reference level (the median of the run
    medians for a baseline pooled over runs), else, for verdicts that carry none (not comparable, the
    gross-change guard, results saved before it was kept), the baseline's median. Showing the pooled
    samples' median beside a change computed from another figure read 483.0 -> 387.5 as -9.2 %."""
    level = r.verdict.get("baseline_median")
    if level is not None:
        return level
    return r.baseline.get("median") if r.baseline else None


def metric_row(r: MetricResult) -> list[str]:
    return [short_id(r.test_id), r.metric, fmt_number(baseline_median(r)), fmt_number(r.summary.median), r.unit,
            change_text(r), tol_text(r), outcomes.label(r)]


def style_of(r: MetricResult) -> str:
    """Colour key: the gated outcome, or "recorded" for everything that cannot fail the run."""
    return r.outcome if r.gated else "recorded"


def metric_table(results: list[MetricResult], *, width: int, title: str | None = None) -> list[Line]:
    return render(METRIC_COLUMNS, [metric_row(r) for r in results], width=width, title=title,
                  styles=[style_of(r) for r in results])


PACKAGES_SHOWN = 8  # of the measured code's packages in a regression line; the results file has them all


def _software(sw: dict | None) -> str:
    """perfgate's stack, then the packages the measured code imports (machine.suite_packages)."""
    if not sw:
        return "software unknown"
    keys = ("torch", "nccl", "cuda_driver", "driver", "vllm", "megatron_core")
    parts = [f"{k} {sw[k]}" for k in keys if sw.get(k)]
    packages = sw.get("packages") if isinstance(sw.get("packages"), dict) else {}
    if packages:
        shown = [f"{name} {version}" for name, version in list(packages.items())[:PACKAGES_SHOWN]]
        more = len(packages) - len(shown)
        parts.append("packages: " + ", ".join(shown) + (f" and {more} more" if more else ""))
    return ", ".join(parts) or "software unknown"


def _where(b: dict) -> str:
    where = f"{b.get('provenance', '?')}, {b.get('when') or 'date unknown'}, commit {b.get('commit') or '?'}"
    return where + (f", {b['source']}" if b.get("source") else "")


def regression_line(r: MetricResult, current_software: dict | None) -> str:
    b = r.baseline or {}
    return printable(f"{r.test_id} {r.metric}: {r.verdict.get('explanation')}. "
                     f"baseline {fmt_number(baseline_median(r))} {r.unit} ({_where(b)}; "
                     f"{_software(b.get('software'))}) vs current {fmt_number(r.summary.median)} {r.unit} "
                     f"({_software(current_software)}). Re-run: {r.rerun}")


def regression_markdown(r: MetricResult, current_software: dict | None) -> str:
    """regression_line for Markdown: the test id and the re-run command as code spans (shown as they are,
    copyable, no backslashes in them), the words between as text in which nothing is markup."""
    b = r.baseline or {}
    middle = (f" {r.metric}: {r.verdict.get('explanation')}. baseline {fmt_number(baseline_median(r))} {r.unit} "
              f"({_where(b)}; {_software(b.get('software'))}) vs current {fmt_number(r.summary.median)} {r.unit} "
              f"({_software(current_software)}). Re-run: ")
    return md_code(r.test_id) + md_text(middle) + md_code(r.rerun)


def regression_detail(r: MetricResult, current_software: dict | None, width: int) -> list[str]:
    """regression_line for a terminal: one clause a line, so a value and its unit start a line."""
    b = r.baseline or {}
    lines = wrap_words(f"REGRESSION {short_id(r.test_id)} {r.metric}", width, "    ")  # Re-run has the path
    for clause in (str(r.verdict.get("explanation")),
                   f"baseline {fmt_number(baseline_median(r))} {r.unit}: {_where(b)}; {_software(b.get('software'))}",
                   f"current {fmt_number(r.summary.median)} {r.unit}: {_software(current_software)}"):
        lines += wrap_words("    " + clause, width, "      ")
    return lines + [printable(f"    Re-run: {r.rerun}")]  # whole, to copy: never folded


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _counts_text(bucket: dict) -> str:
    return ", ".join(f"{v} {k}" for k, v in outcomes.ordered(bucket))


def verdict_clauses(summary: dict, hardware_id: str) -> list[str]:
    """``perfgate: 0 regressions in 459 gated metrics``, ``288 recorded only (not gated on cpu-*)``"""
    g, rec = summary["gated"], summary["recorded_only"]
    parts = [_plural(g.get("regression", 0), "regression")]
    parts += [f"{v} {k}" for k, v in outcomes.ordered(g) if k not in ("pass", "regression")]
    clauses = [f"perfgate: {', '.join(parts)} in {_plural(g['metrics'], 'gated metric')}"]
    if rec["metrics"]:
        clauses.append(f"{rec['metrics']} recorded only ({GatePolicy(hardware_id).recorded_only_note()})")
    if summary["tainted"]:
        clauses.append(f"{summary['tainted']} measured on a busy machine (tainted)")
    return clauses


def verdict_line(summary: dict, hardware_id: str) -> str:
    return "; ".join(verdict_clauses(summary, hardware_id))


def area_clauses(summary: dict) -> list[tuple[str, list[str]]]:
    """(area, ["gated 49: 48 pass, 1 regression", "recorded only 73: 40 pass, 10 worse, ..."])"""
    out = []
    for area, b in summary["areas"].items():
        g, rec = b["gated"], b["recorded_only"]
        clauses = [f"gated {g['metrics']}" + (f": {_counts_text(g)}" if g["metrics"] else "")]
        if rec["metrics"]:
            clauses.append(f"recorded only {rec['metrics']}: {_counts_text(rec)}")
        if b["tainted"]:
            clauses.append(f"{b['tainted']} tainted")
        out.append((area, clauses))
    return out


def _clauses(first: str, clauses: list[str], width: int, indent: str) -> list[str]:
    """``first`` then clauses joined by "; ", a line break only between clauses where one fits."""
    items = [c + (";" if k < len(clauses) - 1 else "") for k, c in enumerate(clauses)]
    items[0] = first + items[0]
    lines: list[str] = []
    for item in items:
        if lines and len(lines[-1]) + 1 + len(item) <= width:
            lines[-1] += " " + item
        else:
            lines += wrap_words(item if not lines else indent + item, width, indent)
    return lines


def attention_title(attention: list[MetricResult], total: int) -> str:
    """``needs attention: 3 of 743 metrics (regression, new (recorded))``: the kinds present,
    most urgent first, so an outcome added later names itself."""
    kinds = list(dict.fromkeys(outcomes.label(r) for r in attention))
    return f"needs attention: {len(attention)} of {total} metrics ({', '.join(kinds)})"


def terminal_lines(results: list[MetricResult], *, hardware_id: str, width: int, table: str = "attention",
                   full_table_at: str | None = None, all_option: str = "--perf-table=all",
                   current_software: dict | None = None, notes: Iterable[str] = (),
                   baselines_at: str | None = None) -> list[Line]:
    """The run's report for a terminal or a log, every line within ``width`` where a value allows.

    ``notes`` (a tainted machine, say) follow the verdict: they say why it may not be final."""
    summary = outcomes.summary(results)
    bad = summary["gated"].get("regression", 0) > 0
    lines = [Line(t, "regression" if bad else "verdict")
             for t in _clauses("", verdict_clauses(summary, hardware_id), width, "    ")]
    for note in notes:
        lines += [Line(t, "note") for t in wrap_words(note, width, "    ")]
    areas = area_clauses(summary)
    name_w = max((len(a) for a, _ in areas), default=0)
    for area, clauses in areas:
        lines += [Line(t) for t in _clauses(f"  {area.ljust(name_w)}  ", clauses, width, " " * (name_w + 4))]
    attention = outcomes.attention(results)
    if table == "all":
        lines.append(Line(""))
        lines += metric_table(results, width=width, title=f"all {len(results)} metrics of {hardware_id}:")
    elif table == "attention" and attention:
        failing = sum(1 for r in attention if outcomes.may_fail(r))
        shown = attention[:max(TERMINAL_ATTENTION_LIMIT, failing)]
        lines.append(Line(""))
        lines += metric_table(shown, width=width, title=attention_title(attention, len(results)))
        if len(shown) < len(attention):
            more = f"... and {len(attention) - len(shown)} more rows needing attention"
            lines += [Line(t) for t in wrap_words(more + (f" (all in {full_table_at})" if full_table_at else ""),
                                                  width, "    ")]
    elif table == "attention":
        lines.append(Line(f"no metric needs attention ({len(results)} recorded)"))
    regressions = [r for r in results if r.gated and r.outcome == "regression"]
    for r in regressions:
        lines += [Line(t, "regression") for t in regression_detail(r, current_software, width)]
    if table != "all":
        hint = (f"full table: {full_table_at}; {all_option} prints it here" if full_table_at
                else f"full table: {all_option} prints every metric")
        lines += [Line(t) for t in wrap_words(hint, width, "    ")]
    if baselines_at:
        lines += [Line(t) for t in wrap_words(f"judged against baselines in {baselines_at}", width, "    ")]
    return lines


# Markdown's own characters in text from tests and files, shown as themselves: a metric named
# `<img src=x onerror=alert(1)>` went into the job summary raw (only the id column was escaped).
_MD_LITERAL = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\\": "\\\\", "|": "\\|", "`": "\\`",
                             "*": "\\*", "[": "\\[", "]": "\\]"})


def md_text(text: object) -> str:
    """Text from a test or a file (a metric name, a test id, a reason) in a Markdown line or table cell:
    printable, and nothing in it is markup (HTML, emphasis, links, a cell's end)."""
    return printable(str(text)).translate(_MD_LITERAL)


def md_code(text: object) -> str:
    """Text from a test or a file as a Markdown code span: HTML in it is shown as text; a backtick would end
    the span (shown as '), a | the table cell."""
    return "`" + printable(str(text)).replace("`", "'").replace("|", "\\|") + "`"


def _md_table(results: Iterable[MetricResult]) -> list[str]:
    lines = ["| test | metric | baseline | current | unit | change | tol | verdict |",
             "|---|---|---:|---:|---|---:|---:|---|"]
    for r in results:
        row = metric_row(r)
        lines.append(f"| {md_code(row[0])} | {md_text(row[1])} | " + " | ".join(md_text(c) for c in row[2:]) + " |")
    return lines


def markdown(results: list[MetricResult], *, hardware_id: str, commit: str | None,
             current_software: dict | None, skipped_by_budget: list[str] | None = None,
             notes: Iterable[str] = ()) -> str:
    """The CI job summary: verdict, per-area counts, attention rows, then every row collapsed.

    About 150 bytes a row, so the whole CPU suite (~750 metrics, twice) stays far below
    GitHub's 1 MiB job-summary limit. ``notes`` as in terminal_lines."""
    summary = outcomes.summary(results)
    lines = [f"## perfgate: {hardware_id}", "", f"**{verdict_line(summary, hardware_id)}**", ""]
    lines += [f"> {md_text(note)}" for note in notes] + ([""] if notes else [])
    lines += [f"commit `{commit or '?'}`", "", "| area | gated | recorded only |", "|---|---|---|"]
    for area, b in summary["areas"].items():
        g, rec = b["gated"], b["recorded_only"]
        cell_g = f"{g['metrics']}: {_counts_text(g)}" if g["metrics"] else "0"
        cell_r = f"{rec['metrics']}: {_counts_text(rec)}" if rec["metrics"] else "0"
        if b["tainted"]:
            cell_r += f" ({b['tainted']} tainted)"
        lines.append(f"| {md_text(area)} | {cell_g} | {cell_r} |")
    lines.append("")
    attention = outcomes.attention(results)
    if attention:
        shown = attention[:max(MARKDOWN_ATTENTION_LIMIT, sum(1 for r in attention if outcomes.may_fail(r)))]
        lines += [f"### Needs attention ({len(attention)} of {len(results)} metrics)", ""] + _md_table(shown)
        if len(shown) < len(attention):
            lines += ["", f"{len(attention) - len(shown)} more rows needing attention are in the full table below."]
        lines.append("")
    else:
        lines += ["No metric needs attention.", ""]
    regressions = [r for r in results if r.outcome == "regression" and r.gated]
    if regressions:
        lines += ["### Regressions", ""]
        lines += [f"- {regression_markdown(r, current_software)}" for r in regressions]
        lines.append("")
    if skipped_by_budget:
        lines += ["### Not run (time budget spent)", ""] + [f"- {md_code(t)}" for t in skipped_by_budget] + [""]
    head = "\n".join(lines) + "\n"
    table = _md_table(results)
    budget = MARKDOWN_LIMIT_BYTES - len(head.encode()) - 512
    kept, size = 2, sum(len(t.encode()) + 1 for t in table[:2])
    while kept < len(table) and size + len(table[kept].encode()) + 1 <= budget:
        size += len(table[kept].encode()) + 1
        kept += 1
    tail = [] if kept == len(table) else [
        "", f"{len(table) - kept} more rows left out to stay within GitHub's job-summary size limit: every "
            f"metric is in the results JSON (--perf-save)"]
    body = [f"<details><summary>All {len(results)} metrics</summary>", ""] + table[:kept] + tail + ["", "</details>"]
    return head + "\n".join(body) + "\n"
