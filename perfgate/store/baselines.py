"""BaselineStore: committed reference numbers, one JSON file per hardware id and area.

Layout: ``<root>/<hardware-id>/<area>.json``. Files are schema-versioned, written
atomically under a file lock (xdist workers and concurrent refreshes never lose
entries) without following links, and the previous version is kept as ``<area>.json.prev``
so a refresh can be undone. Nothing else a write leaves is noise in the user's tree: the id
folder gets a .gitignore (where it has none) for the lock files, the ``.prev`` copies and
temporary files, and a write removes the temporary files a killed earlier write of its file
left. What may be written (finite numbers, no planted bugs, one workload...) is decided
before, in perfgate.store.baseline_writer. Reading a malformed file fails with the path and
the fix, never a traceback.

How a file is laid out (:func:`baseline_bytes`) is chosen for what a refresh adds to a git repository:
one line per (test id, metric) entry, tests and metrics sorted, each entry's fixed fields (unit,
direction, software...) before the ones a refresh changes, so an entry a refresh leaves alone stays the
same bytes and git stores a partial refresh as a small delta; and a new entry keeps no more digits than
its own noise resolves (:func:`stored_entry`). Any JSON layout is read, and a summary figure a file leaves
out is computed again from the samples it keeps (:func:`full_summary`).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from perfgate.store import locks
from perfgate.store.atomic import read_in, replace_in
from perfgate.machine.hardware_id import HardwareIdError, check_hardware_id
from perfgate.judge.baseline_entry import BaselineEntry
from perfgate.store.readers import Checker, ReadError, read_json
from perfgate.store.safe_paths import PathError, check_area, inside_root, writable_folder
from perfgate.store.shapes import check_baseline_document, check_schema

SCHEMA_VERSION = 2  # 2: entries may carry `runs` (one summary per contributing run)
# significant digits a new entry keeps at most of any figure but its counts and tolerance (medians, run medians
# and spreads, the summary figures it keeps): a float32's precision, a relative step below 1e-6, four orders of
# magnitude under the smallest tolerance a gate uses (verify-baselines re-derives a run's median and keeps it as
# the writer does: kept_median). 17 digits of timer noise were ~40 % of what a refresh added to git.
PRECISION = 7
# a new entry's samples keep the decimal place SAMPLE_PLACES below the leading digit of the noise of its quietest
# run (see stored_entry): each moves by at most 1/200 of that noise, far inside what a rank test weighs, and never
# so far that distinct samples become equal
SAMPLE_PLACES = 2
_MOST_DIGITS = 17  # a double's: samples 1e-9 apart keep as many digits as tell them apart
# summary figures the stored samples give again where they are all the samples taken (full_summary)
_DERIVED = ("mad", "iqr", "min", "max", "mean")
# an entry's fields that a refresh rarely changes, written first (the rest follow in BaselineEntry.to_dict's order)
_FIXED_FIELDS = ("unit", "better", "depends", "device_busy", "workload", "software", "fingerprint_key", "source")
READABLE_SCHEMAS = (1, 2)
KIND = "perfgate-baseline"


class BaselineError(ReadError):
    """A baseline file is unreadable or of the wrong schema; the message names the file."""


def _kept(x: Any, digits: int = PRECISION) -> Any:
    return float(f"{x:.{digits}g}") if isinstance(x, float) and math.isfinite(x) else x


def kept_median(median: float) -> float:
    """A run's median as a new entry keeps it (PRECISION significant digits): what verify-baselines compares
    a re-derived median with, beside the exact value that entries written before 2026-12-07 keep."""
    return _kept(float(median))


def _sample_digits(x: float, place: int, least: int = 1) -> int:
    """Significant digits (``least`` or more) that keep ``x`` to the decimal place ``place`` (10 ** place)."""
    if x == 0:
        return PRECISION
    return max(least, min(_MOST_DIGITS, math.floor(math.log10(abs(x))) - place + 1))


def _kept_samples(samples: list[float], noise: float, least: int) -> list[float]:
    """``samples`` to the decimal place SAMPLE_PLACES below ``noise``'s leading digit, and the samples that would
    then equal a different one to a finer place, one digit at a time, until none does: the judge's rank test
    takes tied samples another way (scipy's Mann-Whitney U leaves its exact p for the normal approximation),
    so no tie is made that was not there. The order stays: samples that met at a value v lie within half a
    step of it, where every other sample keeps its distance."""
    if noise <= 0 or not math.isfinite(noise):
        return [_kept(x) for x in samples]
    places = [math.floor(math.log10(noise)) - SAMPLE_PLACES] * len(samples)
    while True:
        kept = [_kept(x, _sample_digits(x, place, least)) for x, place in zip(samples, places)]
        met: dict[float, set[float]] = {}
        for x, k in zip(samples, kept):
            met.setdefault(k, set()).add(x)
        tied = {k for k, xs in met.items() if len(xs) > 1}
        if not tied:
            return kept
        places = [place - 1 if k in tied and place > -400 else place for k, place in zip(kept, places)]


def _noise(entry: dict, samples: list[float]) -> tuple[float, int]:
    """The finest noise among an entry's samples and the fewest significant digits to keep: the smallest robust
    spread (1.4826 x MAD) of its runs, in the metric's unit, at most the samples' IQR (their range where the
    IQR is 0), and 1 digit; where no run has a spread, that IQR or range and PRECISION digits. Never the
    pooled samples' IQR alone: runs of two sittings 380 and 158 us apart have an IQR of 200 us and a noise of
    0.3 us within each."""
    spreads = []
    for r in entry.get("runs") or ():
        spread, median = r.get("spread"), r.get("median")
        if isinstance(spread, (int, float)) and isinstance(median, (int, float)) and spread > 0:
            spreads.append(spread if entry.get("unit") == "fraction" else spread * abs(median))
    q1, q3 = np.percentile(samples, [25, 75])
    bound = float(q3 - q1) or max(samples) - min(samples)
    return (min(min(spreads), bound), 1) if spreads else (bound, PRECISION)


def stored_entry(entry: dict) -> dict:
    """A new measured entry as the file keeps it, with no more digits than its noise resolves:

    - each sample to the decimal place SAMPLE_PLACES below the leading digit of its noise (:func:`_noise`:
      its quietest run's, never more than the samples' IQR or range; at least PRECISION significant digits
      where no run has a spread, PRECISION where all are equal): a sample moves by at most 1/200 of the
      noise; finer where that would make two different samples equal (:func:`_kept_samples`): rounding to
      one decimal place is monotonic, so the samples keep their order, their ties and no more;
    - its median and each run's median and spread to PRECISION digits; n, the tolerance and the run
      fields (when, commit, file, sha256) exactly;
    - MAD, IQR, min, max and mean left out where the samples are all the samples taken (n of them): they are
      the samples' own (full_summary); kept, to PRECISION digits, where the samples are quantiles of more.

    An imported entry keeps the numbers the other tool reported, as reported (a few per metric)."""
    if not str(entry.get("provenance", "measured")).startswith("measured"):
        return entry
    out = dict(entry)
    summary = dict(out["summary"])
    samples = [float(x) for x in summary.get("samples") or ()]
    if samples:
        summary["samples"] = _kept_samples(samples, *_noise(entry, samples))
    summary["median"] = _kept(summary["median"])
    every = len(samples) == summary.get("n", len(samples))
    for key in _DERIVED:
        if key in summary:
            if every and samples:
                del summary[key]
            else:
                summary[key] = _kept(summary[key])
    out["summary"] = summary
    if out.get("runs"):
        out["runs"] = [r | {k: _kept(r[k]) for k in ("median", "spread") if k in r} for r in out["runs"]]
    return out


def full_summary(summary: dict) -> dict:
    """A stored summary with the figures a file left out (stored_entry) computed again from its samples, which
    are then every sample taken; a summary that holds them, or whose samples are quantiles of more, as it is."""
    samples = summary.get("samples") or ()
    missing = [k for k in _DERIVED if k not in summary]
    if not missing or not samples or len(samples) != summary.get("n", len(samples)):
        return summary
    from perfgate.judge.metrics import summarize

    again = summarize(samples).to_dict()
    return summary | {k: again[k] for k in missing}


def _ordered(entry: dict) -> dict:
    first = {k: entry[k] for k in _FIXED_FIELDS if k in entry}
    return first | {k: v for k, v in entry.items() if k not in first}


def baseline_bytes(doc: dict) -> bytes:
    """The committed form of a baseline document: the header as indented JSON, then one line per (test id,
    metric) entry, tests and metrics sorted, fixed fields first. NaN and infinities are refused."""
    head = {k: v for k, v in doc.items() if k != "entries"}
    lines = [json.dumps(head, indent=1, allow_nan=False)[:-2] + ","]  # the header without its closing brace
    tests = sorted(doc["entries"].items())
    if not tests:
        return ("\n".join(lines) + '\n "entries": {}\n}\n').encode()
    lines.append(' "entries": {')
    for i, (test, metrics) in enumerate(tests):
        lines.append(f"  {json.dumps(test)}: {{")
        names = sorted(metrics)
        for j, metric in enumerate(names):
            line = json.dumps(_ordered(metrics[metric]), separators=(",", ":"), allow_nan=False)
            lines.append(f"   {json.dumps(metric)}: {line}{',' if j < len(names) - 1 else ''}")
        lines.append("  }" + ("," if i < len(tests) - 1 else ""))
    return ("\n".join(lines) + "\n }\n}\n").encode()


def _can_be_id(name: str) -> bool:
    try:
        check_hardware_id(name, source="baseline folder")
    except HardwareIdError:
        return False
    return True


def fingerprint_key(fingerprint: dict) -> str:
    """A short name for a fingerprint in a baseline file's ``fingerprints`` table (its content's hash)."""
    return hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()[:12]


def machines_of_kept(kept: dict[str, dict], old: dict, fingerprint: dict | None
                     ) -> tuple[dict[str, dict], dict[str, dict], dict | None]:
    """(kept entries, ``fingerprints`` table, the file's ``fingerprint``) for a merge that writes new
    entries measured on ``fingerprint`` beside ``kept`` ones (raw dicts) of the old file ``old``.

    Why: a file holds one fingerprint, and the gate compares each entry's machine with this one
    through it. A partial refresh (``--test``, ``--metric``, one area's tests) from another machine of
    the id (another CPU generation, GPU clocks, SMT) used to overwrite it, and the entries it kept then
    claimed the new machine: judged as comparable where they are not, or the other way round. Now a
    kept entry whose machine differs (in a field the gate compares) from the new one names its own
    machine in the table; where it is the same as the new one, it needs no name. ``fingerprint``
    None (an import that knows no machine) keeps the old one as it was."""
    from perfgate.judge.fingerprint_check import compare

    old_default = old.get("fingerprint")
    table = dict(old.get("fingerprints") or {})
    default = old_default if fingerprint is None else fingerprint

    def same(a: dict, b: dict) -> bool:  # neither differs from the other in a compared field, nor lacks one
        there, back = compare(a, b), compare(b, a)
        return not (there.relevant or back.relevant or there.unverified or back.unverified)
    out: dict[str, dict] = {}
    for test, metrics in kept.items():
        for metric, e in metrics.items():
            key = e.get("fingerprint_key")
            # an entry of a file that knew no machine keeps not knowing ({}: every field unverified)
            machine = (table.get(key) if key else old_default) or {}
            e = {k: v for k, v in e.items() if k != "fingerprint_key"}
            if default is not None and not same(machine, default):
                name = fingerprint_key(machine)
                table[name] = machine
                e["fingerprint_key"] = name
            out.setdefault(test, {})[metric] = e
    used = {e["fingerprint_key"] for m in out.values() for e in m.values() if "fingerprint_key" in e}
    return out, {k: v for k, v in sorted(table.items()) if k in used}, default


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


# The id folder's own .gitignore, written where the folder has none: what perfgate leaves beside a
# baseline (the area's lock file, the ``.prev`` backup, a temporary file of a write that was killed)
# is never untracked noise in a user's tree, and never committed by `git add -A`. It ignores itself,
# so it is no noise either.
GITIGNORE = ("# written by perfgate: its lock files, the backups of replaced baselines and the temporary files of\n"
             "# unfinished writes are not baselines (this file ignores itself too)\n"
             ".gitignore\n*.json.lock\n*.json.prev\n.*.tmp\n").encode()


def _ignore_own_files(folder: int) -> None:
    """Write the id folder's .gitignore (:data:`GITIGNORE`) unless it has one: a user's own stays as it is."""
    try:
        os.stat(".gitignore", dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        replace_in(folder, ".gitignore", GITIGNORE)


def _remove_stale_temp_files(folder: int, name: str) -> list[str]:
    """Remove the temporary files of earlier writes of ``name`` (and of its ``.prev``) that never finished
    (a writer killed with SIGKILL skips every cleanup: a 1.4 MB ``.collectives.json.prev.<hex>.tmp`` stayed
    beside the baseline for good). Called under ``name``'s lock, so none of them is being written."""
    stale = re.compile(rf"\.{re.escape(name)}(\.prev)?\.[0-9a-f]{{12}}\.tmp")
    removed = []
    for entry in os.listdir(folder):
        if stale.fullmatch(entry):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(entry, dir_fd=folder)
                removed.append(entry)
    return removed


class BaselineStore:
    def __init__(self, root: Path, *, lock_timeout_s: float = locks.LOCK_TIMEOUT_S):
        self.root = Path(root)
        self.lock_timeout_s = lock_timeout_s
        self._cache: dict[Path, dict] = {}

    def path(self, hardware_id: str, area: str) -> Path:
        """``<root>/<hardware-id>/<area>.json``; refuses names and links that lead outside the root."""
        check_hardware_id(hardware_id, source="baseline folder name")
        check_area(area, source=f"baseline file name in {self.root / hardware_id}")
        return inside_root(self.root, self.root / hardware_id / f"{area}.json", what="baseline file")

    def hardware_ids(self) -> list[str]:
        """Folders that can be hardware ids (others, like ``.git`` or ``my notes``, are not baselines)."""
        if not self.root.is_dir():
            return []
        return sorted(p.name for p in self.root.iterdir() if p.is_dir() and _can_be_id(p.name) and any(p.glob("*.json")))

    def _read(self, path: Path) -> dict:
        if path in self._cache:
            return self._cache[path]
        if not path.exists():
            return {}
        fix = f"restore it from git (`git checkout -- {path}`) or delete it and run `perfgate refresh`"
        try:
            doc = read_json(path, fix=fix, error=BaselineError)
        except FileNotFoundError:
            return {}
        if not isinstance(doc, dict) or doc.get("kind") != KIND:
            raise BaselineError(f"{path}: not a perfgate baseline file (kind != {KIND!r}); {fix}")
        check_schema(path, doc.get("schema_version"), READABLE_SCHEMAS, what="", error=BaselineError,
                     fix="upgrade perfgate or re-create the file with `perfgate refresh`")
        if not isinstance(doc.get("entries"), dict):
            raise BaselineError(f"{path}: has no 'entries' table; {fix}")
        check_baseline_document(Checker(path, fix=fix, error=BaselineError), doc)
        self._cache[path] = doc
        return doc

    def load(self, hardware_id: str, area: str) -> dict[str, dict[str, BaselineEntry]]:
        path = self.path(hardware_id, area)
        doc = self._read(path)
        try:
            return {test: {m: BaselineEntry.from_dict(e | {"summary": full_summary(e["summary"])})
                           for m, e in metrics.items()}
                    for test, metrics in doc.get("entries", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"{path}: malformed entry ({exc!r}); restore it from git or re-run "
                                f"`perfgate refresh`") from None

    def document(self, hardware_id: str, area: str) -> dict:
        return self._read(self.path(hardware_id, area))

    def lookup(self, hardware_id: str, area: str, test_id: str, metric: str) -> BaselineEntry | None:
        return self.load(hardware_id, area).get(test_id, {}).get(metric)

    def write(self, hardware_id: str, area: str, entries: dict[str, dict[str, BaselineEntry]], *,
              fingerprint: dict[str, Any] | None = None, replace: bool = False) -> Path:
        """Merge ``entries`` into the area's file (or replace it) atomically, keeping ``.prev``.

        Under the area's lock (perfgate.store.locks), through the id folder opened without
        following links (safe_paths.writable_folder): the old file is copied to a new ``.prev``
        and the new document to a new file, each renamed into place (atomic.replace_in), so a
        link or hard link planted at any of the three names is replaced, never written into,
        and a failure half way (disk full) leaves each name holding a complete file: the
        ``.prev`` copy failing leaves both as they were; the new file failing, ``.prev`` equal to
        the unchanged current file."""
        path = self.path(hardware_id, area)
        for suffix, what in ((".lock", "lock file"), (".prev", "backup file")):
            inside_root(self.root, Path(str(path) + suffix), what=what)  # a link out of the tree: say so
        with writable_folder(self.root, hardware_id) as folder:
            _ignore_own_files(folder)
            with locks.exclusive(folder, path.name + ".lock", shown=Path(str(path) + ".lock"),
                                 timeout_s=self.lock_timeout_s):
                _remove_stale_temp_files(folder, path.name)  # under the lock: no writer of this area is mid-write
                return self._write_locked(folder, path, hardware_id, area, entries, fingerprint, replace)

    def _write_locked(self, folder: int, path: Path, hardware_id: str, area: str,
                      entries: dict[str, dict[str, BaselineEntry]], fingerprint: dict[str, Any] | None,
                      replace: bool) -> Path:
        """The body of :meth:`write`, under the area's lock, in the open id folder ``folder``."""
        self._cache.pop(path, None)
        if path.is_symlink():  # in the tree (a link out of it was refused above): still not ours to follow
            raise PathError(f"baseline file: {path} is a symbolic link (to {os.readlink(path)}); perfgate "
                            f"never writes through one: replace it with the file (`git checkout`) or remove it")
        current = read_in(folder, path.name)
        old = self._read(path) if current is not None else {}
        kept: dict[str, dict] = {} if replace else {t: dict(m) for t, m in old.get("entries", {}).items()}
        for test, metrics in entries.items():  # an entry written now is measured on ``fingerprint``
            for m in metrics:
                kept.get(test, {}).pop(m, None)
        merged, table, default = machines_of_kept(kept, old, fingerprint)
        for test, metrics in entries.items():
            merged.setdefault(test, {}).update({m: stored_entry(e.to_dict()) for m, e in metrics.items()})
        doc = {"schema_version": SCHEMA_VERSION, "kind": KIND, "hardware_id": hardware_id, "area": area,
               "updated": now_iso(), "fingerprint": default,
               **({"fingerprints": table} if table else {}),
               "entries": dict(sorted((t, m) for t, m in merged.items() if m))}
        # never write what the reader would refuse (the writer's checks should have said which number first)
        check_baseline_document(Checker(path, fix="this is a bug in the writer's checks: nothing was written",
                                        error=BaselineError), doc)
        data = baseline_bytes(doc)
        if current is not None:
            replace_in(folder, path.name + ".prev", current)
        replace_in(folder, path.name, data)
        self._cache.pop(path, None)
        return path
