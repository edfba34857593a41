"""Human-facing output of a run: the rich table, the Markdown summary, regression lines.

Every regression line is actionable: it names the baseline's provenance (date, commit,
software) beside the current software, and the command that re-runs just that case.
"""
from __future__ import annotations

import io
from typing import Iterable

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfgate.results import MetricResult

_STYLE = {"pass": "green", "regression": "bold red", "noisy": "yellow", "improved": "cyan", "new": "blue"}


def fmt_value(x: float | None) -> str:
    """A number for a table cell, its decimals chosen by its magnitude; None is "-"."""
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


def outcome_text(r: MetricResult) -> str:
    text = r.outcome
    if not r.gated and r.outcome in ("regression", "noisy"):
        text += " (not gated)"
    if r.tainted:
        text += " (tainted)"
    return text


def short_id(test_id: str) -> str:
    return test_id.split("::", 1)[-1]


def table(results: Iterable[MetricResult], title: str) -> Table:
    t = Table(title=title, show_lines=False, header_style="bold")
    for col, just in (("test", "left"), ("metric", "left"), ("baseline", "right"), ("current", "right"),
                      ("unit", "left"), ("change", "right"), ("tol", "right"), ("verdict", "left")):
        t.add_column(col, justify=just, overflow="fold", no_wrap=col in ("test", "metric", "verdict"))
    for r in results:
        base = r.baseline["median"] if r.baseline else None
        tol = f"{r.tol:.3f}" if r.unit == "fraction" else f"{r.tol * 100:.0f}%"
        style = _STYLE.get(r.outcome, "") if (r.gated or r.outcome in ("pass", "new", "improved")) else "dim"
        t.add_row(escape(short_id(r.test_id)), r.metric, fmt_value(base), fmt_value(r.summary.median), r.unit, change_text(r), tol,
                  f"[{style}]{escape(outcome_text(r))}[/]" if style else escape(outcome_text(r)))
    return t


def render_table(results: list[MetricResult], title: str, width: int = 160) -> str:
    buf = io.StringIO()
    Console(file=buf, width=width, force_terminal=False, color_system=None).print(table(results, title))
    return buf.getvalue()


def _software(sw: dict | None) -> str:
    if not sw:
        return "software unknown"
    keys = ("torch", "nccl", "cuda_driver", "driver", "vllm", "megatron_core")
    return ", ".join(f"{k} {sw[k]}" for k in keys if sw.get(k)) or "software unknown"


def regression_line(r: MetricResult, current_software: dict | None) -> str:
    b = r.baseline or {}
    prov = b.get("provenance", "?")
    where = f"{prov}, {b.get('when') or 'date unknown'}, commit {b.get('commit') or '?'}"
    if b.get("source"):
        where += f", {b['source']}"
    return (f"{r.test_id} {r.metric}: {r.verdict.get('explanation')}. "
            f"baseline {fmt_value(b.get('median'))} {r.unit} ({where}; {_software(b.get('software'))}) "
            f"vs current {fmt_value(r.summary.median)} {r.unit} ({_software(current_software)}). "
            f"Re-run: {r.rerun}")


def markdown(results: list[MetricResult], *, hardware_id: str, commit: str | None,
             current_software: dict | None, skipped_by_budget: list[str] | None = None) -> str:
    counts: dict[str, int] = {}
    for r in results:
        counts[r.outcome] = counts.get(r.outcome, 0) + 1
    gated_regressions = [r for r in results if r.outcome == "regression" and r.gated]
    lines = [f"## perfgate: {hardware_id}", "",
             f"commit `{commit or '?'}`; " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())), ""]
    if gated_regressions:
        lines += ["### Regressions", ""]
        lines += [f"- {regression_line(r, current_software)}" for r in gated_regressions]
        lines.append("")
    if skipped_by_budget:
        lines += ["### Not run (time budget spent)", ""] + [f"- `{t}`" for t in skipped_by_budget] + [""]
    lines += ["| test | metric | baseline | current | unit | change | verdict |",
              "|---|---|---:|---:|---|---:|---|"]
    for r in results:
        base = r.baseline["median"] if r.baseline else None
        lines.append(f"| `{short_id(r.test_id)}` | {r.metric} | {fmt_value(base)} | {fmt_value(r.summary.median)} | "
                     f"{r.unit} | {change_text(r)} | {outcome_text(r)} |")
    return "\n".join(lines) + "\n"
