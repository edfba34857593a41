"""What a results store keeps: a run's document, or its digest, checked as it goes in and as it comes out.

Every store (perfgate.store.backends) holds the same two kinds of entry, each known by the sha256 of the
run's uncompressed JSON bytes, whichever store it sits in:

- a **run**: the results document ``pytest --perf-save`` wrote, byte for byte (gzipped at rest);
- a **digest** of a run: what `perfgate verify-baselines` needs to re-derive a baseline's run summary
  (each result's test id, metric, unit, direction, tolerance and IQR to DIGEST_DIGITS significant digits,
  median, n and the count of stored samples, taint and outcome) and no samples, raw attachments,
  fingerprint, baseline or verdict text (schema 1, digests made before 2026-12-07, also kept the MAD,
  the tolerance and IQR exactly and the baseline's median and provenance; both are read, and
  ``digest_of(..., schema=1)`` still makes the old bytes). A code tree keeps digests of the runs its
  baselines pool (results-store/ in this repository: ~25 x smaller than the runs); the runs themselves
  live in a store outside it. A digest names its run's hash (``run_sha256``); it cannot prove it, but a
  store holding the run can (:func:`digest_of` is deterministic: the same run gives the same bytes).

Both are parsed from bytes here (a row of a database is not a file path), under the same caps and shape
checks as a results file read from disk (perfgate.store.readers, perfgate.store.shapes): every number
finite and of its unit's sign, whatever wrote the row.

Beside the document, a store keeps one **metric row** per result (:func:`metric_rows`): the few numbers a
trend plot and a change-point search read, so a series (hardware id, test, metric) is one indexed query
instead of a read of every file.
"""
from __future__ import annotations

import gzip
import hashlib
import io
import json
import re
import statistics
import zlib
from dataclasses import dataclass
from typing import Any

import numpy as np

from perfgate.judge.metrics import Summary
from perfgate.machine.hardware_id import HardwareIdError, check_hardware_id
from perfgate.store.readers import MAX_FILE_BYTES, MAX_NESTING, Checker, nesting
from perfgate.store.safe_paths import PathError, check_area
from perfgate.store.shapes import check_results_document, check_schema

RESULTS_KIND = "perfgate-results"   # perfgate.store.results.KIND, the document `--perf-save` writes
DIGEST_KIND = "perfgate-run-digest"
DIGEST_SCHEMA = 2   # 2: no MAD, no baseline, tolerance and IQR to DIGEST_DIGITS, ``samples`` only where not [median]
DIGEST_SCHEMAS = (1, 2)
# significant digits a digest (schema 2) keeps of a result's tolerance and IQR: what a trend drawn from digests
# shows around the median (the run, in a store, has them exactly); nothing re-derives them
DIGEST_DIGITS = 4
SHA256 = re.compile(r"[0-9a-f]{64}")
# the result fields a digest keeps: everything verify-baselines and a trend read, nothing raw
_DIGEST_FIELDS = ("test_id", "area", "metric", "unit", "better", "tol", "gated", "summary", "tainted")


class StoreError(ValueError):
    """A store, or an entry in it, is unusable; one line naming the store, the entry and the fix."""


class StoreUnavailable(StoreError):
    """The store cannot be reached (a server down, a login refused): one line, never a traceback."""


@dataclass(frozen=True)
class Entry:
    """One stored run or digest, as every store lists it."""

    sha256: str            # of the run's uncompressed JSON: its identity in every store
    name: str              # <hardware-id>/<file name>, as baselines name it
    hardware_id: str
    created: str
    commit: str | None
    interrupted: bool
    digest: bool           # True: the entry holds the run's digest, not the run


@dataclass(frozen=True)
class MetricRow:
    """One result of one stored run: a point of the series (hardware id, test id, metric)."""

    sha256: str
    name: str
    hardware_id: str
    created: str
    commit: str | None
    area: str
    test_id: str
    metric: str
    unit: str
    better: str
    tol: float
    gated: bool
    median: float
    q1: float
    q3: float
    n: int
    tainted: bool
    outcome: str
    baseline_median: float | None
    baseline_provenance: str | None


def gunzipped(data: bytes, where: str) -> bytes:
    """``data`` itself, or its gunzipped bytes where it starts with gzip's magic, at most MAX_FILE_BYTES."""
    if data[:2] != b"\x1f\x8b":
        return data
    try:
        with gzip.GzipFile(fileobj=io.BytesIO(data)) as unpacked:
            out = unpacked.read(MAX_FILE_BYTES + 1)
    except (OSError, EOFError, zlib.error) as exc:
        raise StoreError(f"{where}: not a complete gzip stream ({exc}); restore it from where it was copied") from None
    if len(out) > MAX_FILE_BYTES:
        raise StoreError(f"{where}: unpacks to more than {MAX_FILE_BYTES // 2**20} MiB, far beyond any run")
    return out


def packed(raw: bytes) -> bytes:
    """The bytes a store keeps at rest: gzip without a timestamp, so one run always packs the same."""
    return gzip.compress(raw, compresslevel=9, mtime=0)


def sha256_of(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()


def parse(raw: bytes, where: str) -> dict:
    """A stored run or digest from its uncompressed bytes, checked down to every value a reader takes."""
    if len(raw) > MAX_FILE_BYTES:
        raise StoreError(f"{where}: larger than {MAX_FILE_BYTES // 2**20} MiB, far beyond any run")
    fix = "store it again from the results file (`perfgate store add`)"
    try:
        doc = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise StoreError(f"{where}: not UTF-8 text (offset {exc.start}); {fix}") from None
    except json.JSONDecodeError as exc:
        raise StoreError(f"{where}: not valid JSON ({exc.msg} at line {exc.lineno}), perhaps truncated; {fix}") from None
    except (RecursionError, MemoryError, ValueError) as exc:
        raise StoreError(f"{where}: not usable JSON ({type(exc).__name__}); {fix}") from None
    if not isinstance(doc, dict) or doc.get("kind") not in (RESULTS_KIND, DIGEST_KIND):
        raise StoreError(f"{where}: neither a perfgate results file nor a run digest (kind "
                         f"{str(doc.get('kind') if isinstance(doc, dict) else type(doc).__name__)[:40]!r}); "
                         f"results files are written by `pytest --perf-save PATH`")
    if nesting(doc) > MAX_NESTING:
        raise StoreError(f"{where}: nested deeper than {MAX_NESTING} levels; {fix}")
    digest = doc["kind"] == DIGEST_KIND
    check_schema(where, doc.get("schema_version"), DIGEST_SCHEMAS if digest else (1,),
                 what="digest " if digest else "results ", fix=fix, error=StoreError)
    c = Checker(where, fix=fix, error=StoreError)
    if digest and doc["schema_version"] >= 2:  # a summary without ``samples``: its stored samples' median is its own
        for i, r in enumerate(c.list(doc.get("results"), "results", optional=True)):
            summary = c.table(c.table(r, f"results[{i}]").get("summary"), f"results[{i}].summary")
            if "samples" not in summary:
                summary["samples"] = [summary.get("median")]
    check_results_document(c, doc)
    if digest and not (isinstance(doc.get("run_sha256"), str) and SHA256.fullmatch(doc["run_sha256"])):
        c.fail("run_sha256", "must be the run's sha256 (64 lowercase hex digits)")
    for i, r in enumerate(doc.get("results") or []):
        if digest and "stored" in r["summary"]:
            c.integer(r["summary"]["stored"], f"results[{i}].summary.stored", minimum=len(r["summary"]["samples"]))
    return doc


def digest_of(doc: dict, sha256: str, *, schema: int = DIGEST_SCHEMA) -> bytes:
    """The digest of a results document whose uncompressed bytes hash to ``sha256``: deterministic bytes
    (same run, same digest), each result reduced to what verify-baselines and a trend read. ``schema`` 1
    makes a digest as it was made before 2026-12-07 (to check a committed one against its run)."""
    if doc.get("kind") == DIGEST_KIND:
        raise StoreError(f"run {sha256[:12]}: already a digest; a digest is made from the run itself")
    if schema not in DIGEST_SCHEMAS:
        raise StoreError(f"run {sha256[:12]}: no digest schema {schema!r} (known: {DIGEST_SCHEMAS})")
    results = []
    for r in doc.get("results") or []:
        kept = {k: r[k] for k in _DIGEST_FIELDS if k in r}
        kept["summary"] = _digest_summary(r["summary"]) if schema == 1 else _lean_summary(r["summary"])
        if schema >= 2 and isinstance(kept.get("tol"), float):
            kept["tol"] = float(f"{kept['tol']:.{DIGEST_DIGITS}g}")
        outcome = (r.get("verdict") or {}).get("outcome")
        if outcome is not None:
            kept["verdict"] = {"outcome": outcome}
        base = r.get("baseline") or {}
        if schema == 1 and base.get("median") is not None:
            kept["baseline"] = {"median": base["median"], "provenance": base.get("provenance")}
        results.append(kept)
    digest = {"kind": DIGEST_KIND, "schema_version": schema, "run_sha256": sha256,
              "hardware_id": doc["hardware_id"], "created": doc.get("created"), "commit": doc.get("commit"),
              "interrupted": bool(doc.get("interrupted")), "results": results}
    return json.dumps(digest, separators=(",", ":"), allow_nan=False).encode()


def _digest_summary(summary: dict) -> dict:
    """A metric's summary as a digest keeps it: median, MAD, IQR and n as recorded, and the count of the
    samples the run stored (``stored``) in place of the samples. What verify-baselines re-derives from a run
    -- its median and n (issue 47 on), or the median and count of its stored samples (runs pooled before) --
    is all there; a trend drawn from digests shows the IQR around the median (the run, in a store, has every
    sample). The samples are ~90 % of a digest's bytes otherwise: a CPU suite run's 887 metrics store up
    to 200 each."""
    stored = summary.get("samples") or [summary["median"]]
    kept = {k: summary[k] for k in ("median", "mad", "iqr", "n") if k in summary}
    # the median of the stored samples: a run stored before issue 47 kept its first 200 of more
    return kept | {"stored": len(stored), "samples": [float(np.median(np.asarray(stored, dtype=float)))]}


def _lean_summary(summary: dict) -> dict:
    """A metric's summary as a digest of schema 2 keeps it: the median and n as recorded, the IQR to DIGEST_DIGITS
    significant digits, the count of the samples the run stored (``stored``), and their median (``samples``)
    only where it is not the median itself (a run stored before issue 47: its first 200 samples of more).
    What verify-baselines re-derives is all there, as in schema 1; the MAD, the exact IQR and the baseline's
    median and provenance (a copy of a committed baseline) were ~45 % of a schema 1 digest's bytes."""
    kept = _digest_summary(summary)
    kept.pop("mad", None)
    if "iqr" in kept:
        kept["iqr"] = float(f"{kept['iqr']:.{DIGEST_DIGITS}g}")
    if kept["samples"] == [kept["median"]]:
        del kept["samples"]
    return kept


def stored_count(summary: dict) -> int:
    """How many samples the run stored for this metric: a digest says (``stored``), a run shows them."""
    return summary.get("stored") or len(summary.get("samples") or [summary["median"]])


def check_name(name: object) -> str:
    """A stored name is ``<hardware-id>/<file name>``: two safe components, as a folder store lays it out."""
    parts = name.split("/") if isinstance(name, str) else []
    try:
        if len(parts) != 2:
            raise PathError("")
        check_hardware_id(parts[0], source="results store name")
        check_area(parts[1], source="results store name")
        if not parts[1].endswith((".json", ".json.gz")):
            raise PathError("")
    except (HardwareIdError, PathError):
        shown = repr(name) if len(repr(name)) <= 100 else repr(name)[:97] + "..."
        raise StoreError(f"{shown} is not a results store name: it must be <hardware-id>/<file name>.json.gz "
                         f"(e.g. cpu-AMD-EPYC-avx512-2c/ci-ac4ae1d.json.gz)") from None
    return name


def could_be_stored(hardware_id: str | None = None, name: str | None = None) -> bool:
    """Whether anything can be stored under this hardware id or name: a query for one that cannot (a NUL,
    10 kB, a quote) finds nothing without being sent to a database that may not take its bytes."""
    try:
        if hardware_id is not None:
            check_hardware_id(hardware_id, source="query")
        if name is not None:
            check_name(name)
    except (HardwareIdError, StoreError):
        return False
    return True


def stored_name(hardware_id: str, file_name: str) -> str:
    """What a results file called ``file_name`` is called in a store: ``<hardware-id>/<name>.gz``."""
    return check_name(f"{hardware_id}/{file_name if file_name.endswith('.gz') else file_name + '.gz'}")


def entry_of(doc: dict, sha256: str, name: str) -> Entry:
    return Entry(sha256=sha256, name=name, hardware_id=doc["hardware_id"], created=doc.get("created") or "",
                 commit=doc.get("commit"), interrupted=bool(doc.get("interrupted")),
                 digest=doc.get("kind") == DIGEST_KIND)


def quartiles(summary: Summary) -> tuple[float, float]:
    """Quartiles from the stored samples; from the IQR around the median when too few are stored."""
    if len(summary.samples) >= 4:
        q1, q3 = statistics.quantiles(summary.samples, n=4, method="inclusive")[0::2]
        return min(q1, summary.median), max(q3, summary.median)
    return summary.median - summary.iqr / 2, summary.median + summary.iqr / 2


def metric_rows(doc: dict, entry: Entry) -> list[MetricRow]:
    """One row per (test id, metric) of a checked run or digest; a repeated pair keeps its last result,
    as every reader of a results file does."""
    rows: dict[tuple[str, str], MetricRow] = {}
    for r in doc.get("results") or []:
        summary = Summary.from_dict(r["summary"])
        q1, q3 = quartiles(summary)
        base = r.get("baseline") or {}
        rows[(r["test_id"], r["metric"])] = MetricRow(
            sha256=entry.sha256, name=entry.name, hardware_id=entry.hardware_id, created=entry.created,
            commit=entry.commit, area=r["area"], test_id=r["test_id"], metric=r["metric"], unit=r["unit"],
            better=r["better"], tol=float(r["tol"]), gated=bool(r.get("gated", True)), median=summary.median,
            q1=q1, q3=q3, n=summary.n, tainted=bool(r.get("tainted")),
            outcome=(r.get("verdict") or {}).get("outcome") or "new",
            baseline_median=None if base.get("median") is None else float(base["median"]),
            baseline_provenance=base.get("provenance"))
    return list(rows.values())


def series_key(hardware_id: str, test_id: str, metric: str) -> str:
    """The index key of a series: a hash, so a 10 kB test id indexes like a short one (a PostgreSQL
    b-tree entry holds at most ~2.7 kB) and every name is data, never part of the SQL."""
    return hashlib.sha256(json.dumps([hardware_id, test_id, metric]).encode()).hexdigest()
