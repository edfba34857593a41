"""The results store as a folder: ``<root>/<hardware-id>/<name>.json.gz``, laid out like asv's results folder.

What a code tree or a results branch keeps (this repository's results-store/ holds the digests of the runs
its baselines pool), and what ``pytest --perf-history DIR`` folders are (their results files lie directly
in DIR; they are read as ``<hardware-id>/<file name>``). Writing always lays a file out as
``<hardware-id>/<name>.gz``, gzipped without a timestamp, by atomic rename: a reader sees the whole file
or none. Files that are not perfgate documents (notes, logs, README.md) are left alone.

A folder has no index: opening one reads every file once (hash and metric rows), ~1 s per 20 MB of
gzipped runs. Past a few thousand runs use an SQLite file or PostgreSQL (perfgate.store.backends.sql).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from perfgate.store.atomic import write_bytes_atomic
from perfgate.store.backends import documents
from perfgate.store.backends.base import ResultsStore, Stored, checked_raw
from perfgate.store.backends.documents import Entry, MetricRow, StoreError
from perfgate.store.readers import MAX_FILE_BYTES
from perfgate.store.safe_paths import PathError, inside_root

SUFFIXES = (".json", ".json.gz")


class FolderStore(ResultsStore):
    def __init__(self, root: Path, *, create: bool):
        self.root = Path(root)
        self.where = f"results store {self.root}"
        if self.root.exists() and not self.root.is_dir():
            raise StoreError(f"{self.where}: not a folder; name the store's folder, an SQLite file (*.sqlite) or "
                             f"a postgresql:// URL")
        if not self.root.exists() and not create:
            raise StoreError(f"{self.where}: no such folder; fetch or create the store first")
        self._index: dict[str, tuple[Entry, Path]] | None = None   # sha256 -> entry, file
        self._rows: list[MetricRow] = []

    # --- the index: every file read once -------------------------------------------------------
    def _files(self) -> list[Path]:
        """Every candidate file: DIR/*.json* (a history folder) and DIR/<hardware-id>/*.json* (a store)."""
        if not self.root.is_dir():
            return []
        out = []
        for item in sorted(self.root.iterdir()):
            if item.is_file() and item.name.endswith(SUFFIXES):
                out.append(item)
            elif item.is_dir() and not item.name.startswith("."):
                out += [f for f in sorted(item.iterdir()) if f.is_file() and f.name.endswith(SUFFIXES)]
        return out

    def _read_file(self, path: Path) -> bytes:
        try:
            inside_root(self.root, path, what="stored results file", root_is="the results store")
        except PathError as exc:
            raise StoreError(str(exc)) from None
        if path.stat().st_size > MAX_FILE_BYTES:
            raise StoreError(f"{path}: larger than {MAX_FILE_BYTES // 2**20} MiB, far beyond any run")
        return documents.gunzipped(path.read_bytes(), str(path))

    def _scan(self) -> dict[str, tuple[Entry, Path]]:
        if self._index is not None:
            return self._index
        index: dict[str, tuple[Entry, Path]] = {}
        rows: list[MetricRow] = []
        for path in self._files():
            raw = self._read_file(path)
            if not _is_ours(raw):
                continue  # a note or a counts file beside the runs
            doc = documents.parse(raw, str(path))
            name = f"{doc['hardware_id']}/{path.name}"  # as baselines name it (an older folder may hold another id)
            sha = doc["run_sha256"] if doc["kind"] == documents.DIGEST_KIND else documents.sha256_of(raw)
            entry = documents.entry_of(doc, sha, name)
            held = index.get(sha)
            if held is not None and (entry.digest or not held[0].digest):
                continue  # the same run twice (a copy, or its digest beside it): the run, once
            index[sha] = (entry, path)
            rows = [r for r in rows if r.sha256 != sha] + documents.metric_rows(doc, entry)
        self._index, self._rows = index, rows
        return index

    # --- writing -------------------------------------------------------------------------------
    def _put(self, entry: Entry, raw: bytes, rows: list[MetricRow]) -> Stored:
        index = self._scan()
        held = index.get(entry.sha256)
        if held is not None and not (held[0].digest and not entry.digest):
            return Stored(held[0], added=False)
        by_name = {e.name: (e, p) for e, p in index.values()}
        name_holder = by_name.get(entry.name)
        if name_holder is not None and name_holder[0].sha256 != entry.sha256:
            raise StoreError(f"{self.where}: {entry.name} already holds another run (sha256 "
                             f"{name_holder[0].sha256[:12]}); store this one under another name (--as NAME)")
        try:
            path = inside_root(self.root, self.root / entry.name, what="stored results file",
                               root_is="the results store")
        except PathError as exc:
            raise StoreError(str(exc)) from None
        if path.exists() and name_holder is None:
            raise StoreError(f"{self.where}: {path} exists and is not a perfgate run; rename the run (--as NAME)")
        write_bytes_atomic(path, documents.packed(raw))
        if held is not None and held[1] != path:  # a digest replaced by its run under another name
            os.unlink(held[1])
        index[entry.sha256] = (entry, path)
        self._rows = [r for r in self._rows if r.sha256 != entry.sha256] + rows
        return Stored(entry, added=True)

    # --- reading -------------------------------------------------------------------------------
    def entries(self, hardware_id: str | None = None) -> list[Entry]:
        found = [e for e, _ in self._scan().values() if hardware_id is None or e.hardware_id == hardware_id]
        return sorted(found, key=lambda e: (e.created, e.name))

    def entry(self, key: str) -> Entry | None:
        index = self._scan()
        if not isinstance(key, str):
            return None
        if key in index:
            return index[key][0]
        if 12 <= len(key) < 64 and all(ch in "0123456789abcdef" for ch in key):
            found = [e for sha, (e, _) in index.items() if sha.startswith(key)]
            if len(found) > 1:
                raise StoreError(f"{self.where}: {key} is the start of several runs' sha256; give more digits")
            return found[0] if found else None
        return next((e for e, _ in index.values() if e.name == key), None)

    def raw(self, sha256: str) -> bytes:
        entry = self.require(sha256)
        return checked_raw(entry, self._read_file(self._scan()[entry.sha256][1]), self.where)

    def metric_rows(self, hardware_id: str | None = None) -> list[MetricRow]:
        self._scan()
        rows = [r for r in self._rows if hardware_id is None or r.hardware_id == hardware_id]
        return sorted(rows, key=lambda r: (r.created, r.name))

    def series(self, hardware_id: str, test_id: str, metric: str) -> list[MetricRow]:
        return [r for r in self.metric_rows(hardware_id) if r.test_id == test_id and r.metric == metric]

    def path_of(self, key: str) -> Path:
        """The file that holds a run (for messages that point at it)."""
        return self._scan()[self.require(key).sha256][1]


def _is_ours(raw: bytes) -> bool:
    """Whether a JSON file beside the runs is a perfgate run or digest (anything else there is a note)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError):
        return True  # a damaged run: parse() says what is wrong with it
    return isinstance(doc, dict) and doc.get("kind") in (documents.RESULTS_KIND, documents.DIGEST_KIND)
