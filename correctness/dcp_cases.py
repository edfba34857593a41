"""Rank side of the DCP reshard property: save sharded tensors with N ranks, load with M.

torch.distributed.checkpoint (DCP) stores each rank's shards plus global metadata, and a
load with a different world size or placement must reassemble the same full tensors. The
full tensors are a pure function of (seed, name, shape, dtype) so that the saving group,
the loading group and the test can each rebuild them without shipping data around.

Test-only planted bug (``DcpCase.bug == "assume_even_shards"``): the loader rebuilds the
full tensor by all-gathering local shards cut to ``size // world`` rows, i.e. it assumes the
sharded dimension divides evenly, as hand-written reshard code often does.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

DTYPES = ("float32", "bfloat16", "float64", "int64", "uint8")
BUGS = ("assume_even_shards",)


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str
    save_placement: int  # -1: Replicate(), d >= 0: Shard(d)
    load_placement: int


@dataclass(frozen=True)
class DcpCase:
    path: str  # checkpoint folder (shared by the saving and the loading group)
    tensors: tuple[TensorSpec, ...]
    seed: int
    bug: str = ""


def full_tensor(spec: TensorSpec, seed: int):
    """The reference full tensor: random bytes (any bit pattern, NaNs included) viewed as dtype."""
    import torch

    dtype = getattr(torch, spec.dtype)
    numel = 1
    for side in spec.shape:
        numel *= side
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    key = int.from_bytes(hashlib.sha256(f"{seed}/{spec.name}".encode()).digest()[:7], "little")
    g = torch.Generator().manual_seed(key)
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=g)
    return raw.view(dtype).reshape(spec.shape)


_MESHES: dict[int, Any] = {}


def _mesh(ctx):
    from torch.distributed.device_mesh import init_device_mesh

    if ctx.world_size not in _MESHES:  # one mesh per rank process: building one is a collective
        _MESHES[ctx.world_size] = init_device_mesh(ctx.device.type, (ctx.world_size,))
    return _MESHES[ctx.world_size]


def _placement(index: int):
    from torch.distributed.tensor import Replicate, Shard

    return Replicate() if index < 0 else Shard(index)


def save(case: DcpCase, ctx) -> None:
    """Distribute every reference tensor with its save placement and dcp.save them."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import distribute_tensor

    mesh = _mesh(ctx)
    state = {t.name: distribute_tensor(full_tensor(t, case.seed).to(ctx.device), mesh, [_placement(t.save_placement)])
             for t in case.tensors}
    ctx.phase(f"dcp.save {len(state)} tensors")
    # Durability is not this property (perfgate's own protocol is tested for it); fsync per
    # rank file costs tens of ms on a virtual disk and every shrink step pays it.
    dcp.save(state, storage_writer=dcp.FileSystemWriter(case.path, sync_files=False))


def _gather_assuming_even(dtensor, dim: int):
    """Planted bug: all-gather local shards cut to size // world along ``dim``."""
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    even = dtensor.shape[dim] // world
    local = dtensor.to_local().narrow(dim, 0, min(even, dtensor.to_local().shape[dim])).contiguous()
    parts = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(parts, local)
    return torch.cat(parts, dim=dim)


def load(case: DcpCase, ctx) -> dict[str, bytes]:
    """dcp.load into placeholders with the load placements; return each full tensor's bytes."""
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.tensor import distribute_tensor

    mesh = _mesh(ctx)
    state = {t.name: distribute_tensor(torch.zeros(t.shape, dtype=getattr(torch, t.dtype), device=ctx.device), mesh,
                                       [_placement(t.load_placement)]) for t in case.tensors}
    ctx.phase(f"dcp.load {len(state)} tensors")
    dcp.load(state, checkpoint_id=case.path)
    out = {}
    for t in case.tensors:
        dt = state[t.name]
        if case.bug == "assume_even_shards" and t.load_placement >= 0:
            full = _gather_assuming_even(dt, t.load_placement)
        else:
            full = dt.full_tensor()
        out[t.name] = (tuple(full.shape), full.cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return out
