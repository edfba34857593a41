"""How a baseline names the run it came from: ``{"file": "<hardware-id>/<name>.gz", "sha256": ...}``.

A baseline is a summary of runs; the runs themselves (every sample, every attachment) are what lets anyone
re-derive it, so they are kept in a results store outside the code tree (perfgate.store.backends: a
folder, an SQLite file or PostgreSQL). A run is known by the sha256 of its uncompressed JSON bytes, so a
copy that was re-compressed, or moved into another store, is still the same run and an edited one is not;
its name is the results file's own, gzipped, under its hardware id. ``perfgate verify-baselines`` finds
each named run in any store and re-derives the run's median from it.

:func:`load_runs` is how the commands that pool or count runs (refresh, calibrate --from, power --tally)
take them: a results file by its path, or a run of a results store by its hash or name, read through the
store's interface (perfgate.store.backends) whatever the backend.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
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


@dataclass(frozen=True)
class LoadedRun:
    """One run as a command pools or counts it."""

    name: str          # how messages show it: the results file's path, or the run's name in its store
    doc: dict          # the checked results document
    reference: dict    # how a baseline names it: {"file": "<hardware-id>/<name>.gz", "sha256": ...}


def load_runs(names: list[str], store: str | None = None) -> list[LoadedRun]:
    """Each of ``names``: a results file where that path exists, else a run of the results store
    ``store`` (``--store``, else $PERFGATE_RESULTS_STORE, else the embedded default) by its sha256, a
    prefix of 12+ of its digits, or ``<hardware-id>/<name>``. A digest is refused: it has no samples."""
    out: list[LoadedRun] = []
    opened = None
    try:
        for name in map(str, names):
            path = Path(name)
            if path.exists() or path.is_symlink():  # a file (a device or a folder is refused as one)
                doc = results_mod.load(path)
                out.append(LoadedRun(str(path), doc, run_reference(path, doc["hardware_id"])))
                continue
            if opened is None:
                try:
                    opened = open_store(store)
                except StoreError as exc:
                    raise StoreError(f"{_shown(name)}: no such results file, and no results store to find it in "
                                     f"({exc})") from None
            entry = opened.entry(name)
            if entry is None:
                raise StoreError(f"{_shown(name)}: no such results file, and {opened.where} holds no run of that sha256 "
                                 f"or name; give a file written by `pytest --perf-save`, or a run listed by "
                                 f"`perfgate store list --store ...`")
            if entry.digest:
                raise StoreError(f"{opened.where}: {entry.name} is the digest of its run (summaries, no samples); "
                                 f"pool the run itself: copy it from the store that holds it (`perfgate store copy`)")
            out.append(LoadedRun(entry.name, opened.document(entry.sha256),
                                 {"file": entry.name, "sha256": entry.sha256}))
    finally:
        if opened is not None:
            opened.close()
    return out


def _shown(name: str) -> str:
    return repr(name if len(name) <= 100 else name[:97] + "...")


def runs_of(store: str | None, hardware_id: str) -> list[str]:
    """The sha256 of every run (not digest) of ``hardware_id`` in a store, oldest first."""
    with open_store(store) as opened:
        return [e.sha256 for e in opened.entries(hardware_id) if not e.digest]


def session_name(doc: dict, raw: bytes, part: str = "") -> str:
    """What a session's run (``doc``, stored as ``raw``) is called in a store where it has no file of its own:
    its start time, commit, ``part`` where one command runs several sessions, and the first 12 digits of its
    sha256 (``2026-12-07T120000Z-1a2b3c4d5e6f-5a9686d03b40.json``): two sessions of one commit that start in the
    same second (CI shards on one runner) are two runs, never one name claimed twice."""
    stamp = doc["created"].replace(":", "").replace("+0000", "Z")
    digest = hashlib.sha256(raw).hexdigest()[:12]
    return f"{stamp}-{doc['commit'] or 'nocommit'}{f'-{part}' if part else ''}-{digest}.json"


def push(store: str | None, raw: bytes, hardware_id: str, file_name: str) -> dict:
    """Store one run's bytes in ``store`` (created if missing) as ``<hardware-id>/<file_name>.gz``, once:
    what ``pytest --perf-history STORE`` does at the end of a session. Its run reference."""
    with open_store(store, create=True) as opened:
        stored = opened.put(raw, documents.stored_name(hardware_id, file_name))
    return {"file": stored.entry.name, "sha256": stored.entry.sha256}
