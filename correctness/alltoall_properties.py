"""Strategies and check for MoE dispatch/combine over variable-split all_to_all_single.

A case is a :class:`correctness.systems.alltoall.Routing`: the expert of every token of every rank,
with one or two experts per rank (as the MoE perf step runs it). The strategy builds the send-count
matrix first, in one of four shapes real routers produce (uniform-random, all zeros, one hot expert
rank, geometric skew), picks each token's expert among its rank's, then orders each rank's tokens by a
permutation so dispatch has to sort and combine has to un-sort.
"""
from __future__ import annotations

from hypothesis import strategies as st

from correctness.property_violation import PropertyViolation
from correctness.systems.alltoall import MISSING, Routing, token_id

STYLES = ("random", "zeros", "hot_rank", "skew")


@st.composite
def routings(draw, world_size: int, drop_last_split: bool = False) -> Routing:
    w = world_size
    style = draw(st.sampled_from(STYLES))
    if style == "zeros":
        counts = [[0] * w for _ in range(w)]
    elif style == "hot_rank":
        hot = draw(st.integers(0, w - 1))
        counts = [[draw(st.integers(1, 48)) if d == hot else draw(st.integers(0, 2)) for d in range(w)]
                  for _ in range(w)]
    elif style == "skew":
        counts = [[draw(st.integers(0, 64 >> (2 * ((d - s) % w)))) for d in range(w)] for s in range(w)]
    else:
        counts = [[draw(st.integers(0, 12)) for _ in range(w)] for _ in range(w)]
    per_rank = draw(st.sampled_from((1, 2)))
    dest = []
    for s in range(w):
        grouped = [d * per_rank + draw(st.integers(0, per_rank - 1)) for d in range(w) for _ in range(counts[s][d])]
        dest.append(tuple(draw(st.permutations(grouped))))
    return Routing(dest=tuple(dest), experts_per_rank=per_rank, drop_last_split=drop_last_split)


def check_round_trip(routing: Routing, results: list[dict]) -> None:
    """Counts transpose, tokens are conserved, every token reaches its expert and returns in order."""
    w = routing.world_size
    sent = routing.send_counts()
    for r, res in enumerate(results):
        if res["send_counts"] != sent[r]:
            raise PropertyViolation(f"rank {r} sent splits {res['send_counts']}, its routing asks for {sent[r]}")
        want_recv = [sent[s][r] for s in range(w)]
        if res["recv_counts"] != want_recv:
            raise PropertyViolation(f"rank {r} received splits {res['recv_counts']}, "
                                    f"the transposed send counts are {want_recv}")
    total_sent = sum(map(sum, sent))
    total_received = sum(len(res["received_ids"]) for res in results)
    if total_received != total_sent:
        raise PropertyViolation(f"{total_sent} tokens sent, {total_received} received: not conserved")
    per_rank = routing.experts_per_rank
    for e, res in enumerate(results):
        want = [token_id(s, i) for s in range(w) for x in range(e * per_rank, (e + 1) * per_rank)
                for i, d in enumerate(routing.dest[s]) if d == x]
        if res["received_ids"] != want:
            raise PropertyViolation(f"expert rank {e} received token ids {res['received_ids'][:8]}..., "
                                    f"expected {want[:8]}... (grouped by source, then by expert, in source order)")
    for r, res in enumerate(results):
        want = [token_id(r, i) for i in range(len(routing.dest[r]))]
        if res["combined_ids"] != want:
            lost = [i for i, t in enumerate(res["combined_ids"]) if t == MISSING]
            raise PropertyViolation(f"rank {r}: combine returned ids out of order or lost "
                                    f"(positions lost: {lost[:8]}; got {res['combined_ids'][:8]}...)")
        if res["served_by"] != list(routing.dest[r]):
            raise PropertyViolation(f"rank {r}: tokens were served by experts {res['served_by'][:8]}..., "
                                    f"routed to {list(routing.dest[r])[:8]}...")


def run_and_check(pools, routing: Routing) -> None:
    results = pools.run(routing.world_size, "correctness.systems.alltoall:round_trip", routing)
    check_round_trip(routing, results)
