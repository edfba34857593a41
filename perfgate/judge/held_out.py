"""Leave-one-out: each of N runs judged, as the gate would judge it, against a baseline pooled from the others.

Why: a tolerance is right when a future run of unchanged code passes against the committed baseline.
The runs that made the baseline cannot show that (each is inside its own reference); holding one out
and judging it against the pool of the rest can, out of sample, with everything the gate uses: the
tolerance table of the hardware id, the run-level noise model of the pooled entry, the rank test,
record-only rules, the gross-change guard, and the fingerprint comparison between the held-out run's
machine and the pool's (a sitting on another host reads ``not-comparable`` here as it would in CI).
Runs from different sittings, nights or nodes are the spread a tolerance has to cover; this is what
``perfgate calibrate --from`` prints beside its proposal (docs/lifecycle.md). So a run is held out
with every run of its sitting (the same boot on the same day: a job that ran twice), where the runs come from
two sittings or more: a twin left in the pool would hide most of the spread between sittings.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfgate.judge import pooling
from perfgate.judge.baseline_choice import Choice
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.judge.fingerprint_check import compare
from perfgate.judge.gate import Context, evaluate
from perfgate.judge.run_noise import sitting_key
from perfgate.judge.metric_result import metric_results

Key = tuple[str, str]  # (test id, metric)


@dataclass(frozen=True)
class HeldOut:
    """One run's verdict on one metric against the other runs pooled."""

    run: str                 # the held-out run's name (its file)
    outcome: str             # perfgate.judge.verdict.Outcome value
    gated: bool              # whether the gate would have judged it (record-only, guard)
    change: float | None     # signed worsening against the pool (> 0 worse; absolute for fractions)
    explanation: str
    median: float            # the held-out run's median
    baseline: BaselineEntry = field(repr=False, compare=False)  # the pool it was judged against

    @property
    def alarm(self) -> bool:
        """A false alarm if the runs measured the same code: a gated regression."""
        return self.gated and self.outcome == "regression"


def leave_one_out(docs: list[dict], names: list[str], settings, hardware_id: str, *,
                  include_tainted: bool = False) -> dict[Key, list[HeldOut]]:
    """Every metric of every run against the pool of the other runs' samples; needs >= 2 runs.

    ``settings``: perfgate.store.settings.load_settings for ``hardware_id`` (its tolerances.toml).
    A metric measured by one run only has no held-out verdict."""
    if len(docs) < 2:
        raise ValueError("leave-one-out needs at least 2 runs")
    context = Context.of(settings, hardware_id)
    sittings = sitting_of(docs)
    by_sitting = len(set(sittings)) >= 2
    out: dict[Key, list[HeldOut]] = {}
    for i, (doc, name) in enumerate(zip(docs, names)):
        rest = [(d, n) for j, (d, n) in enumerate(zip(docs, names))
                if (sittings[j] != sittings[i] if by_sitting else j != i)]
        pooled = pooling.pool([d for d, _ in rest], [n for _, n in rest], include_tainted=include_tainted)
        entries = pooling.baseline_entries(pooled, include_tainted=include_tainted)
        diff = compare(pooled.get("fingerprint"), doc.get("fingerprint") or {})
        for r in metric_results(doc):
            if r.tainted and not include_tainted:
                continue
            entry = entries.get(r.area, {}).get(r.test_id, {}).get(r.metric)
            if entry is None:
                continue
            got = evaluate(r.test_id, r.measured(), Choice(entry, hardware_id, False, diff), context,
                           workload=r.workload)
            v = got.verdict
            out.setdefault((r.test_id, r.metric), []).append(
                HeldOut(run=name, outcome=v["outcome"], gated=got.gated, change=v.get("change"),
                        explanation=v.get("explanation", ""), median=got.summary.median, baseline=entry))
    return out


def sitting_of(docs: list[dict]) -> list[object]:
    """Each run's sitting (run_noise.sitting_key: its boot on its day), or the run itself where it
    recorded no boot id."""
    return [sitting_key((doc.get("fingerprint") or {}).get("boot_id"), doc.get("created")) or ("run", i)
            for i, doc in enumerate(docs)]


def sitting_note(docs: list[dict]) -> str | None:
    """What leave-one-out held out together, where the runs shared boots; None when each run is its own."""
    sittings = sitting_of(docs)
    distinct = len(set(sittings))
    if distinct == len(docs):
        return None
    if distinct == 1:
        return (f"the {len(docs)} runs share one boot and day (one sitting): each is held out alone, so the held-out "
                f"changes show the spread inside one sitting, not between sittings")
    return (f"the {len(docs)} runs come from {distinct} sittings (boots and days): each run is held out with the "
            f"others of its sitting")


def worst(held: list[HeldOut]) -> HeldOut | None:
    """The held-out verdict that came closest to failing: an alarm first, then the largest worsening."""
    judged = [h for h in held if h.change is not None]
    if not judged:
        return None
    return max(judged, key=lambda h: (h.alarm, h.change))
