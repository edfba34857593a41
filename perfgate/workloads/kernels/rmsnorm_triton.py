"""RMSNorm in Triton: one program per row, the row read once into registers, fp32 math, bf16 out.

Bytes moved per call are the fewest possible (x read once, y written once, the weight from the
L2), so the kernel is memory-bound and its time over the bytes says how close it comes to the
device's copy bandwidth.

The planted bug ``rmsnorm_uncoalesced`` (perfgate.mutations) swaps in the same kernel with a
strided access pattern: element j of the row block goes to column ``(j % LANES) * (BLOCK // LANES)
+ j // LANES``, so the 32 lanes of a warp, which hold consecutive j, touch 32 different 128-byte
lines instead of one contiguous run. Triton's coalescing pass cannot undo it: the offsets have
contiguity 1 as far as its axis analysis can tell, so it emits one 2-byte access per lane. The
values are a permutation of the row's (the sum of squares is the same up to fp32 rounding), so
the result stays right and only the speed drops, as a real uncoalesced kernel's would.

This module imports Triton; import it only where Triton is installed (a ``triton`` marker skips
the perf tests elsewhere). Under ``TRITON_INTERPRET=1`` (set before this module is imported) the
same kernels run on CPU tensors, which is how perfgate's own tests check them without a GPU.
"""
from __future__ import annotations

from typing import Callable

import torch
import triton
import triton.language as tl

from perfgate import mutations
from perfgate.workloads.kernels.rmsnorm_torch import EPS

UNCOALESCED = "rmsnorm_uncoalesced"
LANES = 32                  # threads of a warp: the uncoalesced variant puts each on its own line
MAX_HIDDEN = 65536          # one row per program, held in registers


@triton.jit
def _rmsnorm_rows(x_ptr, w_ptr, y_ptr, x_row_stride, y_row_stride, hidden, eps,
                  BLOCK: tl.constexpr, LANES: tl.constexpr, STRIDED: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    j = tl.arange(0, BLOCK)
    if STRIDED:
        cols = (j % LANES) * (BLOCK // LANES) + j // LANES
    else:
        cols = j
    mask = cols < hidden
    x = tl.load(x_ptr + row * x_row_stride + cols, mask=mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    inv_rms = tl.rsqrt(tl.sum(x * x, axis=0) / hidden + eps)
    tl.store(y_ptr + row * y_row_stride + cols, (x * inv_rms * w).to(y_ptr.dtype.element_ty), mask=mask)


def num_warps(block: int) -> int:
    """Warps per program: 8 elements per thread or more, at most 8 warps (the layer-norm tutorial's rule)."""
    return min(max(block // 256, 1), 8)


def variant() -> str:
    """The access pattern the launcher will use now: ``"uncoalesced"`` only under the planted bug."""
    return "uncoalesced" if mutations.active(UNCOALESCED) else "coalesced"


def launcher(pattern: str) -> Callable:
    """``rmsnorm(x, weight, out=None, eps=EPS) -> out`` with the access pattern ``pattern`` (from
    :func:`variant`, read once per measurement: reading the mutation on every call would add host
    time to every launch)."""
    if pattern not in ("coalesced", "uncoalesced"):
        raise ValueError(f"pattern must be 'coalesced' or 'uncoalesced', got {pattern!r}")
    strided = pattern == "uncoalesced"

    def rmsnorm(x: torch.Tensor, weight: torch.Tensor, out: torch.Tensor | None = None, eps: float = EPS):
        if x.ndim != 2 or x.stride(1) != 1:
            raise ValueError(f"x must be 2-D (tokens, hidden) with contiguous rows, got shape {tuple(x.shape)} "
                             f"strides {x.stride()}")
        tokens, hidden = x.shape
        if weight.shape != (hidden,) or weight.stride(0) != 1:
            raise ValueError(f"weight must be a contiguous ({hidden},) vector, got {tuple(weight.shape)}")
        if not 0 < hidden <= MAX_HIDDEN:
            raise ValueError(f"hidden {hidden} outside 1..{MAX_HIDDEN}: one row per program, held in registers")
        if out is None:
            out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
        elif out.shape != x.shape or out.stride(1) != 1:
            raise ValueError(f"out must be {tuple(x.shape)} with contiguous rows, got {tuple(out.shape)} "
                             f"strides {out.stride()}")
        block = max(triton.next_power_of_2(hidden), LANES)  # the strided pattern needs BLOCK >= LANES
        _rmsnorm_rows[(tokens,)](x, weight, out, x.stride(0), out.stride(0), hidden, eps,
                                 BLOCK=block, LANES=LANES, STRIDED=strided, num_warps=num_warps(block))
        return out
    return rmsnorm
