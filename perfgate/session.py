"""One pytest session's perfgate state: settings, hardware id, baselines, results so far.

Built once per process in ``pytest_configure`` (the controller and each xdist worker); the
plugin's hooks read and add to it. Bad input (a malformed baseline of this id, a bad option,
a planted-bug knob with --perf-refresh) stops the session here, before anything runs.
"""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from perfgate.judge.baseline_choice import BaselineChooser
from perfgate.store.settings import load_settings
from perfgate.judge.gate import Context
from perfgate.judge.load_bound import ForeignLoad
from perfgate.judge.policy import GatePolicy
from perfgate.machine import hardware
from perfgate.machine.hardware_id import resolve_hardware_id
from perfgate.machine.load_watch import LoadWatch
from perfgate.report.progress import SweepProgress
from perfgate.runcache import RunCache
from perfgate.store.baselines import BaselineStore
from perfgate.judge.metric_result import MetricResult

WORKER_KEY = "perfgate"  # what the xdist controller hands its workers in workerinput


class PerfState:
    def __init__(self, config: pytest.Config):
        opt = config.getoption
        baselines_dir = Path(opt("--perf-baselines")) if opt("--perf-baselines") else None
        self.hardware_id = resolve_hardware_id(opt("--perf-hardware-id"))
        self.settings = load_settings(Path(config.rootpath), baselines_dir, self.hardware_id)  # once
        if opt("--perf-retries") is not None:  # a whole number >= 0, checked as parsed (options.number)
            self.settings.retries = opt("--perf-retries")
        if opt("--perf-gate"):
            self.settings.gate = opt("--perf-gate")
        budget = opt("--perf-budget")  # > 0 and finite, checked as parsed (NaN compared false and never stopped)
        self.budget_s = budget * 60 if budget else None
        # Wall clock, so that xdist workers can count the budget from the controller's start.
        self.started_wall = time.time()
        self.strict = bool(opt("--perf-strict"))
        self.allow_tainted = bool(opt("--perf-allow-tainted"))
        self.policy = GatePolicy.of(self.hardware_id, self.settings)  # after --perf-gate
        self.store = BaselineStore(self.settings.baselines)
        self.chooser = BaselineChooser(self.store, self.hardware_id, hardware.fingerprint)
        self._check_baselines()
        self.results: list[MetricResult] = []
        self.attachments: dict[str, dict] = {}
        self.skipped_by_budget: list[str] = []
        self.interrupted = False
        self.tainted: list[str] = []
        self.progress = SweepProgress(budget_s=self.budget_s)
        self.refresh_note: str | None = None
        self.refresh_failed = False  # --perf-refresh wrote nothing (or stopped): the session must not pass
        self.save_note: str | None = None
        self.old_sigterm = None
        # Watched on every hardware id (also cpu-*, where the preflight is off under auto):
        # a job that starts mid-session taints what is measured beside it.
        self.watch = LoadWatch(enabled=opt("--perf-preflight") != "off")
        self.runs = RunCache(self.watch)
        # what the suite's test modules import (machine.suite_packages); None until first needed
        self.packages: dict[str, str] | None = None

    def software(self) -> dict:
        """perfgate's stack (machine.hardware) and, as ``packages``, the versions of what the measured
        code imports: what a results file, a baseline's provenance and a regression line name."""
        software = dict(hardware.fingerprint()["software"])
        if self.packages:  # None (nothing judged) or {} (nothing installed imported): not known, not written
            software["packages"] = dict(self.packages)
        return software

    def _check_baselines(self) -> None:
        """Read every baseline file of this hardware id (and of its family, whose ratios it may
        use) now: a truncated or foreign file stops the session with its path and the fix, before
        anything is measured or overwritten."""
        for hw in [self.hardware_id] + self.chooser.family():
            folder = self.store.root / hw
            if folder.is_dir():
                for path in sorted(folder.glob("*.json")):
                    self.store.load(hw, path.stem)

    def spent_s(self) -> float:
        return time.time() - self.started_wall

    def context(self, tainted: list[str] | None = None, foreign_cores: float | None = None) -> Context:
        """What every metric of this session is judged with: ``tainted`` (default: the preflight's
        reasons) makes metrics not gated unless --perf-allow-tainted (then gated anyway, the plugin
        still labels the results). ``foreign_cores``: the CPU others took while the metrics were
        measured (load_watch), which bounds what the load explains (judge.load_bound) where the load
        watch alone tainted them; after a preflight taint (a GPU, memory: not CPU alone) nothing does."""
        reasons = self.tainted if tainted is None else tainted
        load = None if foreign_cores is None or self.tainted else ForeignLoad(self.watch.cores, foreign_cores)
        return Context(self.settings, self.policy, () if self.allow_tainted else tuple(reasons), load)


