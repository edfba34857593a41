"""Strategies and checks for the checkpoint properties (correctness.systems.checkpoint, DCP).

Each ``check_*`` runs one generated case against real files and raises
:class:`PropertyViolation` with a sentence saying what broke; the test modules wire them to
``@given`` and test_planted_bugs.py hunts planted bugs with them through ``hypothesis.find``.
"""
from __future__ import annotations

import hashlib
import random
import shutil
import struct
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterator

from hypothesis import strategies as st

from correctness.property_violation import PropertyViolation
from correctness.systems.checkpoint import (
    LATEST, MANIFEST, CheckpointCorruptError, CheckpointDir, CheckpointError, CrashPlan, SimulatedCrash,
    load_training_state, plan_save, save_training_state, version_name,
)


@contextmanager
def scratch_dir(prefix: str) -> Iterator[Path]:
    """A fresh folder on the real disk per example (hypothesis examples must not share one)."""
    path = Path(tempfile.mkdtemp(prefix=f"perfgate-{prefix}-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


# =========================================================================== round trip
@dataclass(frozen=True)
class TrainCase:
    widths: tuple[int, ...]
    dtype: str
    optimizer: str
    steps: int
    seed: int
    numpy_draws: int
    python_draws: int
    buffer_values: tuple[float, ...]  # bit-exactness of NaN, inf, -0.0, subnormals in a buffer
    cursor: tuple[tuple[str, int], ...]
    bugs: frozenset[str] = frozenset()


OPTIMIZERS = ("sgd", "sgd-momentum", "adam", "adamw")


# Values whose bits a checkpoint must keep: signed zero, NaN, infinities, a subnormal, extremes.
SPECIAL_FLOATS = (0.0, -0.0, float("nan"), float("inf"), float("-inf"), 1e-45, -3.4e38, 1.5)
# Cursor values at the edges of JSON / int64 / uint64 (a cursor is often a sample index).
CURSOR_VALUES = (0, 1, 2**31 - 1, 2**53 + 1, 2**63 - 1, 2**64 - 1)


@st.composite
def train_cases(draw, bugs: frozenset[str] = frozenset()) -> TrainCase:
    # sampled_from and small integer ranges keep shrinking cheap: every shrink step of this
    # property is a real save with fsyncs (tens of ms each on a virtual disk).
    return TrainCase(
        widths=tuple(draw(st.lists(st.integers(1, 8), min_size=2, max_size=4))),
        dtype=draw(st.sampled_from(["float32", "float64", "bfloat16"])),
        optimizer=draw(st.sampled_from(OPTIMIZERS)),
        steps=draw(st.integers(0, 3)),
        seed=draw(st.integers(0, 2**16)),
        numpy_draws=draw(st.integers(0, 5)),
        python_draws=draw(st.integers(0, 5)),
        buffer_values=tuple(draw(st.lists(st.sampled_from(SPECIAL_FLOATS), max_size=4))),
        cursor=tuple((key, draw(st.sampled_from(CURSOR_VALUES))) for key in ("epoch", "sample", "shuffle_seed")),
        bugs=bugs,
    )


def _build(case: TrainCase):
    import torch
    import torch.nn as nn

    dtype = getattr(torch, case.dtype)
    layers: list[nn.Module] = []
    for a, b in zip(case.widths, case.widths[1:]):
        layers += [nn.Linear(a, b), nn.Tanh()]
    model = nn.Sequential(*layers).to(dtype)
    model.register_buffer("special", torch.tensor(case.buffer_values, dtype=torch.float32).to(dtype))
    params = model.parameters()
    opt = {
        "sgd": lambda: torch.optim.SGD(params, lr=0.1),
        "sgd-momentum": lambda: torch.optim.SGD(params, lr=0.1, momentum=0.9),
        "adam": lambda: torch.optim.Adam(params, lr=0.01),
        "adamw": lambda: torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
    }[case.optimizer]()
    return model, opt


def _train_step(case: TrainCase, model, opt) -> None:
    """One step whose data depends on all three RNG streams, as a real data pipeline's does."""
    import numpy as np
    import torch

    x = torch.randn(3, case.widths[0], dtype=getattr(torch, case.dtype))
    scale = (1.0 + np.random.rand()) * (1.0 + random.random())
    loss = model(x).float().square().mean() * scale
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)


def _draws() -> tuple:
    import numpy as np
    import torch

    return (torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)])


def _clone(obj: Any) -> Any:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return obj


def bitwise_diff(a: Any, b: Any, where: str = "") -> str | None:
    """First difference between two nested states, comparing tensors bit for bit (NaN == NaN)."""
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return f"{where}: {type(a).__name__} vs {type(b).__name__}"
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{where}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        if a.numel() == 0:
            return None
        ab = a.detach().contiguous().reshape(-1).view(torch.uint8)
        bb = b.detach().contiguous().reshape(-1).view(torch.uint8)
        if not torch.equal(ab, bb):
            return f"{where}: tensor bits differ ({a.flatten()[:4].tolist()} vs {b.flatten()[:4].tolist()})"
        return None
    if isinstance(a, dict) and isinstance(b, dict):
        if set(a) != set(b):
            return f"{where}: keys {sorted(map(str, a))} vs {sorted(map(str, b))}"
        for k in a:
            if (d := bitwise_diff(a[k], b[k], f"{where}.{k}")) is not None:
                return d
        return None
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{where}: length {len(a)} vs {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            if (d := bitwise_diff(x, y, f"{where}[{i}]")) is not None:
                return d
        return None
    if isinstance(a, float) and isinstance(b, float):
        return None if struct.pack("<d", a) == struct.pack("<d", b) else f"{where}: {a!r} vs {b!r}"
    return None if a == b else f"{where}: {a!r} vs {b!r}"


@contextmanager
def _rng_sandbox() -> Iterator[None]:
    """Leave the test process's global RNG streams as they were."""
    import numpy as np
    import torch

    saved = (torch.get_rng_state(), np.random.get_state(), random.getstate())
    try:
        yield
    finally:
        torch.set_rng_state(saved[0])
        np.random.set_state(saved[1])
        random.setstate(saved[2])


def _seed_all(seed: int) -> None:
    import numpy as np
    import torch

    torch.manual_seed(seed)
    np.random.seed(seed % 2**32)
    random.seed(seed)


def check_round_trip(case: TrainCase) -> None:
    """Save, keep training; restore into a fresh model: state and the next step match bitwise."""
    import numpy as np

    with _rng_sandbox(), scratch_dir("ckpt-rt") as root:
        _seed_all(case.seed)
        model, opt = _build(case)
        for _ in range(case.steps):
            _train_step(case, model, opt)
        np.random.rand(case.numpy_draws)
        for _ in range(case.python_draws):
            random.random()
        cursor = dict(case.cursor)
        save_training_state(CheckpointDir(root, bugs=case.bugs), model, opt, cursor)
        saved = {"model": _clone(model.state_dict()), "optimizer": _clone(opt.state_dict())}
        _train_step(case, model, opt)
        continued = {"model": _clone(model.state_dict()), "optimizer": _clone(opt.state_dict()),
                     "draws": _draws()}

        _seed_all(case.seed + 1)  # a new process: different init, different RNG streams
        model2, opt2 = _build(case)
        _, cursor2 = load_training_state(CheckpointDir(root, bugs=case.bugs), model2, opt2)
        restored = {"model": model2.state_dict(), "optimizer": opt2.state_dict()}
        if (d := bitwise_diff(saved, restored, "state")) is not None:
            raise PropertyViolation(f"restored state differs from the saved one at {d}")
        if cursor2 != cursor:
            raise PropertyViolation(f"data cursor {cursor2} restored, {cursor} saved")
        _train_step(case, model2, opt2)
        replayed = {"model": _clone(model2.state_dict()), "optimizer": _clone(opt2.state_dict()),
                    "draws": _draws()}
        if (d := bitwise_diff(continued, replayed, "next step")) is not None:
            raise PropertyViolation(f"the step after restore differs from the step after save at {d}")


# =========================================================================== crash at any point
SHARD_NAMES = ("model.pt", "optimizer.pt", "rng.json", "cursor.json")


def payload(tag: str, name: str, n_bytes: int) -> bytes:
    """Distinct, non-empty, deterministic contents: an emptied or swapped file can never pass
    for the right one (random contents could be empty, which hides a lost write)."""
    return hashlib.shake_256(f"{tag}/{name}".encode()).digest(n_bytes)


@dataclass(frozen=True)
class CrashCase:
    """Save a previous version, then crash the save of a new one before step ``before_step``.

    Every version has the same four shards, so a crash point means the same step in every
    case and the search space is small: (step, power loss or process kill, payload size).
    """

    before_step: int  # index into plan_save(...) of the new version; len(plan) = after the last step
    power_loss: bool
    payload_bytes: int = 64
    bugs: frozenset[str] = frozenset()

    def shards(self, tag: str) -> dict[str, bytes]:
        return {name: payload(tag, name, self.payload_bytes) for name in SHARD_NAMES}

    def plan(self):
        return plan_save(version_name(2), list(SHARD_NAMES), self.bugs)

    def where(self) -> str:
        plan = self.plan()
        step = f"step {self.before_step} ({plan[self.before_step]})" if self.before_step < len(plan) \
            else f"the end (step {self.before_step})"
        return f"{'power loss' if self.power_loss else 'process kill'} before {step}"


@st.composite
def crash_cases(draw, bugs: frozenset[str] = frozenset()) -> CrashCase:
    n_steps = len(plan_save(version_name(2), list(SHARD_NAMES), bugs))
    return CrashCase(before_step=draw(st.integers(0, n_steps)), power_loss=draw(st.booleans()),
                     payload_bytes=draw(st.integers(1, 4096)), bugs=bugs)


def check_crash(case: CrashCase) -> None:
    """A crash anywhere in a save leaves the previous version latest (or the new one, once
    published), complete; and the next save still works."""
    with scratch_dir("ckpt-crash") as root:
        writer = CheckpointDir(root, bugs=case.bugs)
        previous, new = case.shards("previous"), case.shards("new")
        v1 = writer.save(previous)
        writer.crash = CrashPlan(before_step=case.before_step, power_loss=case.power_loss)
        try:
            writer.save(new)
        except SimulatedCrash:
            pass
        published = any(step.publishes for step in case.plan()[: case.before_step])
        want_version, want = (version_name(2), new) if published else (v1, previous)
        reader = CheckpointDir(root, bugs=case.bugs)  # after the restart
        try:
            loaded = reader.load()
        except CheckpointError as exc:
            raise PropertyViolation(f"after a {case.where()}, no checkpoint can be loaded: {exc}") from None
        if loaded.version != want_version or loaded.shards != want:
            raise PropertyViolation(f"after a {case.where()}, latest is {loaded.version} with shards "
                                    f"{_sizes(loaded.shards)}; expected {want_version} {_sizes(want)}")
        v3 = reader.save(previous)
        again = CheckpointDir(root, bugs=case.bugs).load()
        if again.version != v3 or again.shards != previous:
            raise PropertyViolation(f"after a {case.where()}, the next save published {again.version}, "
                                    f"expected {v3}")


def _sizes(shards: dict[str, bytes]) -> str:
    return "{" + ", ".join(f"{k}: {len(v)} B" for k, v in sorted(shards.items())) + "}"


# =========================================================================== corruption
@dataclass(frozen=True)
class CorruptionCase:
    shards: tuple[tuple[str, bytes], ...]
    target: str  # a shard name, MANIFEST or LATEST
    kind: str  # flip | truncate | delete | append
    offset: int  # reduced modulo the file size
    mask: int  # xor mask for a flip, 1..255
    bugs: frozenset[str] = frozenset()


@st.composite
def corruption_cases(draw, bugs: frozenset[str] = frozenset()) -> CorruptionCase:
    shards = draw(st.dictionaries(st.sampled_from(SHARD_NAMES), st.binary(min_size=1, max_size=64),
                                  min_size=1))
    target = draw(st.sampled_from(sorted(shards) + [MANIFEST, LATEST]))
    # A missing `latest` means "nothing published" (a first save that crashed), not corruption.
    kinds = ["flip", "truncate", "append"] + ([] if target == LATEST else ["delete"])
    return CorruptionCase(
        shards=tuple(sorted(shards.items())),
        target=target,
        kind=draw(st.sampled_from(kinds)),
        offset=draw(st.integers(0, 2**16)), mask=draw(st.integers(1, 255)), bugs=bugs)


def check_corruption(case: CorruptionCase) -> None:
    """A flipped byte, a truncated, extended or missing file (shard, manifest or the latest
    pointer) is refused with an error naming it."""
    with scratch_dir("ckpt-corrupt") as root:
        ckpt = CheckpointDir(root, bugs=case.bugs)
        version = ckpt.save(dict(case.shards))
        path = root / case.target if case.target == LATEST else root / version / case.target
        data = path.read_bytes()
        if case.kind == "flip":
            i = case.offset % len(data)
            path.write_bytes(data[:i] + bytes([data[i] ^ case.mask]) + data[i + 1:])
            what = f"byte {i} of {case.target} xor {case.mask:#04x}"
        elif case.kind == "truncate":
            path.write_bytes(data[: case.offset % len(data)])
            what = f"{case.target} truncated to {case.offset % len(data)} of {len(data)} bytes"
        elif case.kind == "append":
            path.write_bytes(data + bytes([case.mask]))
            what = f"{case.target} with one byte appended"
        else:
            path.unlink()
            what = f"{case.target} deleted"
        try:
            loaded = CheckpointDir(root, bugs=case.bugs).load()
        except CheckpointCorruptError as exc:
            if Path(exc.path) != path or str(path) not in str(exc):
                raise PropertyViolation(f"{what}: refused, but the error names {exc.path}: {exc}") from None
            return
        except Exception as exc:  # noqa: BLE001 - any other error is unclear to the user
            raise PropertyViolation(f"{what}: failed with an unclear {type(exc).__name__}: {exc}") from None
        raise PropertyViolation(f"{what}: loaded silently as {loaded.version} {_sizes(loaded.shards)}")


# =========================================================================== DCP reshard
DCP_WORLDS = ((4, 2), (2, 4), (2, 3), (3, 2), (3, 4), (4, 3), (2, 2))


@st.composite
def dcp_cases(draw, bug: str = ""):
    from correctness.dcp_cases import DTYPES, DcpCase, TensorSpec

    save_world, load_world = draw(st.sampled_from(DCP_WORLDS))
    specs = []
    for i in range(draw(st.integers(1, 3))):
        shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=2)))
        placements = st.sampled_from([*range(len(shape)), -1])
        specs.append(TensorSpec(name=f"t{i}", shape=shape, dtype=draw(st.sampled_from(DTYPES)),
                                save_placement=draw(placements), load_placement=draw(placements)))
    case = DcpCase(path="", tensors=tuple(specs), seed=draw(st.integers(0, 2**32 - 1)), bug=bug)
    return save_world, load_world, case


def check_dcp_reshard(pools, save_world: int, load_world: int, case) -> None:
    """DCP save on ``save_world`` ranks, load on ``load_world``: every rank sees the full tensors bit for bit."""
    from correctness.dcp_cases import full_tensor

    import torch

    with scratch_dir("dcp") as root:
        case = replace(case, path=str(root / "ckpt"))
        pools.run(save_world, "correctness.dcp_cases:save", case)
        per_rank = pools.run(load_world, "correctness.dcp_cases:load", case)
    for spec in case.tensors:
        want = full_tensor(spec, case.seed)
        want_bytes = want.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        for rank, got in enumerate(per_rank):
            shape, data = got[spec.name]
            if shape != spec.shape or data != want_bytes:
                first = next((i for i, (x, y) in enumerate(zip(data, want_bytes)) if x != y),
                             min(len(data), len(want_bytes)))
                raise PropertyViolation(
                    f"{spec.name} {spec.dtype}{spec.shape} saved by {save_world} ranks as "
                    f"{placement_name(spec.save_placement)}, loaded by {load_world} as "
                    f"{placement_name(spec.load_placement)}: rank {rank} got shape {shape}, "
                    f"first differing byte {first} of {len(want_bytes)}")


def placement_name(index: int) -> str:
    return "Replicate()" if index < 0 else f"Shard({index})"

