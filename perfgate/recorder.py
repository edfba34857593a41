"""The `perf` fixture's object: what a test calls to record measurements.

It only collects. Comparison happens in the plugin after the test body returns, so a
test can never contain its own pass/fail logic for a performance number.
"""
from __future__ import annotations

import json
import numbers
from typing import Any, Iterator, Sequence

import numpy as np

from perfgate.judge import signs
from perfgate.judge.metrics import Metric, MetricError, summarize


class PerfRecorder:
    def __init__(self, test_id: str):
        self.test_id = test_id
        self.attempts: list[dict[str, Metric]] = [{}]
        self.attachments: dict[str, Any] = {}
        self.workload: dict[str, str] | None = None

    def identify(self, **fields: str) -> None:
        """Say what was measured beyond what the test id says: the served model, the engine flags.

        The test id names the case (``test_concurrency_sweep[gpu-C=8]``); where the user can swap
        what runs underneath it (``PERFGATE_SERVING_MODEL``), the identity travels with every
        metric into the results and the baselines, and a baseline of another workload is
        ``not-comparable``, never judged: a 7B model is not a 1.1 B model that regressed."""
        if not fields or not all(isinstance(k, str) and isinstance(v, str) and v for k, v in fields.items()):
            raise MetricError(f"{self.test_id}: identify() takes non-empty string fields, got {fields!r}")
        if self.workload is not None and self.workload != fields:
            raise MetricError(f"{self.test_id}: identified as {self.workload!r} already, now {fields!r}")
        self.workload = dict(fields)

    @property
    def attempt(self) -> int:
        """1 for the first measurement, 2.. when the plugin re-measures a suspected regression."""
        return len(self.attempts)

    @property
    def metrics(self) -> dict[str, Metric]:
        """Metrics of the current (latest) attempt."""
        return self.attempts[-1]

    def record(self, name: str, samples: Sequence[float], *, unit: str, better: str,
               tol: float | None = None, depends: str | None = None,
               device_busy: float | None = None, floor: float | None = None) -> Metric:
        """Record repeated measurements of one metric. ``tol`` overrides the unit family default.

        ``depends``: what the number depends on, which decides what it is compared with (``nothing``:
        an exact count, judged against any machine's baseline; ``family``: an in-run ratio; ``device``:
        GPU memory or device time, judged across hosts that differ only in the host CPU; ``host``: the
        whole machine). Left out, it follows the unit: count -> nothing, x/fraction -> family, else host.
        ``device_busy``: the measured share (0..1) of the timed region the device was busy, beside a GPU
        timing; at >= 0.9 (metrics.DEVICE_BOUND) here and in the baseline a host timing is judged as
        ``device``. docs/hardware-ids.md has the table.
        ``floor``: the smallest change of the median, in ``unit``, this measurement can resolve (a timer's
        resolution over the calls one sample averages); a change below it passes and the verdict says so.
        Left out, a timing gets the default of its unit (judge.config.ABS_FLOORS: 2 us), others none.
        Every sample counts: the verdict judges all of them; files store a summary (metrics.stored_samples)."""
        if not name or not isinstance(name, str):
            raise MetricError(f"metric name must be a non-empty string, got {name!r}")
        if name in self.metrics:
            raise MetricError(f"{self.test_id}: metric {name!r} recorded twice in one run")
        if isinstance(samples, (numbers.Number, np.bool_)):  # a boolean too: refused as a sample, by name
            samples = [samples]  # one measurement (a deterministic count, a ratio computed once)
        elif isinstance(samples, Iterator):
            samples = list(samples)  # read twice below: summarised, then each value's sign checked
        try:
            summary = summarize(samples)
        except MetricError as exc:
            raise MetricError(f"{self.test_id}: metric {name!r}: {exc}") from None
        problem = signs.problem(unit, (float(x) for x in samples))  # a negative duration is a failed measurement
        if problem:
            raise MetricError(f"{self.test_id}: metric {name!r}: {problem}; record only what was measured")
        metric = Metric(name=name, unit=unit, better=better, summary=summary, tol=tol, depends=depends,
                        device_busy=device_busy, floor=floor)
        self.metrics[name] = metric
        return metric

    def attach(self, name: str, data: Any) -> None:
        """Keep raw data (per-request timings, per-iteration samples) beside the results."""
        json.dumps(data)  # fail here, in the test, if it cannot be saved later
        self.attachments[name] = data

    def new_attempt(self) -> None:
        self.attempts.append({})

    def pooled(self, name: str) -> list[float]:
        """All samples of a metric across attempts: more samples, more power for a re-measured verdict."""
        out: list[float] = []
        for attempt in self.attempts:
            if name in attempt:
                out.extend(attempt[name].summary.samples)
        return out
