"""One trend panel as inline SVG: every value and commit reachable on the page itself, nothing fetched.

A panel is one series (hardware id, test, metric; perfgate.report.trends): the run medians over the
machine's runs with their interquartile range, the baseline as a band (Series.band: median +- tolerance,
never below zero for a series that cannot be), tainted runs hollow, regression verdicts as red crosses and
the change points Apache Otava found as vertical lines. Every point, band and change line carries an SVG
``<title>`` (the browser shows it on hover: run time, commit, median, IQR, n, verdict), and a point is a
link to its commit where the page knows the repository (perfgate.report.html_page.commit_link).

The panel's title is HTML around it (it wraps; an image's title was clipped at both edges), and the SVG
scales to the width it is given (``viewBox``; a page lays panels out in a grid, one panel spans the page).
Pure text: no plotting library, no font files, no external reference.
"""
from __future__ import annotations

import math
from html import escape
from typing import Callable

from perfgate.report.changepoints import ChangePoint
from perfgate.report.run_report import fmt_number
from perfgate.report.trends import Point, Series

WIDTH, HEIGHT = 640, 250
LEFT, RIGHT, TOP, BOTTOM = 70, 14, 14, 34
X_LABELS = 6


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """About ``count`` round values (1, 2 or 5 times a power of ten apart) covering [lo, hi]."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        return [lo]
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    out, k = [], 0
    while first + k * step <= hi + step * 1e-9:
        out.append(round(first + k * step, 12))
        k += 1
    return out


def _y_range(s: Series, band: tuple[float, float] | None) -> tuple[float, float]:
    values = [v for p in s.points for v in (p.q1, p.median, p.q3)] + (list(band) if band else [])
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.08 or abs(hi) * 0.05 or 1.0
    lo, hi = lo - pad, hi + pad
    if min(values) >= 0:  # a series that cannot go below zero gets no negative axis
        lo = max(lo, 0.0)
    return lo, hi


def point_title(s: Series, p: Point) -> str:
    """What hovering a point says: when, which commit, the value with its IQR and n, and the verdict."""
    when = p.created[:16].replace("T", " ")
    taint = ", tainted (machine busy)" if p.tainted else ""
    return (f"{when} commit {(p.commit or '?')[:12]}: median {p.median:.6g} {s.unit} "
            f"(IQR {p.q1:.6g} to {p.q3:.6g}, n {p.n}), {p.outcome}{taint}")


def panel(s: Series, *, slots: dict[int, int], labels: list[str], base: tuple[float, str | None] | None,
          changes: list[ChangePoint], commit_link: Callable[[str | None], str | None]) -> str:
    """The SVG of one series. ``slots``: history run index -> x slot (0 .. len(labels) - 1, the machine's
    runs in time order); ``labels``: each slot's short date; ``base``: (median, provenance) or None."""
    band = s.band(base[0]) if base else None
    y_lo, y_hi = _y_range(s, band)
    n_slots = max(len(labels), 1)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(slot: float) -> float:
        return LEFT + plot_w * ((slot + 0.5) / n_slots)

    def y(value: float) -> float:
        return TOP + plot_h * (1 - (value - y_lo) / (y_hi - y_lo)) if y_hi > y_lo else TOP + plot_h / 2

    out = [f'<svg class="plot" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" preserveAspectRatio="xMidYMid meet" '
           f'aria-label="{escape(s.metric)} of {escape(s.test_id)} over {len(s.points)} runs">',
           f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}"/>']
    for t in nice_ticks(y_lo, y_hi):
        if y_lo <= t <= y_hi:
            out.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(t):.1f}" y2="{y(t):.1f}"/>'
                       f'<text class="ytick" x="{LEFT - 5}" y="{y(t) + 3.5:.1f}">{escape(fmt_number(t))}</text>')
    out.append(f'<text class="unit" x="12" y="{TOP + plot_h / 2:.1f}" transform="rotate(-90 12 {TOP + plot_h / 2:.1f})"'
               f'>{escape(s.unit)}</text>')
    step = max(1, math.ceil(n_slots / X_LABELS))
    for slot in range(0, n_slots, step):  # a label near an edge is anchored inside the frame, never clipped
        where = (slot + 0.5) / n_slots
        anchor = "start" if where < 0.15 and n_slots > 1 else "end" if where > 0.85 else "middle"
        out.append(f'<text class="xtick" text-anchor="{anchor}" x="{x(slot):.1f}" y="{HEIGHT - BOTTOM + 14}">'
                   f'{escape(labels[slot] if slot < len(labels) else "")}</text>')
    if band:
        tol = f"{s.tol:.3g} absolute" if s.absolute else f"{s.tol:.0%}"
        top, bottom = y(min(band[1], y_hi)), y(max(band[0], y_lo))
        out.append(f'<rect class="band" x="{LEFT}" y="{top:.1f}" width="{plot_w}" height="{max(bottom - top, 0):.1f}">'
                   f'<title>baseline {escape(fmt_number(base[0]))} {escape(s.unit)} ± {tol}: '
                   f'{escape(fmt_number(band[0]))} to {escape(fmt_number(band[1]))} ({escape(base[1] or "?")})</title>'
                   f'</rect><line class="base" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{y(base[0]):.1f}" '
                   f'y2="{y(base[0]):.1f}"/>')
    xs = [(x(slots[p.run]), p) for p in s.points if p.run in slots]
    if len(xs) > 1:
        out.append('<polyline class="line" points="' + " ".join(f"{px:.1f},{y(p.median):.1f}" for px, p in xs) + '"/>')
    for c in changes:
        if c.point.run in slots:
            cx = x(slots[c.point.run] - 0.5)
            out.append(f'<line class="change {"worse" if c.worse else "better"}" x1="{cx:.1f}" x2="{cx:.1f}" '
                       f'y1="{TOP}" y2="{TOP + plot_h}"><title>{escape(c.describe())}</title></line>')
            label = f"{c.shown_change} p={c.p_value:.1g}"
            anchor, dx = ("end", -3) if cx > LEFT + plot_w * 0.7 else ("start", 3)
            out.append(f'<text class="change-label {"worse" if c.worse else "better"}" text-anchor="{anchor}" '
                       f'x="{cx + dx:.1f}" y="{TOP + 11}">{escape(label)}</text>')
    for px, p in xs:
        mark = (f'<line class="iqr" x1="{px:.1f}" x2="{px:.1f}" y1="{y(p.q1):.1f}" y2="{y(p.q3):.1f}"/>'
                f'<circle class="{"tainted" if p.tainted else "run"}" cx="{px:.1f}" cy="{y(p.median):.1f}" r="3.5"/>')
        if p.outcome == "regression":
            py = y(p.median)
            mark += (f'<path class="regression" d="M{px - 5:.1f},{py - 5:.1f}L{px + 5:.1f},{py + 5:.1f}'
                     f'M{px - 5:.1f},{py + 5:.1f}L{px + 5:.1f},{py - 5:.1f}"/>')
        mark = f'<g class="point"><title>{escape(point_title(s, p))}</title>{mark}</g>'
        link = commit_link(p.commit)
        out.append(f'<a href="{escape(link)}">{mark}</a>' if link else mark)
    out.append("</svg>")
    return "".join(out)


STYLE = """
svg.plot { width: 100%; height: auto; display: block; font: 11px system-ui, sans-serif; }
svg.plot .frame { fill: #fff; stroke: #bbb; }
svg.plot .grid { stroke: #eee; }
svg.plot .ytick { text-anchor: end; fill: #444; }
svg.plot .xtick, svg.plot .unit { fill: #444; text-anchor: middle; }
svg.plot .band { fill: #2ca02c; fill-opacity: 0.15; }
svg.plot .base { stroke: #2ca02c; stroke-dasharray: 4 3; }
svg.plot .line { fill: none; stroke: #1f77b4; stroke-opacity: 0.6; }
svg.plot .iqr { stroke: #1f77b4; }
svg.plot .run { fill: #1f77b4; }
svg.plot .tainted { fill: #fff; stroke: #888; stroke-width: 1.5; }
svg.plot .regression { stroke: #d62728; stroke-width: 2; }
svg.plot .change { stroke-width: 2; }
svg.plot .change.worse { stroke: #d62728; } svg.plot .change-label.worse { fill: #d62728; }
svg.plot .change.better { stroke: #17becf; } svg.plot .change-label.better { fill: #0f8c99; }
svg.plot .point:hover circle { r: 6; }
"""
