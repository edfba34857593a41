"""A small crash-safe checkpoint protocol: versioned shards, a SHA256 manifest, atomic publish.

Why our own protocol: the training tests must resume *exactly* (model, optimizer, RNG
streams, data cursor), and a crash in the middle of a save must never leave a half-written
checkpoint that the next run resumes from. The seed report (§15-§16) shows the recipe:
publish a manifest with a SHA256 per file by atomic rename, so partial versions stay
invisible. This module is that recipe, written down as an explicit list of steps so that a
test can crash it before any one of them.

Layout under ``root``::

    latest                   {"version": "v000002", "manifest_sha256": "..."} + a SHA256 line: the only way in
    v000001/manifest.json    {"format": 1, "version": ..., "files": {name: {"bytes", "sha256"}}}
    v000001/<shard files>
    .staging-v000003/        a save in progress, or one abandoned by a crash: never read

Save protocol (the order is the protocol; :func:`plan_save` returns exactly these steps):

    1. remove a stale ``.staging-vN`` left by an earlier crash, mkdir it
    2. every shard: create, write, fsync
    3. ``manifest.json``: create, write, fsync
    4. fsync the staging folder (its entries), rename it to ``vN``, fsync ``root``
    5. ``latest.tmp``: create, write, fsync; rename over ``latest`` (**the publish step**);
       fsync ``root``

A crash before the publish step leaves the previous version latest; after it, the new
version is latest, complete and durable. Load follows ``latest``, checks the pointer's own
checksum line, the manifest's hash (recorded in ``latest``) and every shard's size and
SHA256 *before* deserialising a byte, and refuses with :class:`CheckpointCorruptError`
naming the file otherwise.

On top of the byte-level protocol, :func:`save_training_state` / :func:`load_training_state`
(built on :func:`encode_training_state` / :func:`restore_training_state`) turn a model, an
optimizer, the torch / numpy / Python (and CUDA, where present) RNG states and a data cursor
into shards and back, bitwise.

Test-only fault injection (never set these in real use):

* ``CheckpointDir(root, crash=CrashPlan(before_step=i, power_loss=...))`` raises
  :class:`SimulatedCrash` before step ``i`` of the next save (``i == len(plan)`` crashes
  after the last step). ``power_loss=False`` models a killed process: every byte written
  stays. ``power_loss=True`` models a machine losing power: every file whose data was
  written but not fsynced comes back empty (what ext4's delayed allocation does to a
  renamed-but-unsynced file). Directory entries are modelled as durable in order; we do
  not model lost renames.
* ``bugs=`` planted bugs, so a property test can show it catches each one; see
  :data:`PLANTED_BUGS`.
"""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

FORMAT = 1
MANIFEST = "manifest.json"
LATEST = "latest"
_VERSION_RE = re.compile(r"^v(\d{6,})$")
_SHARD_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

PLANTED_BUGS: dict[str, str] = {
    "skip_fsync": "the writer never calls fsync (files nor folders): a power loss empties files",
    "skip_rename": "the writer writes shards straight into vN and overwrites `latest` in place "
                   "(no staging folder, no temp file + rename)",
    "skip_verify": "the loader trusts the files: no size or SHA256 check of shards, manifest or pointer",
    "drop_python_rng": "the training state omits Python's `random` state",
    "drop_optimizer_state": "the training state keeps the optimizer's param_groups but not its "
                            "per-parameter state (momentum, Adam moments, step)",
}


class CheckpointError(RuntimeError):
    """Base class: no usable checkpoint."""


class NoCheckpointError(CheckpointError):
    """Nothing has been published under this root yet."""


class CheckpointCorruptError(CheckpointError):
    """A published file is missing, truncated or has the wrong hash; ``path`` names it."""

    def __init__(self, message: str, *, path: Path):
        super().__init__(message)
        self.path = path


class SimulatedCrash(RuntimeError):
    """Test-only: raised by a :class:`CrashPlan` in place of the process dying."""


@dataclass(frozen=True)
class CrashPlan:
    """Test-only: crash the next save before step ``before_step`` of its plan."""

    before_step: int
    power_loss: bool = False


@dataclass(frozen=True)
class Step:
    """One durable-storage operation of a save. ``publishes``: the step that makes the version latest."""

    op: str  # rmtree | mkdir | create | write | fsync | fsync_dir | rename
    path: str  # relative to root
    dst: str = ""  # rename target
    data_key: str = ""  # write: which blob (shard name, MANIFEST or LATEST)
    publishes: bool = False

    def __str__(self) -> str:
        target = f"{self.path} -> {self.dst}" if self.op == "rename" else self.path
        return f"{self.op} {target}" + (" (publish)" if self.publishes else "")


def version_name(number: int) -> str:
    return f"v{number:06d}"


def plan_save(version: str, shard_names: list[str], bugs: frozenset[str] = frozenset()) -> list[Step]:
    """The exact list of steps a save performs; crash points are indices into it."""
    steps: list[Step] = []
    if "skip_rename" in bugs:
        folder = version
        steps.append(Step("mkdir", folder))
    else:
        folder = f".staging-{version}"
        steps += [Step("rmtree", folder), Step("mkdir", folder)]
    for name in [*shard_names, MANIFEST]:
        path = f"{folder}/{name}"
        steps += [Step("create", path), Step("write", path, data_key=name), Step("fsync", path)]
    if "skip_rename" in bugs:
        steps += [Step("fsync_dir", folder), Step("fsync_dir", "."),
                  Step("create", LATEST), Step("write", LATEST, data_key=LATEST, publishes=True),
                  Step("fsync", LATEST), Step("fsync_dir", ".")]
    else:
        steps += [Step("fsync_dir", folder), Step("rename", folder, dst=version), Step("fsync_dir", "."),
                  Step("create", f"{LATEST}.tmp"), Step("write", f"{LATEST}.tmp", data_key=LATEST),
                  Step("fsync", f"{LATEST}.tmp"),
                  Step("rename", f"{LATEST}.tmp", dst=LATEST, publishes=True), Step("fsync_dir", ".")]
    if "skip_fsync" in bugs:
        steps = [s for s in steps if s.op not in ("fsync", "fsync_dir")]
    return steps


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def encode_pointer(version: str, manifest_sha256: str) -> bytes:
    """``latest``: one JSON line, then the SHA256 of that line, so a damaged pointer is itself detected."""
    body = json.dumps({"version": version, "manifest_sha256": manifest_sha256}, sort_keys=True).encode()
    return body + b"\n" + _sha256(body).encode() + b"\n"


def decode_pointer(raw: bytes, *, verify: bool = True) -> dict[str, str]:
    """Parse ``latest``; ValueError says what is wrong with it."""
    body, sep, rest = raw.partition(b"\n")
    if verify and (not sep or rest != _sha256(body).encode() + b"\n"):
        raise ValueError("its checksum line does not match its first line")
    try:
        pointer = json.loads(body)
        version, manifest_sha = pointer["version"], pointer["manifest_sha256"]
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"unreadable: {exc}") from None
    if not (isinstance(version, str) and _VERSION_RE.match(version)
            and isinstance(manifest_sha, str) and len(manifest_sha) == 64):
        raise ValueError(f"bad fields {pointer!r}")
    return pointer


@dataclass
class Loaded:
    """A verified checkpoint: its version name and the raw bytes of every shard."""

    version: str
    shards: dict[str, bytes]


class CheckpointDir:
    """Versioned checkpoints under one folder; see the module docstring for the protocol."""

    def __init__(self, root: str | os.PathLike, *, crash: CrashPlan | None = None,
                 bugs: frozenset[str] = frozenset()):
        unknown = set(bugs) - set(PLANTED_BUGS)
        if unknown:
            raise ValueError(f"unknown planted bugs {sorted(unknown)}; known: {sorted(PLANTED_BUGS)}")
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self.crash = crash
        self.bugs = frozenset(bugs)
        # Test-only page-cache model: files written since their last fsync (relative paths).
        self._unsynced: set[str] = set()

    # ----------------------------------------------------------------- save
    def next_version(self) -> str:
        """One past every version seen on disk, published or not, so a crash never blocks a save."""
        numbers = [int(m.group(1)) for p in self.root.iterdir()
                   if (m := _VERSION_RE.match(p.name.removeprefix(".staging-")))]
        return version_name(max(numbers, default=0) + 1)

    def save(self, shards: Mapping[str, bytes]) -> str:
        """Write ``shards`` as a new version and publish it; returns the version name."""
        for name in shards:
            if not _SHARD_NAME_RE.match(name) or name in (MANIFEST, LATEST):
                raise ValueError(f"shard name {name!r} is not allowed: use letters, digits, '._-', "
                                 f"not {MANIFEST!r} or {LATEST!r}")
        version = self.next_version()
        manifest = json.dumps({
            "format": FORMAT, "version": version,
            "files": {name: {"bytes": len(data), "sha256": _sha256(data)} for name, data in shards.items()},
        }, indent=1, sort_keys=True).encode()
        latest = encode_pointer(version, _sha256(manifest))
        blobs = {**shards, MANIFEST: manifest, LATEST: latest}
        steps = plan_save(version, list(shards), self.bugs)
        for index, step in enumerate(steps):
            self._maybe_crash(index, step)
            self._do(step, blobs)
        self._maybe_crash(len(steps), None)
        return version

    def _maybe_crash(self, index: int, step: Step | None) -> None:
        plan = self.crash
        if plan is None or plan.before_step != index:
            return
        self.crash = None  # one crash per plan
        where = f"before step {index} ({step})" if step else f"after the last step ({index})"
        if plan.power_loss:
            for rel in sorted(self._unsynced):
                path = self.root / rel
                if path.is_file():
                    os.truncate(path, 0)
            self._unsynced.clear()
            raise SimulatedCrash(f"power loss {where}")
        raise SimulatedCrash(f"process killed {where}")

    def _do(self, step: Step, blobs: Mapping[str, bytes]) -> None:
        path = self.root / step.path
        if step.op == "rmtree":
            shutil.rmtree(path, ignore_errors=True)
            self._unsynced = {p for p in self._unsynced if not p.startswith(step.path + "/")}
        elif step.op == "mkdir":
            path.mkdir()
        elif step.op == "create":
            with open(path, "wb"):
                pass
            self._unsynced.add(step.path)
        elif step.op == "write":
            with open(path, "ab") as fh:
                fh.write(blobs[step.data_key])
            self._unsynced.add(step.path)
        elif step.op == "fsync":
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            self._unsynced.discard(step.path)
        elif step.op == "fsync_dir":
            fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        elif step.op == "rename":
            os.rename(path, self.root / step.dst)
            moved = set()
            for rel in self._unsynced:
                if rel == step.path:
                    moved.add(step.dst)
                elif rel.startswith(step.path + "/"):
                    moved.add(step.dst + rel[len(step.path):])
                elif rel != step.dst:
                    moved.add(rel)
            self._unsynced = moved
        else:  # pragma: no cover - plan_save only emits the ops above
            raise ValueError(f"unknown step {step}")

    # ----------------------------------------------------------------- load
    def latest_version(self) -> str | None:
        """The published version, or None when nothing was ever published."""
        pointer = self._read_latest()
        return None if pointer is None else pointer["version"]

    def _read_latest(self) -> dict[str, str] | None:
        path = self.root / LATEST
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            pointer = decode_pointer(raw, verify="skip_verify" not in self.bugs)
        except ValueError as exc:
            raise CheckpointCorruptError(
                f"{path} is not a valid pointer ({len(raw)} bytes: {raw[:48]!r}...): {exc}; "
                f"load an explicit version with load(version=...) from {self.published_versions()}",
                path=path) from None
        return pointer

    def published_versions(self) -> list[str]:
        """Version folders on disk (complete or not: only the manifest check tells)."""
        return sorted(p.name for p in self.root.iterdir() if _VERSION_RE.match(p.name) and p.is_dir())

    def load(self, version: str | None = None) -> Loaded:
        """Read and verify a version (default: the latest one) and return its shards' bytes."""
        want_manifest_sha = None
        if version is None:
            pointer = self._read_latest()
            if pointer is None:
                raise NoCheckpointError(f"no checkpoint published under {self.root} (no {LATEST} file)")
            version, want_manifest_sha = pointer["version"], pointer["manifest_sha256"]
        folder = self.root / version
        verify = "skip_verify" not in self.bugs
        manifest_path = folder / MANIFEST
        raw = self._read(manifest_path, version)
        if verify and want_manifest_sha is not None and _sha256(raw) != want_manifest_sha:
            raise self._corrupt(manifest_path, version,
                                f"sha256 {_sha256(raw)[:16]}... differs from {want_manifest_sha[:16]}... "
                                f"recorded in {self.root / LATEST}")
        try:
            manifest = json.loads(raw)
            files = manifest["files"]
        except (ValueError, KeyError, TypeError) as exc:
            raise self._corrupt(manifest_path, version, f"unreadable manifest: {exc}") from None
        shards = {}
        for name, meta in files.items():
            path = folder / name
            data = self._read(path, version)
            if verify and len(data) != meta["bytes"]:
                raise self._corrupt(path, version, f"{len(data)} bytes, manifest says {meta['bytes']} "
                                                   f"({'truncated' if len(data) < meta['bytes'] else 'extended'})")
            if verify and _sha256(data) != meta["sha256"]:
                raise self._corrupt(path, version, f"sha256 {_sha256(data)[:16]}... differs from the "
                                                   f"manifest's {meta['sha256'][:16]}...")
            shards[name] = data
        return Loaded(version=version, shards=shards)

    def _read(self, path: Path, version: str) -> bytes:
        try:
            return path.read_bytes()
        except FileNotFoundError:
            raise self._corrupt(path, version, "file is missing") from None

    def _corrupt(self, path: Path, version: str, why: str) -> CheckpointCorruptError:
        others = [v for v in self.published_versions() if v != version]
        hint = (f"earlier versions on disk: {', '.join(others)} (load(version=...) verifies them too)"
                if others else "no other version on disk")
        return CheckpointCorruptError(f"checkpoint {version} refused: {path}: {why}; {hint}", path=path)


# ------------------------------------------------------------------ training state
def capture_rng_state(bugs: frozenset[str] = frozenset()) -> dict[str, Any]:
    """Every RNG stream a training step may draw from, as JSON-able values."""
    import numpy as np
    import torch

    np_name, np_keys, np_pos, np_has_gauss, np_gauss = np.random.get_state()
    state: dict[str, Any] = {
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode(),
        "numpy": [np_name, [int(k) for k in np_keys], int(np_pos), int(np_has_gauss), float(np_gauss)],
    }
    if "drop_python_rng" not in bugs:
        version, internal, gauss_next = random.getstate()
        state["python"] = [version, list(internal), gauss_next]
    if torch.cuda.is_available():
        state["cuda"] = [base64.b64encode(s.numpy().tobytes()).decode() for s in torch.cuda.get_rng_state_all()]
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    import numpy as np
    import torch

    torch.set_rng_state(torch.frombuffer(bytearray(base64.b64decode(state["torch"])), dtype=torch.uint8))
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    if "python" in state:
        version, internal, gauss_next = state["python"]
        random.setstate((version, tuple(internal), gauss_next))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(
            [torch.frombuffer(bytearray(base64.b64decode(s)), dtype=torch.uint8) for s in state["cuda"]])


def _torch_bytes(obj: Any) -> bytes:
    import torch

    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def encode_training_state(model, optimizer, cursor: Mapping[str, Any],
                          bugs: frozenset[str] = frozenset()) -> dict[str, bytes]:
    """Shards for a resumable training state: model, optimizer, RNG streams, data cursor."""
    opt_state = optimizer.state_dict()
    if "drop_optimizer_state" in bugs:
        opt_state = {"state": {}, "param_groups": opt_state["param_groups"]}
    return {
        "model.pt": _torch_bytes(model.state_dict()),
        "optimizer.pt": _torch_bytes(opt_state),
        "rng.json": json.dumps(capture_rng_state(bugs)).encode(),
        "cursor.json": json.dumps(dict(cursor), sort_keys=True).encode(),
    }


def restore_training_state(shards: Mapping[str, bytes], model, optimizer) -> dict[str, Any]:
    """Load verified shards into ``model`` and ``optimizer``, restore the RNGs, return the cursor."""
    import torch

    def tload(name: str):
        # weights_only: the bytes were hash-checked, but a checkpoint is still data, never code.
        return torch.load(io.BytesIO(shards[name]), map_location="cpu", weights_only=True)

    model.load_state_dict(tload("model.pt"))
    optimizer.load_state_dict(tload("optimizer.pt"))
    restore_rng_state(json.loads(shards["rng.json"]))
    return json.loads(shards["cursor.json"])


def save_training_state(ckpt: CheckpointDir, model, optimizer, cursor: Mapping[str, Any]) -> str:
    """One call for training code: encode the full resumable state and publish it as a new version."""
    return ckpt.save(encode_training_state(model, optimizer, cursor, ckpt.bugs))


def load_training_state(ckpt: CheckpointDir, model, optimizer, version: str | None = None) -> tuple[str, dict]:
    """Verify and restore a version (default: latest) into ``model``/``optimizer``; returns (version, cursor)."""
    loaded = ckpt.load(version)
    return loaded.version, restore_training_state(loaded.shards, model, optimizer)
