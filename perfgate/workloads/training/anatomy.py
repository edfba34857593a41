"""Step anatomy: the collectives a DDP or FSDP step must issue, computed, not measured.

Pure arithmetic (no torch): the reduce compares what the workers counted with these numbers
exactly, so a changed bucketing, wrap policy or prefetch setting fails a check instead of
drifting inside a timing tolerance (seed report §5.7, §16.1, §16.2, §16.9).

DDP (torch.nn.parallel.DistributedDataParallel, torch 2.13):
- The first iteration reduces every gradient in one bucket (``_BucketCapacityConfig``: without
  ``find_unused_parameters`` the initial limit is ``sys.maxsize``); after it the C++ reducer
  rebuilds the buckets in gradient-ready order (about the reverse of registration order) with
  ``compute_bucket_assignment_by_size``: a tensor joins the open bucket, and the bucket closes as
  soon as its size *reaches or passes* the current limit. So ``bucket_cap_mb`` is a target, not a
  hard cap: a 1 MiB embedding under a 0.25 MiB cap is a bucket of 1 MiB, and a bucket ends just
  past the cap (§16.1).
- The limits are ``[first_bucket, cap]``: the first bucket is ``_DEFAULT_FIRST_BUCKET_BYTES``
  (1 MiB) only when ``bucket_cap_mb`` is left at its default (None, 25 MiB); an explicit cap is
  also the first bucket's.
- A comm hook is called once per bucket per synchronised backward: per optimizer step that is
  buckets x micro-batches without ``no_sync()``, buckets with it (§16.2: 104 -> 13 kernels).

FSDP (gloo and NCCL, every rank issues the same sequence):
- FSDP1 ``FULL_SHARD`` gathers every unit in forward and every unit but the root again in
  backward (the root keeps its parameters for backward), and reduce-scatters each unit once:
  2n + 1 all-gathers and n + 1 reduce-scatters with n wrapped blocks plus the root -- the seed's
  25 / 13 at its 12 blocks. ``SHARD_GRAD_OP`` gathers only in forward.
- FSDP2 ``fully_shard`` with reshard-after-forward reshards the root too (torch 2.13): every unit
  is gathered twice.
- Root-only wrapping is one unit: n = 0 in the same formulas.
- FSDP1 ``BackwardPrefetch.BACKWARD_PRE`` issues the next unit's all-gather before the current
  unit's reduce-scatter: in backward, every gathered unit but the first is prefetched (n - 1);
  with ``None``, none is. FSDP2 prefetches implicitly and re-gathers the root, whose reduce-scatter
  comes last, so the same count has no simple rule there: not asserted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

MIB = 2 ** 20
DDP_DEFAULT_FIRST_BUCKET_BYTES = 1 * MIB  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
DDP_DEFAULT_BUCKET_CAP_MB = 25.0

BACKWARD = "backward"  # the marker a collective log puts where the backward pass starts

# c10d operator names (torch.ops.c10d / _c10d_functional, as a dispatch mode sees them) -> family.
COLLECTIVE_FAMILY = {
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_coalesced_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather", "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter", "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce", "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
}
FAMILIES = ("all_gather", "reduce_scatter", "all_reduce")


def ddp_bucket_limits(bucket_cap_mb: float | None) -> list[int]:
    """The byte limits DDP's rebuilt buckets close at, in order (the last repeats)."""
    if bucket_cap_mb is None:
        return [DDP_DEFAULT_FIRST_BUCKET_BYTES, int(DDP_DEFAULT_BUCKET_CAP_MB * MIB)]
    return [int(bucket_cap_mb * MIB)]


def ddp_buckets(grad_bytes_in_ready_order: Sequence[int], bucket_cap_mb: float | None) -> list[int]:
    """Bytes of each bucket DDP forms from gradients of these sizes (one dtype and device),
    replicating ``compute_bucket_assignment_by_size``: close at size >= limit, then advance."""
    limits = ddp_bucket_limits(bucket_cap_mb)
    buckets: list[int] = []
    open_bytes, which = 0, 0
    for nbytes in grad_bytes_in_ready_order:
        if nbytes < 0:
            raise ValueError(f"a gradient of {nbytes} bytes")
        open_bytes += nbytes
        if open_bytes >= limits[which]:
            buckets.append(open_bytes)
            open_bytes, which = 0, min(which + 1, len(limits) - 1)
    if open_bytes:
        buckets.append(open_bytes)
    return buckets


def ddp_allreduces_per_step(buckets: int, grad_accum: int, no_sync: bool) -> int:
    """Comm-hook calls per optimizer step: once per bucket per synchronised backward."""
    return buckets * (1 if no_sync else grad_accum)


@dataclass(frozen=True)
class FSDPCollectives:
    all_gather: int
    reduce_scatter: int
    prefetched_all_gathers: int | None  # None: FSDP2, whose implicit backward prefetch has no rule here

    def as_dict(self) -> dict[str, int | None]:
        return {"all_gather": self.all_gather, "reduce_scatter": self.reduce_scatter,
                "prefetched_all_gathers": self.prefetched_all_gathers}


def fsdp_collectives(kind: str, *, wrapped_blocks: int, backward_prefetch: bool) -> FSDPCollectives:
    """Collectives per training step of an FSDP mode with ``wrapped_blocks`` units below the root
    (0: root-only wrapping), world size > 1; see the module docstring for the rules."""
    units = wrapped_blocks + 1
    if kind == "fsdp1-FULL_SHARD":
        backward_gathers = wrapped_blocks
    elif kind in ("fsdp1-SHARD_GRAD_OP", "fsdp2-noreshard"):
        backward_gathers = 0
    elif kind == "fsdp2-reshard":
        backward_gathers = units
    else:
        raise ValueError(f"no collective rule for FSDP kind {kind!r}")
    prefetched = (max(backward_gathers - 1, 0) if backward_prefetch else 0) if kind.startswith("fsdp1") else None
    return FSDPCollectives(units + backward_gathers, units, prefetched)


def count_collectives(ops: Sequence[str]) -> dict[str, int]:
    """{family: calls} of one step's logged operator names (markers and other ops ignored)."""
    counts = dict.fromkeys(FAMILIES, 0)
    for op in ops:
        family = COLLECTIVE_FAMILY.get(op.split("::")[-1])
        if family:
            counts[family] += 1
    return counts


def prefetched_all_gathers(ops: Sequence[str]) -> int:
    """Backward all-gathers issued while the previous gathered unit's reduce-scatter is still to come.

    In backward without prefetch each unit is gathered, computed, reduce-scattered: the k-th
    backward all-gather follows k - 1 reduce-scatters. A prefetched one is issued one unit early,
    after k - 2 or fewer."""
    if BACKWARD not in ops:
        raise ValueError("the collective log has no backward marker")
    gathers = scatters = prefetched = 0
    for op in ops[list(ops).index(BACKWARD) + 1:]:
        family = COLLECTIVE_FAMILY.get(op.split("::")[-1])
        if family == "all_gather":
            gathers += 1
            prefetched += gathers - scatters >= 2
        elif family == "reduce_scatter":
            scatters += 1
    return prefetched


def exposed_comm_s(ready_s: Sequence[float], done_s: Sequence[float], blocked_s: float) -> float:
    """Communication of one backward pass that no compute hid: the time the hooks blocked the
    backward, plus the tail from the last bucket handed over (the backward's compute is over) to
    the last all-reduce done. All-reduces that finish before the last bucket is ready overlapped."""
    if not ready_s:
        return blocked_s
    return blocked_s + max(0.0, max(done_s, default=0.0) - max(ready_s))
