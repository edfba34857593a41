"""RMSNorm in PyTorch: the eager form, its torch.compile form, the reference, and the numerics check.

One formula for all of them (the Llama form): ``y = x / sqrt(mean(x^2) + eps) * w`` over the last
dimension, computed in fp32 from bf16 inputs, cast once to bf16 at the end. The Triton kernel
(rmsnorm_triton) computes the same function; the reference is this formula on upcast inputs
without the final cast.
"""
from __future__ import annotations

EPS = 1e-6
# bf16 outputs against an fp32 reference land between 1e-3 and 1e-2 in ||out - ref|| / ||ref||
# (a common rule of thumb for checking kernels with bf16 operands; the output's rounding alone is
# ~2e-3). Above 1e-2 the function is wrong; NaN never passes.
REL_ERROR_MAX = 1e-2


def rmsnorm_eager(x, weight, eps: float = EPS):
    """The eager PyTorch RMSNorm: fp32 math, one cast to ``x.dtype`` at the end (several kernels)."""
    import torch

    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def compiled_rmsnorm():
    """``rmsnorm_eager`` through torch.compile (inductor, one fused kernel per shape), compiled afresh.

    Dynamo's caches are reset first: each shape is compiled for itself (``dynamic=False``) and the
    recompile limit (8 per function) would otherwise send a later shape silently back to eager;
    ``fullgraph=True`` makes a graph break an error instead of a partly eager function."""
    import torch

    torch._dynamo.reset()
    return torch.compile(rmsnorm_eager, dynamic=False, fullgraph=True)


def reference(x, weight, eps: float = EPS, dtype=None):
    """The formula on inputs upcast to ``dtype`` (fp32 by default, float64 for CPU checks), uncast."""
    import torch

    dtype = dtype or torch.float32
    xf = x.to(dtype)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(dtype)


def relative_error(out, ref) -> float:
    """||out - ref|| / ||ref|| in ``ref``'s precision: NaN when ``out`` holds a NaN anywhere."""
    import torch

    return float(torch.linalg.vector_norm(out.to(ref.dtype) - ref) / torch.linalg.vector_norm(ref))


def unwritten(out) -> int:
    """Elements of ``out`` still holding the NaN it was poisoned with (finite inputs give none)."""
    import torch

    return int(torch.isnan(out).sum())


def random_inputs(tokens: int, hidden: int, gen, device, dtype=None):
    """Fresh random ``x`` (rows of different scales: 2^N(0,1)) and ``weight`` (N(0,1), not ones: a
    missing multiply must show); never zeros, which hide unwritten outputs and can run faster."""
    import torch

    dtype = dtype or torch.bfloat16
    x = torch.randn((tokens, hidden), generator=gen, device=device, dtype=dtype)
    x.mul_(torch.exp2(torch.randn((tokens, 1), generator=gen, device=device)).to(dtype))
    weight = torch.randn((hidden,), generator=gen, device=device, dtype=dtype)
    return x, weight
