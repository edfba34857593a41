"""The results store's one interface: what every backend does, and what every reader may ask of it.

A store keeps runs (and digests of runs: perfgate.store.backends.documents) known by the sha256 of the
run's uncompressed JSON, each under a name ``<hardware-id>/<file name>``. Backends differ only in where
the bytes sit: a folder laid out as ``<hardware-id>/<name>.gz`` (FolderStore: what a code tree or a
results branch keeps) or one SQL schema (SqlStore: an SQLite file, the embedded default, or PostgreSQL
for a fleet). Every command that reads history -- trends, report, verify-baselines, calibrate, refresh,
``store copy`` -- talks to this class only.
"""
from __future__ import annotations

import abc
from dataclasses import dataclass

from perfgate.store.backends import documents
from perfgate.store.backends.documents import Entry, MetricRow, StoreError


@dataclass(frozen=True)
class Stored:
    """What a push did: the entry as stored, and whether this push added it (False: it was there)."""

    entry: Entry
    added: bool


class ResultsStore(abc.ABC):
    """A results store. ``where``: how messages name it (a URL never shows its password)."""

    where: str

    # --- writing -------------------------------------------------------------------------------
    def put(self, raw: bytes, name: str) -> Stored:
        """Store one run (or digest) from its bytes (gzipped or not) under ``name``, once.

        The same content already stored (under any name) is not stored again (``added`` False); a name
        taken by other content is refused (StoreError), since baselines name a run by name and hash. A
        whole run replaces a digest of itself; a digest never replaces the run."""
        raw = documents.gunzipped(raw, f"{self.where}: {name}")
        doc = documents.parse(raw, f"{self.where}: {name}")
        documents.check_name(name)
        if name.split("/", 1)[0] != doc["hardware_id"]:
            raise StoreError(f"{self.where}: {name}: the name's hardware id is not the run's "
                             f"({doc['hardware_id']}); store it under {doc['hardware_id']}/...")
        sha = doc["run_sha256"] if doc["kind"] == documents.DIGEST_KIND else documents.sha256_of(raw)
        entry = documents.entry_of(doc, sha, name)
        return self._put(entry, raw, documents.metric_rows(doc, entry))

    @abc.abstractmethod
    def _put(self, entry: Entry, raw: bytes, rows: list[MetricRow]) -> Stored:
        """Write the entry, its bytes and its rows as one unit: a reader sees all of them or none."""

    # --- reading -------------------------------------------------------------------------------
    @abc.abstractmethod
    def entries(self, hardware_id: str | None = None) -> list[Entry]:
        """Every stored run and digest (of one hardware id), oldest first (created, then name)."""

    @abc.abstractmethod
    def entry(self, key: str) -> Entry | None:
        """The entry of a sha256 (or a unique prefix of 12 or more hex digits), or of a stored name."""

    @abc.abstractmethod
    def raw(self, sha256: str) -> bytes:
        """The stored bytes (uncompressed) of a run or digest, checked against its hash where it is a run."""

    @abc.abstractmethod
    def metric_rows(self, hardware_id: str | None = None) -> list[MetricRow]:
        """Every metric row (of one hardware id), oldest run first: what trends and reports plot."""

    @abc.abstractmethod
    def series(self, hardware_id: str, test_id: str, metric: str) -> list[MetricRow]:
        """One series, oldest first, without reading a stored document."""

    def document(self, key: str) -> dict:
        """The checked document (run or digest) of a hash, hash prefix or name."""
        entry = self.require(key)
        return documents.parse(self.raw(entry.sha256), f"{self.where}: {entry.name}")

    def require(self, key: str) -> Entry:
        found = self.entry(key)
        if found is None:
            shown = key if len(key) <= 100 else key[:97] + "..."
            raise StoreError(f"{self.where}: no run {shown!r} (a sha256, a prefix of 12+ of its digits, or "
                             f"<hardware-id>/<name>); list them with `perfgate store list --store ...`")
        return found

    def hardware_ids(self) -> list[str]:
        return sorted({e.hardware_id for e in self.entries()})

    def close(self) -> None:
        """Release connections; a store is also a context manager."""

    def __enter__(self) -> "ResultsStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def checked_raw(entry: Entry, raw: bytes, where: str) -> bytes:
    """``raw`` if it is what ``entry`` names: a run's bytes hash to its sha256 (a changed row or file is
    refused, never read as the run)."""
    if not entry.digest and documents.sha256_of(raw) != entry.sha256:
        raise StoreError(f"{where}: {entry.name}: its bytes hash to {documents.sha256_of(raw)[:12]}, not the "
                         f"{entry.sha256[:12]} it is stored as (changed after it was stored); restore it "
                         f"from another copy (`perfgate store copy`)")
    return raw
