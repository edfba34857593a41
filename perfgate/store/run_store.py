"""The results store: raw results files kept outside the code, named like asv's results folder.

A baseline is a summary of runs; the runs themselves (every sample, every attachment) are what
lets anyone re-derive it, so they are kept, but not in the code tree, where every refresh would
grow the repository (issue 26). The store is a folder the user names (``--store DIR`` or
PERFGATE_RESULTS_STORE), laid out as ``<hardware-id>/<name>``: the results file's own name,
gzipped. A file is known by the sha256 of its uncompressed JSON bytes, so a copy that was
re-compressed is still the same file and an edited one is not.

A baseline's run summary names its results file by that relative name and hash
(``run_reference``): never a machine path, which means nothing on another machine. With the
store checked out anywhere, ``perfgate verify-baselines`` finds each file and re-derives the
run's median from it.
"""
from __future__ import annotations

import gzip
import hashlib
import os
import zlib
from pathlib import Path

from perfgate.machine.hardware_id import HardwareIdError, check_hardware_id
from perfgate.store import results as results_mod
from perfgate.store.atomic import write_bytes_atomic
from perfgate.store.safe_paths import PathError, check_area, inside_root

ENV = "PERFGATE_RESULTS_STORE"
SUFFIXES = (".json", ".json.gz")  # .json: files moved into a store as they were, never rewritten


class StoreError(ValueError):
    """A results store or a file in it is unusable; the message names the path and the fix."""


def root_of(store: Path | None) -> Path:
    """The store folder: ``--store`` if given, else $PERFGATE_RESULTS_STORE; an error naming both otherwise."""
    chosen = store if store is not None else os.environ.get(ENV)
    if not chosen:
        raise StoreError(f"no results store named: pass --store DIR or set {ENV}=DIR (a folder outside the "
                         f"code tree, e.g. a checkout of a results branch)")
    root = Path(chosen)
    if root.exists() and not root.is_dir():
        raise StoreError(f"results store {root}: not a folder; name the store's folder")
    return root


def uncompressed_bytes(path: Path) -> bytes:
    """The JSON bytes of a results file, gunzipped when its name ends in .gz."""
    data = Path(path).read_bytes()
    if Path(path).name.endswith(".gz"):
        try:
            return gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as exc:  # BadGzipFile is an OSError
            raise StoreError(f"{path}: not a complete gzip file ({exc}); restore it from where it was copied") from None
    return data


def content_sha256(path: Path) -> str:
    return hashlib.sha256(uncompressed_bytes(path)).hexdigest()


def stored_name(path: Path) -> str:
    """What a results file is called in a store: its own name, gzipped."""
    name = Path(path).name
    return name if name.endswith(".gz") else f"{name}.gz"


def run_reference(path: Path, hardware_id: str) -> dict:
    """How a baseline's run summary names the results file it came from: ``{"file": "<hardware-id>/<name>",
    "sha256": ...}``, the name ``perfgate store add`` gives the file, relative to any store's root."""
    return {"file": f"{hardware_id}/{stored_name(path)}", "sha256": content_sha256(path)}


def _check_name(name: str) -> None:
    """A stored name is ``<hardware-id>/<file name>``: two safe components, nothing that leaves the store."""
    parts = name.split("/") if isinstance(name, str) else []
    try:
        if len(parts) != 2:
            raise PathError("")
        check_hardware_id(parts[0], source="results store folder")
        check_area(parts[1], source="results file name")
    except (HardwareIdError, PathError):
        raise StoreError(f"{name!r} is not a results store name: it must be <hardware-id>/<file name> "
                         f"(e.g. cpu-AMD-EPYC-avx512-2c/ci-ac4ae1d.json.gz)") from None


def path_of(root: Path, name: str) -> Path:
    """``<root>/<name>`` for a stored name, refusing names and links that lead outside the store."""
    _check_name(name)
    try:
        return inside_root(root, Path(root) / name, what="stored results file")
    except PathError as exc:
        raise StoreError(str(exc)) from None


def stored_files(root: Path) -> list[str]:
    """Every results file in the store, as ``<hardware-id>/<name>`` (notes and logs beside them are not)."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(f"{folder.name}/{f.name}" for folder in root.iterdir() if folder.is_dir()
                  for f in folder.iterdir() if f.is_file() and f.name.endswith(SUFFIXES))


def add(root: Path, path: Path) -> dict:
    """Copy one results file into the store, gzipped, and return its run reference.

    Refuses a file whose content is already stored (under any name) and a name already taken by
    other content: a stored file is never replaced, since baselines name it by its hash."""
    doc = results_mod.load(path)  # a results file, checked, or one line saying what is wrong
    ref = run_reference(path, doc["hardware_id"])
    for name in stored_files(root):
        if content_sha256(Path(root) / name) == ref["sha256"]:
            raise StoreError(f"{path}: already in the store {root} as {name} (same sha256 {ref['sha256'][:12]}); "
                             f"not added again")
    dest = path_of(root, ref["file"])
    if dest.exists():
        raise StoreError(f"{path}: {dest} already holds another run's results; rename the file (e.g. to "
                         f"ci-<commit>.json) and add it again")
    write_bytes_atomic(dest, gzip.compress(uncompressed_bytes(path), mtime=0))
    return ref
