"""Routing distributions of an MoE layer: which experts each token's top-k slots go to.

A real router's choice is a top-k over learned logits; what the communication sees of it is
only the histogram (how many tokens each expert gets) and which rank owns each expert. So the
router here draws each token's k distinct experts from a named distribution with a seeded
generator (the same tokens every run, every rank a different stream):

* ``balanced``: round-robin, every expert gets exactly ``tokens * k / experts`` slots. Not a
  test case: the in-run reference every case's step time is divided by.
* ``uniform``: every expert equally likely (what an aux-loss-balanced router aims for; the
  counts scatter by a few percent).
* ``zipf<s>``: the i-th most popular expert has weight ``(i + 1) ** -s``; popularity goes
  round-robin over the ranks (the 1st on rank 0, the 2nd on rank 1, ...), as a placement that
  knows the popularity would put it, so the skew is between experts more than between ranks.
* ``hot<h>``: one hot expert (expert 0, on rank 0) has probability ``h``, the others share the
  rest. Sampling k distinct experts, a token picks the hot one more often than ``h``: at
  ``hot0.5``, top-2, about 80 % of tokens send one slot to expert 0.

Gate weights are multiples of 1/8 in [1/8, 1]: exact in every float type, so the combined
output can be compared with the reference element by element (perfgate.workloads.moe.step).

Test-only knob: the registered mutation ``moe_hot_expert`` (perfgate.mutations) routes the
``uniform`` distribution's tokens with ``hot0.5`` instead: the planted routing skew that the
uniform case's gated ratios must catch (tests/test_mutations.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from perfgate import mutations

REFERENCE = "balanced"
PLANTED_HOT = "hot0.5"  # what the mutation routes the uniform case with
_NAME = re.compile(r"^(balanced|uniform|zipf(?P<s>\d+(\.\d+)?)|hot(?P<h>0\.\d+))$")


class RoutingError(ValueError):
    """A distribution name or routing shape that cannot be used."""


def check_distribution(name: str) -> None:
    m = _NAME.match(name)
    if not m:
        raise RoutingError(f"unknown routing distribution {name!r}: use balanced, uniform, zipf<s> (e.g. zipf1.2) "
                           f"or hot<h> with 0 < h < 1 (e.g. hot0.5)")
    if m.group("h") is not None and not 0.0 < float(m.group("h")) < 1.0:
        raise RoutingError(f"{name}: the hot expert's probability must lie in (0, 1)")


def effective(name: str) -> str:
    """The distribution actually routed for ``name``: ``uniform`` becomes the planted hot expert
    while the TEST-ONLY mutation ``moe_hot_expert`` is on; every other name is itself."""
    return PLANTED_HOT if name == "uniform" and mutations.active("moe_hot_expert") else name


def expert_weights(torch, name: str, experts: int, experts_per_rank: int):
    """Sampling weights over the experts (expert e lives on rank e // experts_per_rank)."""
    check_distribution(name)
    m = _NAME.match(name)
    if m.group("s") is not None:
        s = float(m.group("s"))
        ranks = experts // experts_per_rank
        # popularity order i -> expert: round-robin over ranks, then over a rank's experts
        order = [(i % ranks) * experts_per_rank + i // ranks for i in range(experts)]
        w = torch.empty(experts, dtype=torch.float64)
        for i, e in enumerate(order):
            w[e] = (i + 1) ** -s
        return w / w.sum()
    if m.group("h") is not None:
        h = float(m.group("h"))
        w = torch.full((experts,), (1.0 - h) / (experts - 1), dtype=torch.float64)
        w[0] = h
        return w
    return torch.full((experts,), 1.0 / experts, dtype=torch.float64)


@dataclass(frozen=True)
class Routing:
    """One rank's routed batch: ``experts[t, j]`` is token t's j-th expert, ``weights[t, j]`` its gate."""

    experts: object   # int64 [tokens, k]
    weights: object   # float32 [tokens, k], multiples of 1/8


def route(torch, name: str, *, tokens: int, k: int, experts: int, experts_per_rank: int, rank: int,
          seed: int) -> Routing:
    """This rank's routing of ``tokens`` tokens under distribution ``name`` (the knob applied)."""
    name = effective(name)
    check_distribution(name)
    if not 1 <= k <= experts:
        raise RoutingError(f"top-k must lie in [1, experts={experts}], got {k}")
    g = torch.Generator().manual_seed(seed * 1_000_003 + rank)
    if name == REFERENCE:
        if (tokens * k) % experts:
            raise RoutingError(f"balanced routing needs tokens * k ({tokens} * {k}) divisible by {experts} experts")
        slot = torch.arange(tokens * k, dtype=torch.int64).view(tokens, k) + rank * k
        chosen = slot % experts  # k consecutive slots: distinct experts while k <= experts
    else:
        w = expert_weights(torch, name, experts, experts_per_rank)
        chosen = torch.multinomial(w.expand(tokens, experts), k, replacement=False, generator=g)
    gates = torch.randint(1, 9, (tokens, k), generator=g).to(torch.float32) / 8
    return Routing(chosen.to(torch.int64), gates)
