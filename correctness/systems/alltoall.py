"""The all-to-all round trip the property checks: perfgate's MoE data path (perfgate.workloads.moe.alltoall).

Why: expert parallelism moves each token to the rank that owns its expert and back. The split sizes
differ per rank pair and change every step (zeros, skew, one hot expert), and a wrong split silently
loses or misroutes tokens rather than crashing. The seed report (§15-§16) checks every all-to-all by a
token-id round trip; :func:`round_trip` is that check's rank side, over the very permute, dispatch,
expert split and combine that the MoE perf step times, so the property guards what the perf test runs:

    dispatch: stable-sort tokens by expert, exchange per-expert counts, then the tokens with the
              per-rank sums as splits
    expert:   each local expert stamps its number into the rows it was given
    combine:  the inverse all_to_all_single (splits swapped), then un-sort to the original order

Test-only planted bug (``Routing.drop_last_split``): the sender silently drops its last split (the
tokens for the highest rank), with counts consistent so no collective fails.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.workloads.moe import alltoall

# Token payload columns (int64): a real MoE sends hidden states; ids make the check exact.
COL_ID, COL_ORIGIN, COL_POSITION, COL_SERVED_BY = 0, 1, 2, 3
PAYLOAD_COLS = 4
MISSING = -1  # the fill for a token that never came back


def token_id(origin: int, position: int) -> int:
    return (origin << 32) | position


@dataclass(frozen=True)
class Routing:
    """Where every token of every rank goes: ``dest[r][i]`` is the expert of rank r's token i; expert e
    lives on rank ``e // experts_per_rank``."""

    dest: tuple[tuple[int, ...], ...]
    experts_per_rank: int = 1
    drop_last_split: bool = False  # planted bug, test-only

    def __post_init__(self) -> None:
        w = len(self.dest)
        if w < 1:
            raise ValueError("a routing needs at least one rank")
        if self.experts_per_rank < 1:
            raise ValueError(f"experts_per_rank must be >= 1, got {self.experts_per_rank}")
        for r, row in enumerate(self.dest):
            bad = [d for d in row if not 0 <= d < self.experts]
            if bad:
                raise ValueError(f"rank {r} routes tokens to experts {bad}, there are {self.experts}")

    @property
    def world_size(self) -> int:
        return len(self.dest)

    @property
    def experts(self) -> int:
        return self.world_size * self.experts_per_rank

    def rank_of(self, expert: int) -> int:
        return expert // self.experts_per_rank

    def send_counts(self) -> list[list[int]]:
        """``counts[src][dst]``: tokens rank src sends to rank dst."""
        w = self.world_size
        return [[sum(self.rank_of(e) == d for e in row) for d in range(w)] for row in self.dest]


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
    plan = alltoall.permute(dest, world_size=ctx.world_size, experts_per_rank=routing.experts_per_rank,
                            drop_last_split=routing.drop_last_split)
    received = alltoall.dispatch(tokens.index_select(0, plan.rows), plan)
    expert_out = received.clone()
    for e, idx in enumerate(alltoall.local_expert_rows(plan, device=device)):
        expert_out[idx, COL_SERVED_BY] = rank * routing.experts_per_rank + e
    ctx.phase("alltoall combine")
    back = alltoall.combine(expert_out, plan)
    combined = torch.full_like(tokens, MISSING)
    combined[plan.rows] = back
    return {
        "send_counts": plan.send_split,
        "recv_counts": plan.recv_split,
        "received_ids": received[:, COL_ID].tolist(),
        "combined_ids": combined[:, COL_ID].tolist(),
        "served_by": combined[:, COL_SERVED_BY].tolist(),
    }
