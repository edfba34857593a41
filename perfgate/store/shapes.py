"""The shapes of perfgate's two JSON formats, a baseline file and a results file, checked as read.

Every value a command reads from them is checked here, with perfgate.store.readers.Checker: tables
where tables are expected, strings, and every number finite, of sane magnitude (|x| <= 1e30) and
of its type (a boolean is not a number). A NaN run median in a results file, refreshed into a
baseline, once made a run at 7x the baseline ``pass`` with change ``+nan%`` (every comparison with
NaN is false); now it stops the command with one line naming the file and the key (issue 27).
Every measured value is also of a sign its unit allows (perfgate.judge.signs: a negative duration,
rate, bandwidth or size, or a subnormal anything, is refused; issue 49).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from perfgate.judge import signs
from perfgate.judge.metrics import DIRECTIONS, MAX_STORED_SAMPLES, MAX_TOLERANCE, UNIT_FAMILIES, stored_samples
from perfgate.machine.hardware_id import check_hardware_id
from perfgate.store.readers import Checker, shown
from perfgate.store.safe_paths import check_area


def check_schema(path: Path, value: Any, readable: tuple[int, ...], *, what: str, fix: str,
                 error: type[ValueError]) -> int:
    """A document's ``schema_version``: one of ``readable``, as a JSON integer (not "1", 1.0 or true)."""
    if type(value) is int and value in readable:
        return value
    kind = {str: "a string", bool: "a boolean", float: "a fractional number"}.get(type(value))
    note = f" ({kind}; the version is a bare integer such as {readable[-1]})" if kind else ""
    raise error(f"{path}: {what}schema version {value!r}{note}, this perfgate reads "
                f"{' and '.join(map(str, readable))}; {fix}")


def check_summary(c: Checker, value: Any, key: str, unit: Any = None, *, baseline: bool = False) -> None:
    """A Summary; with ``unit``, every value a measurement of it (perfgate.judge.signs); ``baseline``: and not a
    duration, rate or bandwidth that measured nothing (every sample 0)."""
    s = c.table(value, key)
    c.sign(c.number(s.get("median"), f"{key}.median"), f"{key}.median", unit)
    samples = c.numbers(s.get("samples"), f"{key}.samples", unit=unit)
    if not samples:
        c.fail(f"{key}.samples", "must hold at least one measurement, got []")
    for name in ("min", "max", "mean"):  # optional, but not null: readers default only when absent
        if name in s:
            c.sign(c.number(s[name], f"{key}.{name}"), f"{key}.{name}", unit)
    for name in ("mad", "iqr"):
        if name in s:
            c.number(s[name], f"{key}.{name}", minimum=0)
    if "n" in s:  # measurements taken; the samples kept are the first MAX_STORED_SAMPLES of them
        c.integer(s["n"], f"{key}.n", minimum=len(samples))
    nothing = signs.measured_nothing(unit, samples + [s["median"]]) if baseline else None
    if nothing:
        c.fail(f"{key}.samples", nothing)
    _cap(s, "samples", samples)


def _cap(table: dict, name: str, values: list[float]) -> None:
    """Capped while read: more than MAX_STORED_SAMPLES values become their faithful summary
    (metrics.stored_samples, what perfgate itself writes), with ``n`` still counting all of them, so
    nothing downstream carries 5 million samples through a refresh (59 s and 473 MB before)."""
    if len(values) > MAX_STORED_SAMPLES:
        if name == "samples":
            table.setdefault("n", len(values))
        table[name] = list(stored_samples(values))


def check_runs(c: Checker, value: Any, key: str, unit: Any = None) -> None:
    """One run_noise.RunSummary per pooled run: its median sets the reference level and the spread
    of medians widens the tolerance, so each must be a real number (a NaN median passed anything)
    and a measurement in ``unit`` (a negative one passed a run 218 % slower)."""
    for i, run in enumerate(c.list(value, key, optional=True)):
        r = c.table(run, f"{key}[{i}]")
        c.sign(c.number(r.get("median"), f"{key}[{i}].median"), f"{key}[{i}].median", unit)
        c.number(r.get("spread"), f"{key}[{i}].spread", optional=True, minimum=0)
        if "n" in r:
            c.integer(r["n"], f"{key}[{i}].n", minimum=1)
        for name in ("when", "commit", "file"):
            c.string(r.get(name), f"{key}[{i}].{name}", optional=True)
        host = c.table(r.get("host"), f"{key}[{i}].host", optional=True)
        for name in ("hostname", "boot_id"):
            c.string(host.get(name), f"{key}[{i}].host.{name}", optional=True)
        c.strings(host.get("gpu_uuids"), f"{key}[{i}].host.gpu_uuids", optional=True)


def check_spread(c: Checker, value: Any, key: str, unit: Any = None) -> None:
    """What `perfgate calibrate` stored: its run medians widen the gross-change guard."""
    s = c.table(value, key, optional=True)
    c.numbers(s.get("run_medians") if "run_medians" in s else [], f"{key}.run_medians", unit=unit)
    for name in ("run_to_run", "within_run", "k", "floor", "proposed_tol"):
        c.number(s.get(name), f"{key}.{name}", optional=True, minimum=0)
    if "runs" in s:
        c.integer(s["runs"], f"{key}.runs", minimum=0)
    if "absolute" in s:
        c.boolean(s["absolute"], f"{key}.absolute")


def check_fingerprint(c: Checker, value: Any, key: str) -> None:
    """The fields perfgate.judge.fingerprint_check compares and run_noise.host_identity reads: tables
    where it expects tables, and plain values (finite numbers, strings, booleans, lists of them)."""
    fp = c.table(value, key, optional=True)
    for name, v in c.table(fp.get("software"), f"{key}.software", optional=True).items():
        if name == "packages":  # {distribution: version} of what the measured code imports
            for dist, version in c.table(v, f"{key}.software.packages").items():
                c.string(version, f"{key}.software.packages[{dist!r}]")
        else:
            c.string(v, f"{key}.software.{name}", optional=True)
    _plain_fields(c, c.table(fp.get("cpu"), f"{key}.cpu", optional=True), f"{key}.cpu")
    for i, gpu in enumerate(c.list(fp.get("gpus"), f"{key}.gpus", optional=True)):
        _plain_fields(c, c.table(gpu, f"{key}.gpus[{i}]"), f"{key}.gpus[{i}]")
    for i, row in enumerate(c.list(fp.get("links"), f"{key}.links", optional=True)):
        c.strings(row, f"{key}.links[{i}]")
    for name in ("hostname", "boot_id"):
        c.string(fp.get(name), f"{key}.{name}", optional=True)


# fingerprint fields that are numbers (or null where a machine could not tell): fingerprint_check
# compares them with a relative tolerance, so a boolean or a string there is damage, not a value
_NUMERIC_FIELDS = frozenset({"family", "model_number", "stepping", "cores", "processors", "sockets",
                             "threads_per_core", "numa_nodes", "index", "pcie_max_gen", "pcie_max_width",
                             "pcie_gen_now", "pcie_width_now", "mhz_reported"})


def _plain_fields(c: Checker, table: dict, key: str) -> None:
    for name, v in table.items():
        if name in _NUMERIC_FIELDS or name.endswith(("_mhz", "_w", "_gib")):
            c.number(v, f"{key}.{name}", optional=True)
            continue
        for j, item in enumerate(v if isinstance(v, list) else [v]):
            where = f"{key}.{name}" + (f"[{j}]" if isinstance(v, list) else "")
            if isinstance(item, (int, float)) and not isinstance(item, bool):
                c.number(item, where)
            elif not (item is None or isinstance(item, (str, bool))):
                c.fail(where, f"must be a number, a string or true/false, got {shown(item)}")


def check_baseline_entry(c: Checker, value: Any, key: str) -> None:
    e = c.table(value, key)
    unit = c.string(e.get("unit"), f"{key}.unit")
    c.string(e.get("better"), f"{key}.better")
    check_summary(c, e.get("summary"), f"{key}.summary", unit, baseline=True)
    c.number(e.get("tol"), f"{key}.tol", optional=True, minimum=0, maximum=MAX_TOLERANCE)
    if "provenance" in e:
        c.string(e["provenance"], f"{key}.provenance")
    for name in ("when", "commit", "source"):
        c.string(e.get(name), f"{key}.{name}", optional=True)
    c.table(e.get("software"), f"{key}.software", optional=True)
    check_spread(c, e.get("spread"), f"{key}.spread", unit)
    check_runs(c, e.get("runs"), f"{key}.runs", unit)
    check_workload(c, e.get("workload"), f"{key}.workload")


def check_workload(c: Checker, value: Any, key: str) -> None:
    """PerfRecorder.identify's fields: names to non-empty strings (absent when a test says none)."""
    for name, v in c.table(value, key, optional=True).items():
        c.string(v, f"{key}.{name}")


def check_baseline_document(c: Checker, doc: dict) -> None:
    """``entries`` maps test id -> metric -> entry (``kind``/``schema_version`` are checked by the caller)."""
    check_fingerprint(c, doc.get("fingerprint"), "fingerprint")
    machines = c.table(doc.get("fingerprints"), "fingerprints", optional=True)
    for name, fp in machines.items():
        check_fingerprint(c, fp, f"fingerprints[{name!r}]")
    for test, metrics in c.table(doc.get("entries"), "entries").items():
        for metric, entry in c.table(metrics, f"entries[{test!r}]").items():
            check_baseline_entry(c, entry, f"entries[{test!r}][{metric!r}]")
            key = c.string(entry.get("fingerprint_key"), f"entries[{test!r}][{metric!r}].fingerprint_key",
                           optional=True)
            if key is not None and key not in machines:
                c.fail(f"entries[{test!r}][{metric!r}].fingerprint_key",
                       f"names {shown(key)}, which the file's 'fingerprints' table does not hold")


def check_verdict(c: Checker, value: Any, key: str, unit: Any = None) -> None:
    """A saved verdict: `perfgate power` reads its change, the report its baseline median."""
    from perfgate.judge.verdict import Outcome

    verdict = c.table(value, key, optional=True)
    if verdict.get("outcome") is not None:
        c.choice(verdict["outcome"], f"{key}.outcome", [o.value for o in Outcome])
    # a relative change from a baseline median of 0 is infinite (verdict.worsening): shown, never judged
    c.number(verdict.get("change"), f"{key}.change", optional=True, infinite=True)
    c.number(verdict.get("p_value"), f"{key}.p_value", optional=True, minimum=0, maximum=1)
    c.sign(c.number(verdict.get("baseline_median"), f"{key}.baseline_median", optional=True),
           f"{key}.baseline_median", unit)
    c.number(verdict.get("tol"), f"{key}.tol", optional=True, minimum=0, maximum=MAX_TOLERANCE)
    c.string(verdict.get("explanation"), f"{key}.explanation", optional=True)


def check_result_entry(c: Checker, value: Any, key: str) -> None:
    r = c.table(value, key)
    c.string(r.get("test_id"), f"{key}.test_id")
    area = c.string(r.get("area"), f"{key}.area")
    try:  # the area names a baseline file: one safe path component
        check_area(area, source=f"{c.path}: {key}.area")
    except ValueError as exc:
        raise c.error(f"{exc}; {c.fix}") from None
    c.string(r.get("metric"), f"{key}.metric")
    unit = c.choice(r.get("unit"), f"{key}.unit", sorted(UNIT_FAMILIES))
    c.choice(r.get("better"), f"{key}.better", DIRECTIONS)
    c.number(r.get("tol"), f"{key}.tol", minimum=0, maximum=MAX_TOLERANCE)
    if "gated" in r:
        c.boolean(r["gated"], f"{key}.gated")
    check_summary(c, r.get("summary"), f"{key}.summary", unit)
    check_runs(c, r.get("runs"), f"{key}.runs", unit)
    check_verdict(c, r.get("verdict"), f"{key}.verdict", unit)
    baseline = c.table(r.get("baseline"), f"{key}.baseline", optional=True)  # gate.baseline_view
    c.sign(c.number(baseline.get("median"), f"{key}.baseline.median", optional=True), f"{key}.baseline.median", unit)
    c.number(baseline.get("mad"), f"{key}.baseline.mad", optional=True)
    if baseline.get("n") is not None:
        c.integer(baseline["n"], f"{key}.baseline.n", minimum=0)
    for name in ("samples", "run_medians"):
        if baseline.get(name) is not None:
            values = c.numbers(baseline[name], f"{key}.baseline.{name}", unit=unit)
            if name == "samples":
                _cap(baseline, name, values)
    c.string(baseline.get("provenance"), f"{key}.baseline.provenance", optional=True)
    if "attempts" in r:
        c.integer(r["attempts"], f"{key}.attempts", minimum=1)
    if "rerun" in r:
        c.string(r["rerun"], f"{key}.rerun")
    c.strings(r.get("tainted"), f"{key}.tainted", optional=True)
    c.strings(r.get("left_out"), f"{key}.left_out", optional=True)
    check_workload(c, r.get("workload"), f"{key}.workload")


def check_results_document(c: Checker, doc: dict) -> None:
    """Everything a command reads from a results file (``kind``/``schema_version`` checked by the caller).
    Attachments are kept, never read by a command: only their shape is checked."""
    try:
        check_hardware_id(doc.get("hardware_id"), source=f"results file {c.path}: hardware_id")
    except ValueError as exc:
        raise c.error(f"{exc}; {c.fix}") from None
    for name in ("created", "commit"):
        c.string(doc.get(name), name, optional=True)
    check_fingerprint(c, doc.get("fingerprint"), "fingerprint")
    if "interrupted" in doc:
        c.boolean(doc["interrupted"], "interrupted")
    c.strings(doc.get("skipped_by_budget"), "skipped_by_budget", optional=True)
    c.table(doc.get("attachments"), "attachments", optional=True)
    for i, p in enumerate(c.list(doc.get("pooled_from"), "pooled_from", optional=True)):
        p = c.table(p, f"pooled_from[{i}]")
        for name in ("file", "created", "commit"):
            c.string(p.get(name), f"pooled_from[{i}].{name}", optional=True)
    for i, r in enumerate(c.list(doc.get("results"), "results", optional=True)):
        check_result_entry(c, r, f"results[{i}]")
