"""The options perfgate adds to pytest (``pytest --help``, group "performance regression gates").

Only their declaration and value checks live here; what each does is in the plugin's hooks
(perfgate.plugin), the session state (perfgate.session) and what a session writes (report.outputs).
"""
from __future__ import annotations

import argparse
import math

import pytest

from perfgate.judge.policy import GATE_MODES
from perfgate.report import run_report


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("perfgate", "performance regression gates")
    g.addoption("--perf-baselines", metavar="DIR", help="baseline folder (default: [tool.perfgate] baselines)")
    g.addoption("--perf-save", metavar="PATH", help="write this run's results as JSON")
    g.addoption("--perf-refresh", action="store_true",
                help="write this run's results as baselines for the current hardware id (the checks of "
                     "`perfgate refresh`: a committed tree, no test-only mutation, one workload)")
    g.addoption("--perf-allow-dirty", action="store_true",
                help="with --perf-refresh: accept a tree with uncommitted changes (its diff hash is the provenance)")
    g.addoption("--perf-allow-other-workload", action="store_true",
                help="with --perf-refresh: replace stored baselines that measured another workload")
    g.addoption("--perf-retries", type=int, metavar="N", help="re-measure a suspected regression up to N times")
    g.addoption("--perf-strict", action="store_true", help="fail on 'noisy' verdicts too")
    g.addoption("--perf-markdown", metavar="PATH", help="write a Markdown summary (for CI job summaries)")
    g.addoption("--perf-table", choices=run_report.TABLE_CHOICES, default="attention",
                help="which rows the terminal report lists: attention (default: regression, noisy, new, "
                     "improved, tainted), all (every metric), off (verdict and per-area counts only)")
    g.addoption("--perf-gate", choices=GATE_MODES,
                help="which metrics can fail a test: auto (ratios; absolute ones on GPU ids), all, ratios")
    g.addoption("--perf-hardware-id", metavar="ID", help="override the detected hardware id")
    g.addoption("--perf-history", metavar="DIR", help="also append this run's results to DIR (one JSON per run)")
    g.addoption("--perf-budget", type=float, metavar="MINUTES",
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


def _mib(text: str) -> float:
    """A memory budget in MiB: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give the budget in MiB as a number > 0")
    return value


def _progress_interval(text: str) -> float | None:
    """SECONDS >= 0 or 'off'; anything else names what is allowed (argparse alone said
    "invalid _progress_interval value")."""
    if text.strip().lower() == "off":
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not allowed: give seconds between progress lines as a "
                                         f"number >= 0 (0: after every test), or 'off'")
    return value
