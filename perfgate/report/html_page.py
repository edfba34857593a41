"""One static HTML page of a history: every machine, latest verdicts per area, change points, trend plots.

No server and nothing fetched: style, plots (inline SVG, perfgate.report.svg_plot) and the few lines of
script are in the page, so the folder can be uploaded as a CI artifact and opened from disk. A machine
selector shows one machine of the history (or all; ``index.html#machine=<hardware id>`` opens on one), a
filter box keeps the rows and plots whose test id or metric contains the text. Per hardware id and area the
table is the latest run that measured that area (a nightly job runs areas separately), every metric of
it, regressions highlighted (an area with a regression is open, the others one click away); then the change points Apache Otava found (perfgate.report.changepoints),
worse first; then one panel per series, grouped by metric family. Hovering a point shows its run, commit,
median, IQR and n; where the repository's URL is known (``--repo-url``, ``[tool.perfgate]
repository_url``) a commit is a link to it. Those links are the only URLs on the page.
"""
from __future__ import annotations

import re
from html import escape
from pathlib import Path
from typing import Callable
from urllib.parse import quote

from perfgate.report import changepoints, svg_plot, trends
from perfgate.report.run_report import METRIC_COLUMNS, metric_row, style_of
from perfgate.judge.metric_result import short_id
from perfgate.judge.metric_result import MetricResult

STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 2px 6px; text-align: left; overflow-wrap: anywhere; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.regression { background: #fbd5d5; font-weight: bold; }
tr.noisy { background: #fff3c4; }
tr.improved { background: #d9f2f7; }
tr.new { background: #e3e8ff; }
tr.recorded { color: #666; }
tr.worse { background: #fbd5d5; }
.summary { font-size: 1.05em; }
.controls { position: sticky; top: 0; background: #fff; padding: 0.5em 0; border-bottom: 1px solid #ddd;
            display: flex; flex-wrap: wrap; gap: 1em; align-items: center; z-index: 1; }
.controls input { width: 22em; max-width: 100%; }
.panels { display: grid; grid-template-columns: repeat(auto-fit, minmax(26em, 1fr)); gap: 0.8em; }
figure.panel { margin: 0; border: 1px solid #ddd; padding: 0.3em; min-width: 0; }
figure.panel figcaption { font-size: 0.8em; overflow-wrap: anywhere; margin-bottom: 0.2em; }
h3, h4 { overflow-wrap: anywhere; }
details > summary h3 { display: inline; }
[hidden] { display: none !important; }
"""

# the selector and the filter: hide what does not match; '#machine=ID' in the address shows one machine
SCRIPT = """
(function () {
  var select = document.getElementById('machine'), box = document.getElementById('filter');
  function apply() {
    var hw = select.value, text = box.value.trim().toLowerCase();
    document.querySelectorAll('[data-hw], [data-key]').forEach(function (e) {  // a row may have both
      var d = e.dataset;
      e.hidden = (d.hw !== undefined && hw !== '' && d.hw !== hw) ||
                 (d.key !== undefined && text !== '' && d.key.toLowerCase().indexOf(text) < 0); });
    document.querySelectorAll('.family').forEach(function (f) {
      f.hidden = !f.querySelector('.panel:not([hidden])'); });
  }
  function fromAddress() {
    var wanted = decodeURIComponent((location.hash.match(/machine=([^&]*)/) || [])[1] || '');
    if (Array.prototype.some.call(select.options, function (o) { return o.value === wanted; })) {
      select.value = wanted; }
    apply();
  }
  select.addEventListener('change', function () {  // the address names the machine: a link to this view
    history.replaceState(null, '', select.value ? '#machine=' + encodeURIComponent(select.value) : '#');
    apply(); });
  box.addEventListener('input', apply);
  window.addEventListener('hashchange', fromAddress);
  fromAddress();
})();
"""
_NUMERIC = {"baseline", "current", "change", "tol"}
_COMMIT = re.compile(r"[0-9a-f]{7,40}")

BaseOf = Callable[[trends.Series], tuple[float | None, str | None]]


def commit_link(repository_url: str | None) -> Callable[[str | None], str | None]:
    """A run's commit -> ``<repository_url>/commit/<sha>`` (GitHub, GitLab and Gitea take that path), or None:
    no URL configured, or no commit hash in the text (a dirty tree's ``<sha>-dirty-<diff>`` links its sha)."""
    def link(commit: str | None) -> str | None:
        found = _COMMIT.match(commit or "")
        if not repository_url or not found:
            return None
        return f"{repository_url.rstrip('/')}/commit/{quote(found.group(0))}"
    return link


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


def _key(test_id: str, metric: str) -> str:
    return escape(f"{test_id} {metric}")


def _commit_html(commit: str | None, link) -> str:
    shown = f"<code>{escape(commit or '?')}</code>"
    url = link(commit)
    return f'<a href="{escape(url)}">{shown}</a>' if url else shown


def _verdict_table(results: list[MetricResult]) -> list[str]:
    headers = [c.header for c in METRIC_COLUMNS]
    order = {"regression": 0, "noisy": 1, "improved": 2, "new": 3}
    rows = sorted(results, key=lambda r: (order.get(style_of(r), 4), trends.natural_key(r.test_id), r.metric))
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr>"]
    out += [f'<tr class="{escape(style_of(r))}" data-key="{_key(r.test_id, r.metric)}">'
            f"{_cells(metric_row(r), headers)}</tr>" for r in rows]
    return out + ["</table>"]


def _change_table(found: list[changepoints.ChangePoint], link) -> list[str]:
    headers = ["hardware", "test", "metric", "from run", "commit", "before", "after", "unit", "change", "p", "direction"]
    out = ["<table>", "<tr>" + "".join(f"<th>{h}</th>" for h in headers) + "</tr>"]
    for c in found:
        s = c.series
        cells = [f"<td>{escape(v)}</td>" for v in (s.hardware_id, short_id(s.test_id), s.metric, c.point.created)]
        cells.append(f"<td>{_commit_html(c.point.commit, link)}</td>")
        cells += [f'<td class="num">{escape(v)}</td>' for v in (f"{c.before:.4g}", f"{c.after:.4g}")]
        cells.append(f"<td>{escape(s.unit)}</td>")
        cells += [f'<td class="num">{escape(v)}</td>' for v in (c.shown_change, f"{c.p_value:.2g}")]
        cells.append(f"<td>{'worse' if c.worse else 'better'}</td>")
        out.append(f'<tr class="{"worse" if c.worse else "better"}" data-hw="{escape(s.hardware_id)}" '
                   f'data-key="{_key(s.test_id, s.metric)}">' + "".join(cells) + "</tr>")
    return out + ["</table>"]


def _trend_sections(runs: list[trends.Run], series: list[trends.Series], found: list[changepoints.ChangePoint],
                    base_of: BaseOf, link) -> list[str]:
    """Per machine, per metric family, one panel per series; the x axis is that machine's runs in time order."""
    by_series: dict[int, list[changepoints.ChangePoint]] = {}
    for c in found:
        by_series.setdefault(id(c.series), []).append(c)
    out = []
    for hw in sorted({s.hardware_id for s in series}):
        mine = [i for i, r in enumerate(runs) if r.hardware_id == hw]
        slots = {run: slot for slot, run in enumerate(mine)}
        labels = [f"{runs[i].created[5:10]} {runs[i].created[11:16]}".strip() for i in mine]
        families: dict[str, list[trends.Series]] = {}
        for s in series:
            if s.hardware_id == hw:
                families.setdefault(s.family, []).append(s)
        out.append(f'<section class="machine" data-hw="{escape(hw)}"><h3>{escape(hw)}: {len(mine)} run(s)</h3>')
        for family, members in families.items():
            first = members[0]
            out.append(f'<div class="family"><h4>{escape(hw)}: {escape(family)} ({escape(first.unit)}, '
                       f'{escape(first.better)} is better)</h4><div class="panels">')
            for s in members:
                base, provenance = base_of(s)
                svg = svg_plot.panel(s, slots=slots, labels=labels,
                                     base=None if base is None else (base, provenance),
                                     changes=by_series.get(id(s), []), commit_link=link)
                out.append(f'<figure class="panel" data-key="{_key(s.test_id, s.metric)}"><figcaption>'
                           f"{escape(short_id(s.test_id))}</figcaption>{svg}</figure>")
            out.append("</div></div>")
        out.append("</section>")
    return out


def render(history: str, runs: list[trends.Run], series: list[trends.Series], found: list[changepoints.ChangePoint],
           base_of: BaseOf, *, include_tainted: bool = False, repository_url: str | None = None) -> str:
    link = commit_link(repository_url)
    machines = sorted({r.hardware_id for r in runs})
    options = "".join(f'<option value="{escape(hw)}">{escape(hw)}</option>' for hw in machines)
    body = [f"<h1>perfgate: {escape(history)}</h1>",
            f'<p class="summary">{len(runs)} runs of {len(machines)} machine(s) from {escape(runs[0].created)} to '
            f"{escape(runs[-1].created)}: {escape(', '.join(machines))}.</p>",
            '<div class="controls"><label>machine <select id="machine"><option value="">every machine '
            f'({len(machines)})</option>{options}</select></label><label>filter <input id="filter" type="search" '
            'placeholder="test id or metric, e.g. all_reduce"></label></div>',
            "<h2>Latest verdicts</h2>"]
    for (hw, area), (run, results) in latest_by_area(runs).items():
        regressions = sum(1 for r in results if r.gated and r.outcome == "regression")
        body.append(f'<details data-hw="{escape(hw)}"{" open" if regressions else ""}><summary><h3 '
                    f'id="{escape(hw)}-{escape(area)}">{escape(hw)} / {escape(area)}: {regressions} regression(s) '
                    f"in {sum(r.gated for r in results)} gated metric(s)</h3></summary>")
        body.append(f"<p>run {escape(run.created)}, commit {_commit_html(run.commit, link)}, "
                    f"{escape(run.path.name)}{' (interrupted)' if run.interrupted else ''}</p>")
        body += _verdict_table(results) + ["</details>"]
    body.append(f"<h2>Change points ({len(found)})</h2>")
    body.append("<p>Apache Otava (E-Divisive means, t-test) over each series of run medians; "
                + ("tainted runs counted (--include-tainted)." if include_tainted else "tainted runs left out.")
                + "</p>")
    body += _change_table(found, link) if found else ["<p>None found.</p>"]
    body.append("<h2>Trends</h2>")
    body.append("<p>Run medians with their interquartile range; the baseline as a green band (median ± tolerance); "
                "hollow: tainted run; red cross: regression verdict; vertical line: change point. Hover a point "
                "for its run, commit and values" + (", click it for its commit." if repository_url else ".") + "</p>")
    body += _trend_sections(runs, series, found, base_of, link)
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">"
            f"<title>perfgate: {escape(history)}</title><style>{STYLE}{svg_plot.STYLE}</style></head><body>\n"
            + "\n".join(body) + f"\n<script>{SCRIPT}</script>\n</body></html>\n")


def write(path: Path, history: str, runs: list[trends.Run], series: list[trends.Series],
          found: list[changepoints.ChangePoint], base_of: BaseOf, *, include_tainted: bool = False,
          repository_url: str | None = None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(history, runs, series, found, base_of, include_tainted=include_tainted,
                           repository_url=repository_url), encoding="utf-8")
    return path
