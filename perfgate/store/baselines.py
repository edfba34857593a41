"""BaselineStore: committed reference numbers, one JSON file per hardware id and area.

Layout: ``<root>/<hardware-id>/<area>.json``. Files are schema-versioned, written
atomically under a file lock (xdist workers and concurrent refreshes never lose
entries), and the previous version is kept as ``<area>.json.prev`` so a refresh can be
undone. Reading a malformed file fails with the path and the fix, never a traceback.
"""
from __future__ import annotations

import shutil
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterator

from filelock import FileLock

from perfgate.store.atomic import write_json_atomic
from perfgate.machine.hardware_id import HardwareIdError, check_hardware_id
from perfgate.judge.metrics import Summary
from perfgate.store.readers import Checker, ReadError, read_json
from perfgate.store.shapes import check_baseline_document, check_schema
from perfgate.store.safe_paths import check_area, inside_root

SCHEMA_VERSION = 2  # 2: entries may carry `runs` (one summary per contributing run)
READABLE_SCHEMAS = (1, 2)
KIND = "perfgate-baseline"


class BaselineError(ReadError):
    """A baseline file is unreadable or of the wrong schema; the message names the file."""


@dataclass(frozen=True)
class BaselineEntry:
    """The reference for one metric of one test on one hardware id."""

    unit: str
    better: str
    summary: Summary
    tol: float | None
    provenance: str  # "measured" or "imported: <source>"
    when: str | None = None
    commit: str | None = None
    software: dict | None = None
    source: str | None = None  # for imported numbers: the section of the report
    spread: dict | None = None  # from `perfgate calibrate`: run-to-run spread and the tolerance it proposed
    runs: tuple[dict, ...] = ()  # one run_noise.RunSummary dict per contributing run (schema 2)
    workload: dict | None = None  # what was measured beyond the test id (PerfRecorder.identify)

    def to_dict(self) -> dict:
        d = {"unit": self.unit, "better": self.better, "tol": self.tol, "summary": self.summary.to_dict(),
             "provenance": self.provenance, "when": self.when, "commit": self.commit, "software": self.software}
        if self.source:
            d["source"] = self.source
        if self.spread:
            d["spread"] = self.spread
        if self.runs:
            d["runs"] = [dict(r) for r in self.runs]
        if self.workload:
            d["workload"] = dict(self.workload)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "BaselineEntry":
        return cls(unit=d["unit"], better=d["better"], summary=Summary.from_dict(d["summary"]), tol=d.get("tol"),
                   provenance=d.get("provenance", "measured"), when=d.get("when"), commit=d.get("commit"),
                   software=d.get("software"), source=d.get("source"), spread=d.get("spread"),
                   runs=tuple(d.get("runs") or ()), workload=d.get("workload") or None)

    @property
    def is_imported(self) -> bool:
        return self.provenance.startswith("imported")


def _can_be_id(name: str) -> bool:
    try:
        check_hardware_id(name, source="baseline folder")
    except HardwareIdError:
        return False
    return True


def now_iso() -> str:
    return datetime.now(timezone.utc).replace(microsecond=0).isoformat()


class BaselineStore:
    def __init__(self, root: Path):
        self.root = Path(root)
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
            return {test: {m: BaselineEntry.from_dict(e) for m, e in metrics.items()}
                    for test, metrics in doc.get("entries", {}).items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise BaselineError(f"{path}: malformed entry ({exc!r}); restore it from git or re-run "
                                f"`perfgate refresh`") from None

    def document(self, hardware_id: str, area: str) -> dict:
        return self._read(self.path(hardware_id, area))

    def lookup(self, hardware_id: str, area: str, test_id: str, metric: str) -> BaselineEntry | None:
        return self.load(hardware_id, area).get(test_id, {}).get(metric)

    @contextmanager
    def locked(self, hardware_id: str, area: str) -> Iterator[Path]:
        path = self.path(hardware_id, area)
        path.parent.mkdir(parents=True, exist_ok=True)
        # older filelock releases open the lock with O_TRUNC (3.32 refuses links with a bare ELOOP): a link
        # planted in its place must neither truncate its target nor fail without saying why
        lock = inside_root(self.root, Path(str(path) + ".lock"), what="lock file")
        with FileLock(str(lock), timeout=120):
            self._cache.pop(path, None)
            yield path
            self._cache.pop(path, None)

    def write(self, hardware_id: str, area: str, entries: dict[str, dict[str, BaselineEntry]], *,
              fingerprint: dict[str, Any] | None = None, replace: bool = False) -> Path:
        """Merge ``entries`` into the area's file (or replace it) atomically, keeping ``.prev``."""
        with self.locked(hardware_id, area) as path:
            old = self._read(path) if path.exists() else {}
            merged: dict[str, dict] = {} if replace else {t: dict(m) for t, m in old.get("entries", {}).items()}
            for test, metrics in entries.items():
                merged.setdefault(test, {}).update({m: e.to_dict() for m, e in metrics.items()})
            doc = {"schema_version": SCHEMA_VERSION, "kind": KIND, "hardware_id": hardware_id, "area": area,
                   "updated": now_iso(), "fingerprint": fingerprint or old.get("fingerprint"),
                   "entries": dict(sorted(merged.items()))}
            if path.exists():  # copy2 writes through a link: the backup must stay inside the root too
                shutil.copy2(path, inside_root(self.root, Path(str(path) + ".prev"), what="backup file"))
            write_json_atomic(path, doc)
            self._cache.pop(path, None)
            return path
