"""Rank side of the collective properties: run one generated case, return raw outputs.

The parent (the test) holds every rank's inputs and computes the expected answer itself;
ranks only run the collective and hand back bytes, so comparison never happens in a rank.

Test-only planted bugs (``CollectiveCase.bug``):

* ``reorder_on_last_rank``: the last rank issues its all_reduces in reverse order. gloo, like
  NCCL, matches collectives by sequence, not by tensor, so same-shaped calls issued in a
  different order do not hang: they silently sum A on one rank with B on another (seed §16.8).
* ``rotated_gather``: after reduce_scatter + all_gather, chunks are read back one rank off
  (a rank-to-chunk mapping slip).
* ``root_ignored``: broadcast always sends from rank 0, whatever root was asked for.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPES = ("int8", "uint8", "int32", "int64", "float16", "bfloat16", "float32", "float64")
BUGS = ("reorder_on_last_rank", "rotated_gather", "root_ignored")


@dataclass(frozen=True)
class CollectiveCase:
    """One collective call on every rank. ``inputs[rank][k]`` is rank's k-th tensor (numpy array).

    Float dtypes narrower than the arrays (float16, bfloat16) are reached by casting in torch,
    the same cast the test applies to compute the expected result.
    """

    op: str  # all_reduce | rs_ag | broadcast
    dtype: str
    inputs: tuple[tuple[Any, ...], ...]
    root: int = 0
    bug: str = ""

    def __post_init__(self) -> None:
        if self.op not in ("all_reduce", "rs_ag", "broadcast"):
            raise ValueError(f"unknown op {self.op!r}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} not in {DTYPES}")
        if self.bug and self.bug not in BUGS:
            raise ValueError(f"unknown planted bug {self.bug!r}; known: {BUGS}")
        if not 0 <= self.root < len(self.inputs):
            raise ValueError(f"root {self.root} outside world size {len(self.inputs)}")

    @property
    def world_size(self) -> int:
        return len(self.inputs)


def as_tensor(array, dtype: str):
    """numpy array -> torch tensor of ``dtype`` (the one conversion both sides use)."""
    import torch

    return torch.from_numpy(array.copy()).to(getattr(torch, dtype))


def to_bytes(t) -> bytes:
    import torch

    if t.numel() == 0:
        return b""
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def run(case: CollectiveCase, ctx) -> list[dict[str, Any]]:
    """Run the case's collective(s) on this rank; return the outputs per input tensor."""
    import torch
    import torch.distributed as dist

    if case.world_size != ctx.world_size:
        raise ValueError(f"case is for {case.world_size} ranks, the group has {ctx.world_size}")
    rank, world = ctx.rank, ctx.world_size
    tensors = [as_tensor(a, case.dtype).to(ctx.device) for a in case.inputs[rank]]
    out: list[dict[str, Any]] = [{} for _ in tensors]
    if case.op == "all_reduce":
        order = list(range(len(tensors)))
        if case.bug == "reorder_on_last_rank" and rank == world - 1:
            order.reverse()
        for k in order:
            ctx.phase(f"all_reduce tensor {k}")
            dist.all_reduce(tensors[k])
        for k, t in enumerate(tensors):
            out[k]["all_reduce"] = t
    elif case.op == "rs_ag":
        for k, t in enumerate(tensors):
            ar = t.clone()
            dist.all_reduce(ar)
            flat = t.reshape(-1)
            chunk = -(-flat.numel() // world)  # ceil: pad so every rank owns one equal chunk
            padded = torch.zeros(chunk * world, dtype=t.dtype, device=t.device)
            padded[: flat.numel()] = flat
            mine = torch.empty(chunk, dtype=t.dtype, device=t.device)
            ctx.phase(f"reduce_scatter tensor {k}")
            dist.reduce_scatter_tensor(mine, padded)
            gathered = torch.empty(chunk * world, dtype=t.dtype, device=t.device)
            ctx.phase(f"all_gather tensor {k}")
            dist.all_gather_into_tensor(gathered, mine)
            if case.bug == "rotated_gather":
                gathered = torch.roll(gathered, shifts=chunk)
            out[k]["all_reduce"] = ar
            out[k]["rs_ag"] = gathered[: flat.numel()].reshape(t.shape)
    else:
        src = 0 if case.bug == "root_ignored" else case.root
        for k, t in enumerate(tensors):
            ctx.phase(f"broadcast tensor {k} from {src}")
            dist.broadcast(t, src=src)
            out[k]["broadcast"] = t
    # bfloat16 has no numpy dtype: ship values widened exactly (float64 / int64) plus the raw bytes.
    def wide(t):
        return t.to(torch.float64 if t.is_floating_point() else torch.int64).numpy()

    return [{name: {"values": wide(t.cpu()), "bytes": to_bytes(t.cpu())} for name, t in o.items()} for o in out]
