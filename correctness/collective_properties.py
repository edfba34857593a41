"""Strategies and checks for all_reduce, reduce_scatter + all_gather and broadcast.

Inputs are generated here (hypothesis numpy arrays: shapes from 0-d to 3-d including empty
ones, eight dtypes, world sizes 2-4), shipped to a warm gloo group, and the outputs checked
against answers the test computes itself: integer sums exactly, float sums within the
error a sum of ``world`` terms can have in that dtype, broadcasts bit for bit.
"""
from __future__ import annotations

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra.numpy import array_shapes, arrays, from_dtype

from correctness.collective_cases import DTYPES, CollectiveCase, as_tensor, to_bytes
from correctness.property_violation import PropertyViolation

WORLDS = (2, 3, 4)
# Numpy carrier dtype per torch dtype (bfloat16 travels as float32 and is cast by torch).
_CARRIER = {"int8": np.int8, "uint8": np.uint8, "int32": np.int32, "int64": np.int64,
            "float16": np.float16, "bfloat16": np.float32, "float32": np.float32, "float64": np.float64}


def _sum_elements(dtype: str, world: int):
    """Values whose sum over ``world`` ranks cannot overflow ``dtype`` (overflow is not the property)."""
    if dtype in ("int8", "uint8", "int32", "int64"):
        info = np.iinfo(_CARRIER[dtype])
        return st.integers(int(info.min) // world, int(info.max) // world)
    bound = {"float16": 2.0**10, "bfloat16": 2.0**100, "float32": 2.0**100, "float64": 2.0**1000}[dtype]
    width = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}[dtype]
    return st.floats(-bound, bound, width=width, allow_nan=False, allow_infinity=False)


def _any_elements(dtype: str):
    if dtype in ("int8", "uint8", "int32", "int64"):
        return from_dtype(np.dtype(_CARRIER[dtype]))
    width = {"float16": 16, "bfloat16": 32, "float32": 32, "float64": 64}[dtype]
    return st.floats(width=width)  # NaN, inf, -0.0 and subnormals included: broadcast is bitwise


@st.composite
def collective_cases(draw, op: str, bug: str = "") -> CollectiveCase:
    world = draw(st.sampled_from(WORLDS))
    dtype = draw(st.sampled_from(DTYPES))
    shape = draw(array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=5))
    n_tensors = draw(st.integers(1, 3)) if op == "all_reduce" else 1
    elements = _any_elements(dtype) if op == "broadcast" else _sum_elements(dtype, world)
    inputs = tuple(tuple(draw(arrays(_CARRIER[dtype], shape, elements=elements)) for _ in range(n_tensors))
                   for _ in range(world))
    root = draw(st.integers(0, world - 1)) if op == "broadcast" else 0
    return CollectiveCase(op=op, dtype=dtype, inputs=inputs, root=root, bug=bug)


def _exact_sum(case: CollectiveCase, k: int):
    """Sum over ranks of the k-th input after the cast to the case dtype: ints exact, floats in float64."""
    import torch

    tensors = [as_tensor(case.inputs[r][k], case.dtype) for r in range(case.world_size)]
    if tensors[0].is_floating_point():
        return sum(t.to(torch.float64) for t in tensors).numpy(), sum(t.to(torch.float64).abs() for t in tensors).numpy()
    return sum(t.to(torch.int64) for t in tensors).numpy(), None


def _float_bound(dtype: str, world: int, abs_sum):
    """Worst error of a sum of ``world`` terms, any order: world * eps * sum|x|, plus subnormal slack."""
    import torch

    info = torch.finfo(getattr(torch, dtype))
    return world * info.eps * abs_sum + world * info.smallest_normal * info.eps


def _describe(case: CollectiveCase, k: int) -> str:
    shape = case.inputs[0][k].shape
    return f"{case.op} of tensor {k} ({case.dtype}, shape {tuple(shape)}) on {case.world_size} ranks"


def _first_bad(mask) -> tuple:
    idx = np.argwhere(mask)
    return tuple(int(i) for i in idx[0]) if idx.size else ()


def _check_close(case, k, rank, name, got, want, bound) -> None:
    if bound is None:
        bad = got != want
    else:
        bad = ~(np.abs(got - want) <= bound)
    if np.any(bad):
        at = _first_bad(bad)
        tol = "" if bound is None else f" (tolerance {float(np.asarray(bound)[at]):.3g})"
        raise PropertyViolation(f"{_describe(case, k)}: rank {rank} {name} at index {at} is "
                                f"{np.asarray(got)[at].tolist()!r}, expected {np.asarray(want)[at].tolist()!r}{tol}")


def _check_same_bits(case, k, name, results) -> None:
    first = results[0][k][name]["bytes"]
    for rank, res in enumerate(results):
        if res[k][name]["bytes"] != first:
            raise PropertyViolation(f"{_describe(case, k)}: {name} result differs between rank 0 and "
                                    f"rank {rank} (replicas would diverge)")


def check(case: CollectiveCase, results: list) -> None:
    """The property for ``case.op``; ``results`` are the per-rank outputs of collective_cases.run."""
    for k in range(len(case.inputs[0])):
        if case.op == "broadcast":
            want = to_bytes(as_tensor(case.inputs[case.root][k], case.dtype))
            for rank, res in enumerate(results):
                if res[k]["broadcast"]["bytes"] != want:
                    raise PropertyViolation(f"{_describe(case, k)} from root {case.root}: rank {rank} "
                                            f"holds {res[k]['broadcast']['values'].ravel()[:4].tolist()}, not "
                                            f"the root's {case.inputs[case.root][k].ravel()[:4].tolist()} "
                                            f"(first 4 elements, bitwise compare)")
            continue
        want, abs_sum = _exact_sum(case, k)
        bound = None if abs_sum is None else _float_bound(case.dtype, case.world_size, abs_sum)
        for rank, res in enumerate(results):
            _check_close(case, k, rank, "all_reduce", res[k]["all_reduce"]["values"], want, bound)
        _check_same_bits(case, k, "all_reduce", results)
        if case.op == "rs_ag":
            for rank, res in enumerate(results):
                rs_ag = res[k]["rs_ag"]["values"]
                ar = res[k]["all_reduce"]["values"]
                _check_close(case, k, rank, "reduce_scatter+all_gather vs all_reduce", rs_ag, ar,
                             None if bound is None else 2 * bound)
            _check_same_bits(case, k, "rs_ag", results)


def run_and_check(pools, case: CollectiveCase) -> None:
    results = pools.run(case.world_size, "correctness.collective_cases:run", case)
    check(case, results)
