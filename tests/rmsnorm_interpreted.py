"""Run the Triton RMSNorm kernels through Triton's CPU interpreter; print one JSON line per check.

Started by tests/test_kernels.py in a process of its own with ``TRITON_INTERPRET=1``: Triton
reads that variable when a kernel is decorated, its own library kernels (``tl.sum``'s combine
function) included, so it must be set before ``triton.language`` is first imported, which a
pytest process may already have done.

Usage: TRITON_INTERPRET=1 python tests/rmsnorm_interpreted.py SEED
"""
from __future__ import annotations

import json
import os
import sys

import torch

from perfgate.workloads.kernels import rmsnorm_torch

# (tokens, hidden, row_pad): row_pad > 0 makes rows further apart than they are long (a strided x)
SHAPES = [(5, 64, 0), (3, 100, 0), (4, 2048, 0), (6, 24, 9), (3, 300, 37)]


def main(seed: int) -> None:
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise SystemExit("set TRITON_INTERPRET=1: the kernels must be decorated for the interpreter")
    from perfgate.workloads.kernels import rmsnorm_triton

    import triton

    print(json.dumps({"triton": triton.__version__}), flush=True)
    gen = torch.Generator().manual_seed(seed)
    for pattern in ("coalesced", "uncoalesced"):
        rmsnorm = rmsnorm_triton.launcher(pattern)
        for tokens, hidden, row_pad in SHAPES:
            wide, weight = rmsnorm_torch.random_inputs(tokens, hidden + row_pad, gen, "cpu")
            x, weight = wide[:, :hidden], weight[:hidden].contiguous()
            out = torch.full((tokens, hidden), float("nan"), dtype=torch.bfloat16)
            got = rmsnorm(x, weight, out)
            ref = rmsnorm_torch.reference(x, weight, dtype=torch.float64)
            print(json.dumps({"pattern": pattern, "tokens": tokens, "hidden": hidden, "row_stride": x.stride(0),
                              "same_buffer": got is out, "unwritten": rmsnorm_torch.unwritten(out),
                              "rel_error": rmsnorm_torch.relative_error(out, ref)}), flush=True)


if __name__ == "__main__":
    main(int(sys.argv[1]))
