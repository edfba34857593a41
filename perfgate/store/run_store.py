"""How a baseline names the run it came from: ``{"file": "<hardware-id>/<name>.gz", "sha256": ...}``.

A baseline is a summary of runs; the runs themselves (every sample, every attachment) are what lets anyone
re-derive it, so they are kept in a results store outside the code tree (perfgate.store.backends: a
folder, an SQLite file or PostgreSQL). A run is known by the sha256 of its uncompressed JSON bytes, so a
copy that was re-compressed, or moved into another store, is still the same run and an edited one is not;
its name is the results file's own, gzipped, under its hardware id. ``perfgate verify-baselines`` finds
each named run in any store and re-derives the run's median from it.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

from perfgate.store import results as results_mod
from perfgate.store.backends import ENV, StoreError, documents, open_store  # noqa: F401 (ENV: one name for all)
from perfgate.store.readers import ReadError, read_text


def uncompressed_bytes(path: Path) -> bytes:
    """The JSON bytes of a results file, gunzipped when they are gzipped (read as every file is read)."""
    try:
        return read_text(Path(path), fix="restore it from where it was copied").encode("utf-8")
    except ReadError as exc:
        raise StoreError(str(exc)) from None


def content_sha256(path: Path) -> str:
    return hashlib.sha256(uncompressed_bytes(path)).hexdigest()


def stored_name(path: Path) -> str:
    """What a results file is called in a store: its own name, gzipped."""
    name = Path(path).name
    return name if name.endswith(".gz") else f"{name}.gz"


def run_reference(path: Path, hardware_id: str) -> dict:
    """How a baseline's run summary names the results file it came from: ``{"file": "<hardware-id>/<name>",
    "sha256": ...}``, the name ``perfgate store add`` gives the file, the same in every store."""
    return {"file": f"{hardware_id}/{stored_name(path)}", "sha256": content_sha256(path)}


def add(store: str | Path, path: Path, *, name: str | None = None) -> tuple[dict, bool]:
    """Store one results file (``name``: its store name, default :func:`stored_name`): its run reference, and
    whether it was added (False: the same run was stored already, under the reference's name or another)."""
    doc = results_mod.load(path)  # a results file, checked, or one line saying what is wrong
    with open_store(store, create=True) as opened:
        stored = opened.put(uncompressed_bytes(path), documents.stored_name(doc["hardware_id"],
                                                                            name or stored_name(path)))
    return {"file": stored.entry.name, "sha256": stored.entry.sha256}, stored.added
