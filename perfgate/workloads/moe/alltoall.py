"""The expert-parallel data path over ``all_to_all_single`` with variable splits: permute, dispatch, combine.

Expert parallelism moves each token (each of its top-k slots) to the rank that owns its expert and back.
The split sizes differ per rank pair and change every step (zeros, skew, one hot expert), and a wrong
split silently loses or misroutes tokens rather than crashing. This is the one implementation: the MoE
perf step (perfgate.workloads.moe.step) times it, and the hypothesis property of the all-to-all
(correctness/alltoall_properties.py, through correctness/systems/alltoall.py) checks it by a token-id
round trip on every routing shape, so an off-by-one in the splits fails the property, not only a perf run.

    permute:  stable-sort the slots by expert; count the slots per expert (local, no communication)
    dispatch: exchange the per-expert counts (``all_to_all_single`` of one count per expert), then the
              rows, with the per-rank sums of those counts as splits
    experts:  :func:`local_expert_rows` says which received rows each local expert computes
    combine:  the inverse ``all_to_all_single`` (splits swapped): the outputs come back in the sent order

Expert ``e`` lives on rank ``e // experts_per_rank``. Undoing the permutation (a gate-weighted sum in an
MoE layer, a plain inverse in the property) is the caller's: ``Dispatch.rows`` says which source row each
returned row belongs to.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Dispatch:
    """One dispatch's bookkeeping: what combine and the experts need to undo and serve it."""

    world_size: int
    experts_per_rank: int
    order: Any             # LongTensor: the slots in sent order (a stable sort by expert)
    rows: Any              # LongTensor: the source row of each sent slot (order, mapped through row_of_slot)
    sent_per_expert: Any   # LongTensor [experts]: slots this rank sends to each expert
    send_split: list[int] = field(default_factory=list)   # rows sent to each rank (set by dispatch)
    recv_split: list[int] = field(default_factory=list)   # rows received from each rank (set by dispatch)
    recv_per_source_expert: Any = None  # LongTensor [ranks, local experts]: rows received (set by dispatch)


def permute(expert, *, world_size: int, experts_per_rank: int = 1, row_of_slot=None,
            drop_last_split: bool = False) -> Dispatch:
    """Sort the slots ``expert`` (the expert of each slot) by expert and count them, on this rank alone.

    ``row_of_slot``: the source row of each slot (top-k: each token's row k times); None: slot i is row i.
    ``drop_last_split`` is a planted bug for the property's own test (correctness/test_planted_bugs.py):
    the slots for the last rank never leave, with counts consistent so no collective fails."""
    import torch

    experts = world_size * experts_per_rank
    order = torch.argsort(expert, stable=True)
    counts = torch.bincount(expert, minlength=experts)
    if drop_last_split:
        order = order[:int(counts[:-experts_per_rank].sum())]
        counts[-experts_per_rank:] = 0
    rows = order if row_of_slot is None else row_of_slot[order]
    return Dispatch(world_size, experts_per_rank, order, rows, counts)


def dispatch(send, plan: Dispatch, *, group=None):
    """Send the permuted rows ``send`` (``source.index_select(0, plan.rows)``) to their experts' ranks;
    returns the received rows, grouped by source rank, each source's sorted by local expert."""
    import torch
    import torch.distributed as dist

    recv_counts = torch.empty_like(plan.sent_per_expert)
    dist.all_to_all_single(recv_counts, plan.sent_per_expert, group=group)  # [source][local expert]
    plan.send_split = plan.sent_per_expert.view(plan.world_size, plan.experts_per_rank).sum(1).tolist()
    plan.recv_per_source_expert = recv_counts.view(plan.world_size, plan.experts_per_rank)
    plan.recv_split = plan.recv_per_source_expert.sum(1).tolist()
    received = send.new_empty((sum(plan.recv_split), *send.shape[1:]))
    dist.all_to_all_single(received, send, plan.recv_split, plan.send_split, group=group)
    return received


def local_expert_rows(plan: Dispatch, device=None) -> list:
    """For each local expert, the indices of the received rows it computes (from every source rank)."""
    import torch

    n, el = plan.world_size, plan.experts_per_rank
    counts = plan.recv_per_source_expert.reshape(-1)
    starts = (torch.cumsum(counts, 0) - counts).view(n, el).tolist()
    sizes = plan.recv_per_source_expert.tolist()
    return [torch.cat([torch.arange(starts[s][e], starts[s][e] + sizes[s][e], device=device) for s in range(n)])
            for e in range(el)]


def combine(expert_out, plan: Dispatch, *, group=None):
    """Return the experts' output rows to their senders: row j of the result answers sent slot j
    (``plan.rows[j]`` is its source row)."""
    import torch.distributed as dist

    back = expert_out.new_empty((len(plan.rows), *expert_out.shape[1:]))
    dist.all_to_all_single(back, expert_out, plan.send_split, plan.recv_split, group=group)
    return back
