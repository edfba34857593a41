"""One static HTML page of a history: latest verdicts per area, change points, trend plots.

No server and nothing fetched: the style is inline and the plots are PNGs beside the page
(``<img src="name.png">``), so the folder can be uploaded as a CI artifact and opened from
disk. Per hardware id and area the table is the latest run that measured that area (a
nightly job runs areas separately), every metric of it, regressions highlighted; then the
change points Apache Otava found (perfgate.report.changepoints), worse first; then one plot
per metric family.
"""
from __future__ import annotations

from html import escape
from pathlib import Path

from perfgate.report import changepoints, trends
from perfgate.report.run_report import METRIC_COLUMNS, metric_row, style_of
from perfgate.store.results import MetricResult

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.regression { background: #fbd5d5; font-weight: bold; }
tr.noisy { background: #fff3c4; }
tr.improved { background: #d9f2f7; }
tr.new { background: #e3e8ff; }
tr.recorded { color: #666; }
tr.worse { background: #fbd5d5; }
img { max-width: 100%; border: 1px solid #ddd; margin-bottom: 1em; }
.summary { font-size: 1.05em; }
"""
_NUMERIC = {"baseline", "current", "change", "tol"}


def latest_by_area(runs: list[trends.Run]) -> dict[tuple[str, str], tuple[trends.Run, list[MetricResult]]]:
    """(hardware id, area) -> the latest run that measured the area, and its results there."""
    out: dict[tuple[str, str], tuple[trends.Run, list[MetricResult]]] = {}
    for run in runs:  # oldest first: later runs replace earlier ones
        areas: dict[str, list[MetricResult]] = {}
        for r in run.results:
            areas.setdefault(r.area, []).append(r)
        for area, results in areas.items():
            out[(run.hardware_id, area)] = (run, results)
    return dict(sorted(out.items()))


def _cells(values: list[str], headers: list[str]) -> str:
    return "".join(f'<td class="num">{escape(v)}</td>' if h in _NUMERIC else f"<td>{escape(v)}</td>"
                   for v, h in zip(values, headers))


def _verdict_table(results: list[MetricResult]) -> list[str]:
    headers = [c.header for c in METRIC_COLUMNS]
    order = {"regression": 0, "noisy": 1, "improved": 2, "new": 3}
    rows = sorted(results, key=lambda r: (order.get(style_of(r), 4), trends.natural_key(r.test_id), r.metric))
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr>"]
    out += [f'<tr class="{escape(style_of(r))}">{_cells(metric_row(r), headers)}</tr>' for r in rows]
    return out + ["</table>"]


def _change_table(found: list[changepoints.ChangePoint]) -> list[str]:
    headers = ["hardware", "test", "metric", "from run", "commit", "before", "after", "unit", "change", "p", "direction"]
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr>"]
    for c in found:
        s = c.series
        values = [s.hardware_id, s.test_id, s.metric, c.point.created, c.point.commit or "?", f"{c.before:.4g}",
                  f"{c.after:.4g}", s.unit, c.shown_change, f"{c.p_value:.2g}", "worse" if c.worse else "better"]
        out.append(f'<tr class="{"worse" if c.worse else "better"}">' + "".join(
            f'<td class="num">{escape(v)}</td>' if h in ("before", "after", "change", "p") else f"<td>{escape(v)}</td>"
            for v, h in zip(values, headers)) + "</tr>")
    return out + ["</table>"]


def render(history: str, runs: list[trends.Run], found: list[changepoints.ChangePoint],
           pngs: list[tuple[str, Path]]) -> str:
    ids = ", ".join(sorted({r.hardware_id for r in runs}))
    body = [f"<h1>perfgate: {escape(history)}</h1>",
            f'<p class="summary">{len(runs)} runs from {escape(runs[0].created)} to {escape(runs[-1].created)}; '
            f"hardware ids: {escape(ids)}.</p>", "<h2>Latest verdicts</h2>"]
    for (hw, area), (run, results) in latest_by_area(runs).items():
        regressions = sum(1 for r in results if r.gated and r.outcome == "regression")
        body.append(f'<h3 id="{escape(hw)}-{escape(area)}">{escape(hw)} / {escape(area)}: '
                    f"{regressions} regression(s) in {sum(r.gated for r in results)} gated metric(s)</h3>")
        body.append(f"<p>run {escape(run.created)}, commit <code>{escape(run.commit or '?')}</code>, "
                    f"{escape(run.path.name)}{' (interrupted)' if run.interrupted else ''}</p>")
        body += _verdict_table(results)
    body.append(f"<h2>Change points ({len(found)})</h2>")
    body.append("<p>Apache Otava (E-Divisive means, t-test) over each series of run medians; "
                "tainted runs left out.</p>")
    body += _change_table(found) if found else ["<p>None found.</p>"]
    body.append("<h2>Trends</h2>")
    for title, path in pngs:
        body += [f"<h3>{escape(title)}</h3>", f'<img src="{escape(path.name)}" alt="{escape(title)}">']
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>perfgate: {escape(history)}</title><style>{STYLE}</style></head><body>\n"
            + "\n".join(body) + "\n</body></html>\n")


def write(path: Path, history: str, runs: list[trends.Run], found: list[changepoints.ChangePoint],
          pngs: list[tuple[str, Path]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(history, runs, found, pngs), encoding="utf-8")
    return path
