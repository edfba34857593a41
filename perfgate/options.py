"""The options perfgate adds to pytest (``pytest --help``, group "performance regression gates").

Only their declaration and value checks live here; what each does is in the plugin's hooks
(perfgate.plugin), the session state (perfgate.session) and what a session writes (report.outputs).
"""
from __future__ import annotations

import argparse
import math
import os
from pathlib import Path

import pytest

from perfgate.judge.policy import GATE_MODES
from perfgate.report import run_report
from perfgate.store.baseline_writer import SESSION_CHECKS, add_check_options


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("perfgate", "performance regression gates")
    g.addoption("--perf-baselines", metavar="DIR", help="baseline folder (default: [tool.perfgate] baselines)")
    g.addoption("--perf-save", type=output_file, metavar="PATH", help="write this run's results as JSON")
    g.addoption("--perf-refresh", action="store_true",
                help="write this run's results as baselines for the current hardware id (the checks of "
                     "`perfgate refresh`: a committed tree, no test-only mutation, one workload)")
    add_check_options(g.addoption, SESSION_CHECKS, prefix="--perf-", when="with --perf-refresh: ")
    g.addoption("--perf-retries", type=number("the re-measurements", at_least=0, whole=True), metavar="N",
                help="re-measure a suspected regression up to N times")
    g.addoption("--perf-strict", action="store_true", help="fail on 'noisy' verdicts too")
    g.addoption("--perf-markdown", type=output_file, metavar="PATH",
                help="write a Markdown summary (for CI job summaries)")
    g.addoption("--perf-table", choices=run_report.TABLE_CHOICES, default="attention",
                help="which rows the terminal report lists: attention (default: regression, noisy, new, "
                     "improved, tainted), all (every metric), off (verdict and per-area counts only)")
    g.addoption("--perf-gate", choices=GATE_MODES,
                help="which metrics can fail a test: auto (ratios; absolute ones on GPU ids), all, ratios")
    g.addoption("--perf-hardware-id", metavar="ID", help="override the detected hardware id")
    g.addoption("--perf-history", type=history_store, metavar="STORE",
                help="also push this run's results to this results store: a folder (DIR/<hardware-id>/<name>.json.gz), "
                     "an SQLite file (*.sqlite) or a postgresql:// URL; `perfgate trends/report --store` read it")
    g.addoption("--perf-budget", type=number("the budget in minutes", above=0), metavar="MINUTES",
                help="stop starting new tests once this many minutes are spent; report the rest")
    g.addoption("--perf-allow-tainted", action="store_true",
                help="gate metrics even when the machine was found busy or throttled (preflight or while measuring)")
    g.addoption("--perf-preflight", choices=("auto", "on", "off"), default="auto",
                help="check the machine is quiet before the session (perfgate.machine.preflight; auto: on for GPU "
                     "hardware ids) and, with auto or on on every id, watch it while each test measures "
                     "(perfgate.machine.load_watch); results of a busy machine are labelled tainted and not "
                     "gated. off: neither")
    g.addoption("--perf-rss-budget", type=_mib, metavar="MIB",
                help="fail a serving test whose vLLM server's process tree (server, engine core, workers) "
                     "reached a peak RSS above MIB MiB while it measured (default: the serving profile's "
                     "server_rss_budget_mib; perfgate/workloads/serving/server_memory.py)")
    g.addoption("--perf-progress", type=_progress_interval, default=30.0, metavar="SECONDS",
                help="print a progress line with the estimated time left at most every SECONDS "
                     "(0: after every test; 'off': never). Default 30")


def number(what: str, *, above: float | None = None, at_least: float | None = None, below: float | None = None,
           at_most: float | None = None, whole: bool = False, also: str = ""):
    """An argparse ``type``: the option's text as a finite number (an int when ``whole``) within the bounds
    given, or an error naming what is allowed: the one way perfgate checks a number given on its command
    lines (perfgate's commands and its pytest options), as they are parsed, before any work starts.
    `perfgate calibrate --k nan` (or -3, or --fraction-floor -1) once ran N pytest sessions, printed
    tolerances made from it and refused only at --write. ``also``: an extra word that is allowed ('off')."""
    bounds = [f"{word} {bound:g}" for word, bound in ((">", above), (">=", at_least), ("<", below),
                                                      ("<=", at_most)) if bound is not None]
    allowed = f"{'a whole' if whole else 'a'} number{' ' + ' and '.join(bounds) if bounds else ''}"

    def parse(text: str):
        try:
            value = int(text) if whole else float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (above is None or value > above) and (at_least is None or value >= at_least)
                and (below is None or value < below) and (at_most is None or value <= at_most)):
            raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give {what} as {allowed}{also}")
        return value
    parse.__name__ = what.split(",")[0]  # argparse names the type in some messages
    parse.allowed = allowed  # what it takes (tests find every number-typed option by it)
    return parse


def _writable_place(text: str, *, folder: bool) -> Path:
    path = Path(text)
    if path.is_dir() and not folder:
        raise argparse.ArgumentTypeError(f"{text!r} is a folder: give the path of a file in it (e.g. "
                                         f"{(path / 'results.json').as_posix()})")
    if path.exists() and not path.is_dir() and folder:
        raise argparse.ArgumentTypeError(f"{text!r} is a file: give a folder (it is created if missing)")
    parent = (path if folder else path.parent).absolute()
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text!r}: {parent} is not a folder, so nothing can be written there; "
                                         f"give another path")
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text!r}: {parent} is not writable by this user; give a path you may "
                                         f"write to")
    return path


def output_file(text: str) -> Path:
    """An argparse ``type`` for a file a command writes when it ends (``--save``, ``--perf-markdown``): said
    as parsed when it cannot be written there (a folder, a parent that is a file or read-only), not after
    every round or test has run."""
    return _writable_place(text, folder=False)


def output_folder(text: str) -> Path:
    """As :func:`output_file`, for a folder a command writes into (``--keep``, ``--perf-history``)."""
    return _writable_place(text, folder=True)


def history_store(text: str) -> str:
    """``--perf-history``: a results store (perfgate.store.backends): a database URL as given, else a folder
    or an SQLite file this user can write, checked as parsed like every output."""
    from perfgate.store.backends import SQLITE_SUFFIXES, is_url

    if not is_url(text):
        (output_file if Path(text).suffix in SQLITE_SUFFIXES else output_folder)(text)
    return text


_mib = number("the budget in MiB", above=0)
_seconds_between = number("seconds between progress lines", at_least=0, also=" (0: after every test), or 'off'")


def _progress_interval(text: str) -> float | None:
    """SECONDS >= 0 or 'off'."""
    return None if text.strip().lower() == "off" else _seconds_between(text)
