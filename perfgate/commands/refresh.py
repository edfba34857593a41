"""`perfgate refresh RESULTS.json`: turn a run's results into baselines, after review.

Shows old vs new per metric with provenance and software versions, then writes only
after confirmation (or --yes). It writes only the results' own hardware id folder, so
a machine change creates a new folder and leaves every other one untouched; the file it
replaces is kept as ``<area>.json.prev``.

Several results files are pooled (perfgate.results.pool), each metric keeping one summary
per run for the between-run noise model; a gated metric whose run medians disagree beyond
its tolerance stops the refresh with the runs side by side (``--force`` pools them anyway),
and runs from an uncommitted tree need ``--allow-dirty``.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from perfgate import results as results_mod
from perfgate import run_noise
from perfgate.baselines import BaselineStore
from perfgate.config import load_settings
from perfgate.report import _fmt, short_id


def register(sub) -> None:
    p = sub.add_parser("refresh", help="write baselines from a results file (shows a diff first)")
    p.add_argument("results", type=Path, nargs="+",
                   help="results JSON written by `pytest --perf-save`; several runs of one hardware id are pooled")
    p.add_argument("--baselines", type=Path, help="baseline folder (default: [tool.perfgate] baselines)")
    p.add_argument("--root", type=Path, default=Path.cwd(), help="project root holding pyproject.toml")
    p.add_argument("--yes", "-y", action="store_true", help="write without asking")
    p.add_argument("--include-tainted", action="store_true", help="also take metrics measured on a busy machine")
    p.add_argument("--force", action="store_true",
                   help="pool runs even where their medians disagree beyond the tolerance")
    p.add_argument("--allow-dirty", action="store_true",
                   help="accept runs measured on a tree with uncommitted changes (commit ends in -dirty-<diff hash>)")
    p.set_defaults(func=run)


def _software_line(sw: dict | None) -> str:
    if not sw:
        return "?"
    return ", ".join(f"{k} {v}" for k, v in sw.items() if v and k in ("torch", "nccl", "driver", "cuda_driver",
                                                                        "vllm", "megatron_core", "python"))


def run(args: argparse.Namespace) -> int:
    docs = [results_mod.load(p) for p in args.results]
    for p, d in zip(args.results, docs):
        if d.get("interrupted"):
            raise ValueError(f"{p} comes from an interrupted run; re-run to completion before refreshing")
        if d.get("ab"):
            raise ValueError(f"{p} is a `perfgate ab` comparison (per-round medians of two environments), not a "
                             f"run; refresh from `pytest --perf-save` results")
    dirty = [f"{p} (commit {d.get('commit')})" for p, d in zip(args.results, docs)
             if "-dirty" in (d.get("commit") or "")]
    if dirty and not args.allow_dirty:
        raise ValueError(f"measured on an uncommitted tree: {', '.join(dirty)}; commit and re-run, "
                         f"or pass --allow-dirty to record the dirty tree's commit and diff hash as provenance")
    doc = results_mod.pool(docs, [str(p) for p in args.results], include_tainted=args.include_tainted)
    clash = _disagreeing(doc)
    if clash and not args.force:
        Console(width=200).print(_disagreement_table(clash, [str(p) for p in args.results]))
        print(f"not written: {len(clash)} gated metric(s) whose run medians disagree beyond their tolerance "
              f"(one run would fail against another); find out why, or pass --force to pool them anyway",
              file=sys.stderr)
        return 1
    settings = load_settings(args.root, args.baselines.resolve() if args.baselines else None)
    store = BaselineStore(settings.baselines)
    hw = doc["hardware_id"]
    by_area = results_mod.baseline_entries(doc, include_tainted=args.include_tainted)
    if not by_area:
        print(f"{', '.join(map(str, args.results))}: no metrics to refresh")
        return 0
    console = Console(width=160)
    others = [h for h in store.hardware_ids() if h != hw]
    if hw not in store.hardware_ids():
        console.print(f"hardware id [bold]{escape(hw)}[/] has no baselines yet: a new folder "
                      f"{store.root / hw} will be created; existing folders ({', '.join(others) or 'none'}) "
                      f"stay untouched")
    changes = 0
    for area, entries in sorted(by_area.items()):
        old = store.load(hw, area)
        old_doc = store.document(hw, area)
        t = Table(title=f"{hw}/{area}.json", header_style="bold")
        for col in ("test", "metric", "old", "new", "unit", "change", "runs", "old provenance"):
            t.add_column(col)
        for test, metrics in sorted(entries.items()):
            for name, new in sorted(metrics.items()):
                prev = old.get(test, {}).get(name)
                change = "new"
                if prev is not None and prev.summary.median:
                    change = f"{(new.summary.median / prev.summary.median - 1) * 100:+.1f}%"
                prov = f"{prev.provenance}, {prev.when}, {prev.commit}" if prev else "-"
                t.add_row(escape(short_id(test)), name, _fmt(prev.summary.median if prev else None),
                          _fmt(new.summary.median), new.unit, change, str(len(new.runs)), escape(prov))
                changes += 1
        console.print(t)
        old_sw = ((old_doc.get("fingerprint") or {}).get("software")) if old_doc else None
        if old_sw:
            console.print(f"  old software: {_software_line(old_sw)}")
    console.print(f"  new software: {_software_line((doc.get('fingerprint') or {}).get('software'))}; "
                  f"commit {doc.get('commit')}, measured {doc.get('created')}")
    if not args.yes:
        if not sys.stdin.isatty():
            print("not written: pass --yes to write without a terminal to confirm on", file=sys.stderr)
            return 1
        answer = input(f"write {changes} metric(s) to {store.root / hw}? [y/N] ").strip().lower()
        if answer not in ("y", "yes"):
            print("not written")
            return 1
    for area, entries in sorted(by_area.items()):
        path = store.write(hw, area, entries, fingerprint=doc.get("fingerprint"))
        print(f"wrote {path}" + (f" (previous kept as {path.name}.prev)" if Path(str(path) + '.prev').exists() else ""))
    return 0


def _disagreeing(doc: dict) -> list[dict]:
    """Gated metrics pooled from runs whose medians would fail against one another."""
    out = []
    for r in doc.get("results", []):
        runs = r.get("runs") or []
        if r.get("gated", True) and run_noise.disagree([x["median"] for x in runs], r["tol"],
                                                       absolute=r["unit"] == "fraction"):
            out.append(r)
    return out


def _disagreement_table(clash: list[dict], files: list[str]) -> Table:
    t = Table(title="runs that disagree beyond tolerance (not pooled)", header_style="bold")
    for col in ("test", "metric", "unit", "tol", *files):
        t.add_column(col, overflow="fold")
    for r in clash:
        by_file = {x.get("file"): x["median"] for x in r["runs"]}
        tol = f"{r['tol']:.3f}" if r["unit"] == "fraction" else f"{r['tol'] * 100:.0f}%"
        t.add_row(escape(short_id(r["test_id"])), r["metric"], r["unit"], tol,
                  *(_fmt(by_file.get(f)) for f in files))
    return t
