"""`perfgate report HISTORY_DIR`: trend plots (PNG per metric family) and a Markdown page.

Each plot shows, per test id, the run medians over time with their interquartile range,
the baseline as a band (median +- tolerance), tainted runs as hollow markers and the
sustained step changes that perfgate.report.trends found. The page lists the runs, the step
changes and links every plot, so a nightly job can publish it as an artifact.
"""
from __future__ import annotations

import argparse
import math
import re
from pathlib import Path

from perfgate.store import interrupts
from perfgate.report import trends
from perfgate.report.textable import printable
from perfgate.store.baselines import BaselineStore
from perfgate.judge.config import load_settings
from perfgate.machine.hardware_id import check_hardware_id
from perfgate.store.results import area_of

MAX_PANELS = 16  # per PNG; larger families are split into parts
_COLS = 4


def register(sub) -> None:
    p = sub.add_parser("report", help="plot a history folder of results (trends, step changes)")
    p.add_argument("history", type=Path, help="folder of results JSONs (pytest --perf-history DIR)")
    p.add_argument("--out", type=Path, help="output folder (default: HISTORY/report)")
    p.add_argument("--baselines", type=Path, help="baseline folder for the bands (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--hardware-id", help="only this hardware id (default: every id in the history)")
    p.add_argument("--min-run", type=int, default=3, help="consecutive runs a step must last (default 3)")
    p.add_argument("--window", type=int, default=5, help="runs forming the reference level (default 5)")
    p.add_argument("--noise-k", type=float, default=3.0,
                   help="a step must also exceed this many run-to-run spreads of the reference runs (default 3; "
                        "0: tolerance only)")
    p.add_argument("--include-tainted", action="store_true", help="let tainted runs count for step detection")
    p.add_argument("--fail-on-worse-step", action="store_true", help="exit 1 when a worse step change is found")
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


def _band(series: trends.Series, base: float) -> tuple[float, float]:
    if series.absolute:
        return base - series.tol, base + series.tol
    return base * (1 - series.tol), base * (1 + series.tol)


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


def plot_family(series: list[trends.Series], steps: list[trends.StepChange], runs: list[trends.Run],
                store: BaselineStore | None, path: Path, title: str) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(series)
    cols = min(_COLS, n)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.4 * cols, 3.2 * rows + 0.6), squeeze=False)
    by_series = {}
    for st in steps:
        by_series.setdefault(id(st.series), []).append(st)
    for k, s in enumerate(series):
        ax = axes[k // cols][k % cols]
        xs = [p.run for p in s.points]
        ys = [p.median for p in s.points]
        base, prov = baseline_for(store, s)
        if base is not None:
            lo, hi = _band(s, base)
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
        for st in by_series.get(id(s), []):
            color = "tab:red" if st.worse else "tab:cyan"
            x = st.point.run
            ax.axvline(x - 0.5, color=color, lw=1.5)
            change = f"{st.change:+.3f}" if s.absolute else f"{st.change:+.1%}"
            ax.annotate(f"step {change}", xy=(x - 0.5, 1.0), xycoords=("data", "axes fraction"),
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
    fig.suptitle(f"{title}  ({first.unit}, {first.better} is better)", fontsize=11)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _md_escape(text: str) -> str:
    return printable(text).replace("|", "\\|")


def render(history: Path, out: Path, *, store: BaselineStore | None, hardware_id: str | None = None,
           min_run: int = 3, window: int = 5, include_tainted: bool = False,
           noise_k: float = 3.0) -> tuple[Path, list[Path], list]:
    """Write the plots and the page; returns (page, pngs, step changes)."""
    runs = trends.load_history(history)
    if not runs:
        raise ValueError(f"{history}: no results JSONs; write some with `pytest --perf-history {history}`")
    series = trends.build_series(runs, hardware_id=hardware_id)
    steps = trends.all_steps(series, min_run=min_run, window=window, include_tainted=include_tainted,
                             noise_k=noise_k)
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
            part_steps = [st for st in steps if any(st.series is s for s in part)]
            pngs.append((title, plot_family(part, part_steps, runs, store, out / name, title)))
    lines = [f"# perfgate trends: `{history}`", "",
             f"{len(runs)} runs from {runs[0].created} to {runs[-1].created}; hardware ids: "
             + ", ".join(sorted({r.hardware_id for r in runs})) + ".", "",
             f"Step change: the median moved beyond the metric's tolerance (and beyond {noise_k:g} run-to-run "
             f"spreads of the reference runs) and stayed there for at least {min_run} consecutive runs, against "
             f"the median of up to {window} runs before it"
             + ("" if include_tainted else " (tainted runs left out)") + ".", "", "## Step changes", ""]
    if steps:
        lines += ["| hardware | test | metric | from run | before | after | change | direction | sustained |",
                  "|---|---|---|---|---:|---:|---:|---|---:|"]
        for st in sorted(steps, key=lambda x: (not x.worse, x.series.test_id)):
            s = st.series
            change = f"{st.change:+.3f}" if s.absolute else f"{st.change:+.1%}"
            lines.append(f"| {s.hardware_id} | `{_md_escape(s.test_id)}` | {_md_escape(s.metric)} | {st.point.created} "
                         f"`{st.point.commit or '?'}` | {st.before:.4g} | {st.after:.4g} | {change} | "
                         f"{'**worse**' if st.worse else 'better'} | {st.length} runs |")
    else:
        lines.append("None found.")
    lines += ["", "## Runs", "", "| # | created | commit | hardware | metrics | regressions | tainted | file |",
              "|---:|---|---|---|---:|---:|---:|---|"]
    for i, r in enumerate(runs):
        regs = sum(1 for x in r.results if x.outcome == "regression" and x.gated)
        tainted = sum(1 for x in r.results if x.tainted)
        note = " (interrupted)" if r.interrupted else ""
        lines.append(f"| {i} | {r.created}{note} | `{r.commit or '?'}` | {r.hardware_id} | {len(r.results)} | "
                     f"{regs} | {tainted} | {r.path.name} |")
    lines += ["", "## Plots", ""]
    for title, path in pngs:
        lines += [f"### {_md_escape(title)}", "", f"![{_md_escape(title)}]({path.name})", ""]
    page = out / "index.md"
    page.write_text("\n".join(lines) + "\n")
    return page, [p for _, p in pngs], steps


def run(args: argparse.Namespace) -> int:
    out = args.out or (args.history / "report")
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None)
    store = BaselineStore(settings.baselines) if settings.baselines.is_dir() else None
    if args.hardware_id is not None:
        check_hardware_id(args.hardware_id, source="--hardware-id")
    with interrupts.writing(f"the report in {out}", hold=False):  # plots take a while: Ctrl-C stops them
        page, pngs, steps = render(args.history, out, store=store, hardware_id=args.hardware_id,
                                   min_run=args.min_run, window=args.window, include_tainted=args.include_tainted,
                                   noise_k=args.noise_k)
    print(f"wrote {page} and {len(pngs)} plot(s) in {out}")
    for st in steps:
        print(printable(("WORSE " if st.worse else "better ") + st.describe()))  # ids from files: escaped
    return 1 if args.fail_on_worse_step and any(st.worse for st in steps) else 0
