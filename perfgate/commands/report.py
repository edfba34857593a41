"""`perfgate report HISTORY...`: trend plots (PNG per metric family), a Markdown page, an HTML page.

Each plot shows, per test id, the run medians over time with their interquartile range,
the baseline as a band (median +- tolerance), tainted runs as hollow markers and the change
points Apache Otava found (perfgate.report.changepoints). ``--out DIR`` writes the Markdown
page (runs, change points, PNG plots); ``--html DIR`` one static page (perfgate.report.html_page:
every machine with a selector, per area the latest run's verdicts, regressions highlighted, then
the change points and every series as an SVG panel whose points show their values and link their
commits (``--repo-url``); no server, nothing fetched), which the nightly job uploads.
"""
from __future__ import annotations

import argparse
import math
import re
import textwrap
from pathlib import Path

from perfgate.commands.trends import (add_detection_options, add_fail_on_worse, detect, exit_status, headline,
                                     history_name)
from perfgate.report.run_report import md_code, md_text
from perfgate.report.textable import printable
from perfgate.judge.config import repository_url
from perfgate.store.settings import load_settings
from perfgate.report import changepoints, html_page, trends
from perfgate import interrupts
from perfgate.store.baselines import BaselineStore
from perfgate.judge.metric_result import area_of
from perfgate.store.safe_paths import outside_root

MAX_PANELS = 16  # per PNG; larger families are split into parts
_COLS = 4


def register(sub) -> None:
    p = sub.add_parser("report", help="plot a history of results: trends, change points, an HTML page")
    p.add_argument("history", nargs="*", type=Path,
                   help="history folders (pytest --perf-history DIR) or results files (--perf-save); none: "
                        "the results store (--store), every machine in it")
    p.add_argument("--out", type=Path, help="Markdown page and plots here (default: HISTORY/report, "
                                            "unless --html is given)")
    p.add_argument("--html", type=Path, metavar="DIR", help="one static HTML page and its plots here")
    p.add_argument("--baselines", type=Path, help="baseline folder for the bands (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--repo-url", type=repository_url, metavar="URL",
                   help="the repository's web address: the page links each commit as URL/commit/<sha> "
                        "(default: [tool.perfgate] repository_url; none: commits are plain text)")
    add_detection_options(p)
    add_fail_on_worse(p)
    p.set_defaults(func=run)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("_")[:120]


def _panel_title(test_id: str) -> str:
    tail = test_id.split("::")[-1]
    m = re.search(r"\[(.*)\]$", tail)
    return m.group(1) if m else tail


def _tick(run: trends.Run) -> str:
    """'11-30 02:43' over the short commit: enough to find the run, short enough to read."""
    when = f"{run.created[5:10]} {run.created[11:16]}" if len(run.created) >= 16 else run.created
    return f"{when}\n{(run.commit or '?')[:7]}"


def baseline_for(store: BaselineStore | None, s: trends.Series) -> tuple[float | None, str | None]:
    """The committed baseline wins (it is what the next run is judged against); else the last run's."""
    if store is not None:
        try:
            entry = store.lookup(s.hardware_id, area_of(s.test_id), s.test_id, s.metric)
        except ValueError:
            entry = None
        if entry is not None:
            return entry.summary.median, entry.provenance
    return s.baseline_median, s.baseline_provenance


def plot_family(series: list[trends.Series], found: list[changepoints.ChangePoint], runs: list[trends.Run],
                store: BaselineStore | None, path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series)
    cols = min(_COLS, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows + 0.6), squeeze=False)
    by_series = {}
    for c in found:
        by_series.setdefault(id(c.series), []).append(c)
    for k, s in enumerate(series):
        ax = axes[k // cols][k % cols]
        xs = [p.run for p in s.points]
        ys = [p.median for p in s.points]
        base, prov = baseline_for(store, s)
        if base is not None:
            lo, hi = s.band(base)
            ax.axhspan(lo, hi, color="tab:green", alpha=0.15, lw=0,
                       label=f"baseline ± {s.tol:.3g}" if s.absolute else f"baseline ± {s.tol:.0%}")
            ax.axhline(base, color="tab:green", ls="--", lw=1)
        ax.plot(xs, ys, color="tab:blue", lw=1, alpha=0.6)
        clean = [p for p in s.points if not p.tainted]
        dirty = [p for p in s.points if p.tainted]
        if clean:
            ax.errorbar([p.run for p in clean], [p.median for p in clean],
                        yerr=[[p.median - p.q1 for p in clean], [p.q3 - p.median for p in clean]],
                        fmt="o", ms=4, color="tab:blue", ecolor="tab:blue", elinewidth=0.8, capsize=2,
                        label="run median (IQR)")
        if dirty:
            ax.plot([p.run for p in dirty], [p.median for p in dirty], "o", ms=6, mfc="none", color="grey",
                    label="tainted run")
        reg = [p for p in s.points if p.outcome == "regression"]
        if reg:
            ax.plot([p.run for p in reg], [p.median for p in reg], "x", ms=8, color="tab:red",
                    label="regression verdict")
        for c in by_series.get(id(s), []):
            color = "tab:red" if c.worse else "tab:cyan"
            x = c.point.run
            ax.axvline(x - 0.5, color=color, lw=1.5)
            ax.annotate(f"{c.shown_change} p={c.p_value:.1g}", xy=(x - 0.5, 1.0), xycoords=("data", "axes fraction"),
                        xytext=(3, -12), textcoords="offset points", color=color, fontsize=8)
        ax.set_title(_panel_title(s.test_id), fontsize=9)
        ax.set_ylabel(s.unit, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_xlim(-0.5, max(len(runs) - 0.5, 0.5))
        ax.grid(alpha=0.3)
        if k == 0:
            ax.legend(fontsize=6, loc="best")
    for k in range(n, rows * cols):
        axes[k // cols][k % cols].axis("off")
    ticks = list(range(len(runs)))
    step = max(1, math.ceil(len(ticks) / 6))
    for row in axes:
        for ax in row:
            if ax.axison:
                ax.set_xticks(ticks[::step])
                ax.set_xticklabels([_tick(runs[i]) for i in ticks[::step]], fontsize=6, rotation=30, ha="right")
    first = series[0]
    heading = f"{title}  ({first.unit}, {first.better} is better)"  # wrapped: a long one overran both edges
    fig.suptitle("\n".join(textwrap.wrap(heading, max(int(4.4 * cols * 72 / 6.6), 30))), fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(out: Path, runs: list[trends.Run], series: list[trends.Series],
                found: list[changepoints.ChangePoint], store: BaselineStore | None) -> list[tuple[str, Path]]:
    """One PNG per (hardware id, metric family), split every MAX_PANELS test ids; (title, path) each."""
    out.mkdir(parents=True, exist_ok=True)
    families: dict[tuple[str, str], list[trends.Series]] = {}
    for s in series:
        families.setdefault((s.hardware_id, s.family), []).append(s)
    pngs: list[tuple[str, Path]] = []
    for (hw, family), members in sorted(families.items()):
        parts = [members[i:i + MAX_PANELS] for i in range(0, len(members), MAX_PANELS)]
        for j, part in enumerate(parts):
            suffix = f"-part{j + 1}" if len(parts) > 1 else ""
            name = f"{_slug(hw)}__{_slug(family)}{suffix}.png"
            title = f"{hw}: {family}" + (f" (part {j + 1}/{len(parts)})" if len(parts) > 1 else "")
            part_found = [c for c in found if any(c.series is s for s in part)]
            pngs.append((title, plot_family(part, part_found, runs, store, out / name, title)))
    return pngs


def markdown_page(history: str, runs: list[trends.Run], found: list[changepoints.ChangePoint],
                  pngs: list[tuple[str, Path]], args: argparse.Namespace) -> str:
    lines = [f"# perfgate trends: `{history}`", "",
             f"{len(runs)} runs from {runs[0].created} to {runs[-1].created}; hardware ids: "
             + ", ".join(sorted({r.hardware_id for r in runs})) + ".", "",
             f"Change points (Apache Otava, E-Divisive means on the logarithms of the run medians): the runs "
             f"before and after differ with a t-test p-value below {args.max_pvalue:g}, and the medians of the two "
             f"segments (the levels shown) by more than {args.min_magnitude:.0%}"
             + ("" if args.include_tainted else " (tainted runs left out)") + ".", "", "## Change points", ""]
    if found:
        lines += ["| hardware | test | metric | from run | before | after | change | p | direction |",
                  "|---|---|---|---|---:|---:|---:|---:|---|"]
        for c in found:
            s = c.series
            lines.append(f"| {md_text(s.hardware_id)} | {md_code(s.test_id)} | {md_text(s.metric)} | "
                         f"{md_text(c.point.created)} {md_code(c.point.commit or '?')} | {c.before:.4g} | "
                         f"{c.after:.4g} | {c.shown_change} | "
                         f"{c.p_value:.2g} | {'**worse**' if c.worse else 'better'} |")
    else:
        lines.append("None found.")
    lines += ["", "## Runs", "", "| # | created | commit | hardware | metrics | regressions | tainted | file |",
              "|---:|---|---|---|---:|---:|---:|---|"]
    for i, r in enumerate(runs):
        regs = sum(1 for x in r.results if x.outcome == "regression" and x.gated)
        tainted = sum(1 for x in r.results if x.tainted)
        note = " (interrupted)" if r.interrupted else ""
        lines.append(f"| {i} | {md_text(r.created)}{note} | {md_code(r.commit or '?')} | {md_text(r.hardware_id)} | "
                     f"{len(r.results)} | {regs} | {tainted} | {md_text(r.path.name)} |")
    lines += ["", "## Plots", ""]
    for title, path in pngs:
        lines += [f"### {md_text(title)}", "", f"![{md_text(title)}]({path.name})", ""]
    return "\n".join(lines) + "\n"


def run(args: argparse.Namespace) -> int:
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None)
    store = BaselineStore(settings.baselines) if settings.baselines.is_dir() else None
    if not args.history and args.out is None and args.html is None:
        raise ValueError("a report of a results store needs --html DIR or --out DIR (there is no history folder "
                         "to write beside)")
    runs, series, found = detect(args)
    history = history_name(args)
    first = args.history[0] if args.history else None
    outs = [d for d in (args.out, args.html) if d is not None] or [(first if first.is_dir() else first.parent) / "report"]
    for option, out in [(o, d) for o, d in (("--out", args.out), ("--html", args.html)) if d is not None] \
            or [("--out", outs[0])]:  # the default, beside a history that lies in the baselines
        outside_root(settings.baselines, out, option=option, example=f"reports/{out.name}")
    with interrupts.writing(f"the report in {', '.join(map(str, outs))}", hold=False):  # Ctrl-C stops the plots
        if args.html is not None:
            page = html_page.write(args.html / "index.html", history, runs, series, found,
                                   lambda s: baseline_for(store, s), include_tainted=args.include_tainted,
                                   repository_url=args.repo_url or settings.repository_url)
            print(f"wrote {page}: {len({r.hardware_id for r in runs})} machine(s), {len(series)} plot(s)")
        if args.out is not None or args.html is None:
            out = outs[0]
            pngs = write_plots(out, runs, series, found, store)
            page = out / "index.md"
            page.write_text(markdown_page(history, runs, found, pngs, args))
            print(f"wrote {page} and {len(pngs)} plot(s) in {out}")
    print(headline(args, runs, series, found))
    for c in found:
        print(printable(("WORSE " if c.worse else "better ") + c.describe()))  # ids from files: escaped
    return exit_status(args, found)
