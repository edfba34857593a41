"""MoE-style token dispatch and combine over ``all_to_all_single`` with variable splits.

Why: expert parallelism moves each token to the rank that owns its expert and back. The
split sizes differ per rank pair and change every step (zeros, skew, one hot expert), and
a wrong split silently loses or misroutes tokens rather than crashing. The seed report
(§15-§16) checks every all-to-all by a token-id round trip; this module is that data path:

    dispatch: stable-sort tokens by destination, exchange per-peer counts (all_to_all_single
              of one count per peer), then exchange the tokens with those counts as splits
    expert:   whatever the owner computes (here: stamps its rank into the token)
    combine:  the inverse all_to_all_single (splits swapped), then un-sort to the original order

:func:`round_trip` runs all three on one rank for a :class:`Routing` and returns what a
property test needs to check conservation, transposition and order.

Test-only planted bug (``Routing.drop_last_split``): the sender silently drops its last
split (the tokens for the highest rank), with counts consistent so no collective fails.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Token payload columns (int64): a real MoE sends hidden states; ids make the check exact.
COL_ID, COL_ORIGIN, COL_POSITION, COL_SERVED_BY = 0, 1, 2, 3
PAYLOAD_COLS = 4
MISSING = -1  # combine's fill for a token that never came back


def token_id(origin: int, position: int) -> int:
    return (origin << 32) | position


@dataclass(frozen=True)
class Routing:
    """Where every token of every rank goes: ``dest[r][i]`` is the expert rank of rank r's token i."""

    dest: tuple[tuple[int, ...], ...]
    drop_last_split: bool = False  # planted bug, test-only

    def __post_init__(self) -> None:
        w = len(self.dest)
        if w < 1:
            raise ValueError("a routing needs at least one rank")
        for r, row in enumerate(self.dest):
            bad = [d for d in row if not 0 <= d < w]
            if bad:
                raise ValueError(f"rank {r} routes tokens to ranks {bad}, world size is {w}")

    @property
    def world_size(self) -> int:
        return len(self.dest)

    def send_counts(self) -> list[list[int]]:
        """``counts[src][dst]``: tokens rank src sends to rank dst."""
        w = self.world_size
        return [[row.count(d) for d in range(w)] for row in self.dest]


@dataclass
class DispatchPlan:
    """What combine needs to undo a dispatch."""

    order: Any  # LongTensor: positions of the sent tokens in the original order
    send_counts: list[int]
    recv_counts: list[int]
    n_tokens: int


def dispatch(tokens, dest, world_size: int, *, group=None, drop_last_split: bool = False):
    """Send each row of ``tokens`` to rank ``dest[row]``; returns (received rows, plan)."""
    import torch
    import torch.distributed as dist

    order = torch.argsort(dest, stable=True)
    send_counts = torch.bincount(dest, minlength=world_size).to(torch.int64)
    if drop_last_split:  # planted bug: the last split never leaves
        keep = int(send_counts[:-1].sum())
        order = order[:keep]
        send_counts[-1] = 0
    send = tokens[order]
    recv_counts = torch.empty_like(send_counts)
    dist.all_to_all_single(recv_counts, send_counts, group=group)
    recv_list, send_list = recv_counts.tolist(), send_counts.tolist()
    received = tokens.new_empty((sum(recv_list), *tokens.shape[1:]))
    dist.all_to_all_single(received, send, recv_list, send_list, group=group)
    return received, DispatchPlan(order=order, send_counts=send_list, recv_counts=recv_list,
                                  n_tokens=tokens.shape[0])


def combine(expert_out, plan: DispatchPlan, *, group=None, fill: int = MISSING):
    """Return expert outputs to their senders and restore the original token order."""
    import torch
    import torch.distributed as dist

    back = expert_out.new_empty((sum(plan.send_counts), *expert_out.shape[1:]))
    dist.all_to_all_single(back, expert_out, plan.send_counts, plan.recv_counts, group=group)
    out = torch.full((plan.n_tokens, *expert_out.shape[1:]), fill, dtype=expert_out.dtype,
                     device=expert_out.device)
    out[plan.order] = back
    return out


def round_trip(routing: Routing, ctx) -> dict[str, list]:
    """Rank side of the property: dispatch this rank's tokens, stamp them at the expert, combine."""
    import torch

    if routing.world_size != ctx.world_size:
        raise ValueError(f"routing is for {routing.world_size} ranks, the group has {ctx.world_size}")
    rank = ctx.rank
    device = ctx.device  # cpu under gloo, this rank's GPU under nccl
    dest = torch.tensor(routing.dest[rank], dtype=torch.int64, device=device)
    n = dest.numel()
    tokens = torch.full((n, PAYLOAD_COLS), MISSING, dtype=torch.int64, device=device)
    positions = torch.arange(n, dtype=torch.int64, device=device)
    tokens[:, COL_ID] = (rank << 32) | positions
    tokens[:, COL_ORIGIN] = rank
    tokens[:, COL_POSITION] = positions
    ctx.phase("alltoall dispatch")
    received, plan = dispatch(tokens, dest, ctx.world_size, drop_last_split=routing.drop_last_split)
    expert_out = received.clone()
    expert_out[:, COL_SERVED_BY] = rank
    ctx.phase("alltoall combine")
    combined = combine(expert_out, plan)
    return {
        "send_counts": plan.send_counts,
        "recv_counts": plan.recv_counts,
        "received_ids": received[:, COL_ID].tolist(),
        "combined_ids": combined[:, COL_ID].tolist(),
        "served_by": combined[:, COL_SERVED_BY].tolist(),
    }
