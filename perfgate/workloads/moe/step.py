"""MoE expert-parallel step worker: permute -> dispatch -> expert MLPs -> combine -> unpermute.

Each rank holds ``tokens`` tokens and ``experts_per_rank`` experts (expert e on rank
e // experts_per_rank), each a real two-layer MLP (relu(x W1) W2), so a rank that owns a hot
expert really computes more. One step, as an expert-parallel MoE layer runs it:

1. permute: sort the (token, slot) pairs by expert, gather their rows into the send buffer;
2. dispatch: exchange the per-expert counts (``all_to_all_single`` of ``experts`` integers),
   then the rows (``all_to_all_single`` with per-rank split sizes from the routing);
3. experts: each local expert runs its MLP on the rows it received from every rank;
4. combine: the outputs go back the way they came (the dispatch's splits, swapped);
5. unpermute: each token's output is the gate-weighted sum of its k experts' rows.

Steps 1, 2 and 4 are perfgate.workloads.moe.alltoall, the data path the all-to-all property checks.

Every phase is timed on every rank (perf_counter; on GPU after a device synchronize, so a phase
holds its kernels). A rank's combine time includes waiting for the slowest peer to finish its
experts: the effect the seed report saw (§16.4), measured by the reduce as each rank's combine
time above the fastest rank's (perfgate.workloads.moe.reduce_metrics).

Timed steps are interleaved over the distributions (balanced, uniform, zipf, hot: step i of each
side by side), so slow drift of a shared machine's load cancels out of their paired ratios; each
round starts with the next distribution, so none always runs first after the round's start.
After timing, one more step per distribution is checked element by element against a reference
that every rank computes alone, without communication, from the same seeded experts. Tokens are
small integers and weights in {-1, 0, 1}, so every product and sum is exact in float32
(the spec refuses sizes where it would not be) and the check is ``wrong == 0``, not a tolerance.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

from perfgate.workloads.area import MIN_MEASURED_STEPS
from perfgate.workloads import timing
from perfgate.workloads.moe import alltoall, routing

EXACT_LIMIT = 1 << 24  # float32 represents every integer below this exactly


@dataclass(frozen=True)
class MoESpec:
    """One launch: every distribution of one (backend, world), timed interleaved."""

    world: int
    distributions: tuple[str, ...]   # the reference (balanced) first, then the cases
    tokens: int = 512                # per rank
    hidden: int = 128
    ffn: int = 512
    k: int = 2                       # top-k
    experts_per_rank: int = 2
    warmup_steps: int = 2
    measured_steps: int = 12
    seed: int = 0
    assumed_gflop_s: float = 5.0     # a slow rank's expert throughput, for the hang budget only

    def __post_init__(self):
        for name in self.distributions:
            routing.check_distribution(name)
        if not self.distributions or self.distributions[0] != routing.REFERENCE:
            raise ValueError(f"distributions must start with the reference {routing.REFERENCE!r}, "
                             f"got {self.distributions}")
        if self.measured_steps < MIN_MEASURED_STEPS:
            raise ValueError(f"measured_steps must be >= {MIN_MEASURED_STEPS}, got {self.measured_steps}")
        if not 1 <= self.k <= self.experts:
            raise ValueError(f"top-k must lie in [1, {self.experts}] ({self.world} ranks x "
                             f"{self.experts_per_rank} experts), got {self.k}")
        if (self.tokens * self.k) % self.experts:
            raise ValueError(f"tokens * k ({self.tokens} * {self.k}) must be divisible by the {self.experts} "
                             f"experts, so the balanced reference gives each exactly as many")
        bound = self.k * self.ffn * 2 * self.hidden  # |x| <= 2, |W| <= 1, gates <= 1
        if bound >= EXACT_LIMIT:
            raise ValueError(f"k * ffn * 2 * hidden = {bound} >= 2**24: outputs would not be exact in float32; "
                             f"use smaller hidden/ffn sizes")

    @property
    def experts(self) -> int:
        return self.world * self.experts_per_rank

    def expected_s(self) -> float:
        """Healthy work time on the slow side (the launcher's hang budget is 3x this): every step
        does three times a balanced rank's expert work at ``assumed_gflop_s``, plus 50 ms."""
        flops = self.tokens * self.k * 4 * self.hidden * self.ffn
        steps = (self.warmup_steps + self.measured_steps + 1) * len(self.distributions)
        return steps * (3 * flops / (self.assumed_gflop_s * 1e9) + 0.05)


def _experts(torch, spec: MoESpec, first: int, count: int, device):
    """Experts ``first .. first+count-1``, each (W1 [hidden, ffn], W2 [ffn, hidden]) in {-1, 0, 1},
    seeded by the expert's number: every rank can rebuild any expert for the reference."""
    out = []
    for e in range(first, first + count):
        g = torch.Generator().manual_seed(spec.seed * 7919 + 1000 + e)
        w1 = torch.randint(-1, 2, (spec.hidden, spec.ffn), generator=g).to(torch.float32)
        w2 = torch.randint(-1, 2, (spec.ffn, spec.hidden), generator=g).to(torch.float32)
        out.append((w1.to(device), w2.to(device)))
    return out


def _mlp(torch, w, x):
    return torch.relu(x @ w[0]) @ w[1]


def _tokens(torch, spec: MoESpec, rank: int, device):
    g = torch.Generator().manual_seed(spec.seed * 7919 + 17 + rank)
    return torch.randint(-2, 3, (spec.tokens, spec.hidden), generator=g).to(torch.float32).to(device)


class _Clock:
    """Phase boundaries on one rank: the host clock once the device drained (perfgate.workloads.timing.now).

    ``work()`` is what the expert phase's *work* is measured with: on GPU the same wall clock (the
    device is the rank's own), on CPU this process's CPU time, because ranks share the cores with
    each other and with the machine's other load: a rank whose peers sit waiting in the combine
    gets more of a core, so its wall time understates how much more it computes."""

    def __init__(self, device):
        self.device = device
        self.work = self if device.type == "cuda" else time.process_time

    def __call__(self) -> float:
        return timing.now(self.device)


def _step(torch, dist, spec: MoESpec, ctx, x, local, r: routing.Routing, clock: _Clock) -> dict:
    """One MoE layer step on this rank; returns its phase times (ms), the output and the counts."""
    flat = r.experts.reshape(-1)
    token_of_slot = torch.arange(spec.tokens, device=x.device).repeat_interleave(spec.k)
    t0 = clock()
    plan = alltoall.permute(flat, world_size=ctx.world_size, experts_per_rank=spec.experts_per_rank,
                            row_of_slot=token_of_slot)
    send = x.index_select(0, plan.rows)
    t1 = clock()
    recv = alltoall.dispatch(send, plan)
    t2, w2 = clock(), clock.work()
    out_rows = torch.empty_like(recv)
    for e, idx in enumerate(alltoall.local_expert_rows(plan, device=x.device)):
        if idx.numel():
            out_rows[idx] = _mlp(torch, local[e], recv.index_select(0, idx))
    t3, w3 = clock(), clock.work()
    back = alltoall.combine(out_rows, plan)
    t4 = clock()
    out = torch.zeros_like(x)
    out.index_add_(0, plan.rows, back * r.weights.reshape(-1)[plan.order].unsqueeze(1))
    t5 = clock()
    ms = lambda a, b: (b - a) * 1e3  # noqa: E731
    return {"permute_ms": ms(t0, t1), "dispatch_ms": ms(t1, t2), "expert_ms": ms(t2, t3),
            "expert_work_ms": ms(w2, w3),
            "combine_ms": ms(t3, t4), "unpermute_ms": ms(t4, t5), "step_ms": ms(t0, t5), "out": out,
            "sent_per_expert": plan.sent_per_expert.tolist(),
            "received_per_local_expert": plan.recv_per_source_expert.sum(0).tolist()}


def _reference(torch, spec: MoESpec, x, every_expert, r: routing.Routing):
    """The layer's output computed alone, without communication: each token's gate-weighted experts."""
    ref = torch.zeros_like(x)
    for e, w in enumerate(every_expert):
        hit = r.experts == e                               # [tokens, k]
        tok = hit.any(1).nonzero().squeeze(1)
        if tok.numel():
            gate = (r.weights * hit).sum(1)[tok].unsqueeze(1)  # a token picks an expert at most once
            ref.index_add_(0, tok, _mlp(torch, w, x.index_select(0, tok)) * gate)
    return ref


PHASES = ("permute_ms", "dispatch_ms", "expert_ms", "expert_work_ms", "combine_ms", "unpermute_ms", "step_ms")


def run(spec: MoESpec, ctx) -> dict:
    """Worker entry point (perfgate.launch.jobs): this rank's raw samples per distribution."""
    import torch
    import torch.distributed as dist

    if ctx.world_size != spec.world:
        raise ValueError(f"spec is for {spec.world} ranks, launched on {ctx.world_size}")
    device = ctx.device
    if device.type == "cpu":
        torch.set_num_threads(1)  # one thread per rank: ranks share few cores
    x = _tokens(torch, spec, ctx.rank, device)
    local = _experts(torch, spec, ctx.rank * spec.experts_per_rank, spec.experts_per_rank, device)
    routes = {}
    for name in spec.distributions:
        r = routing.route(torch, name, tokens=spec.tokens, k=spec.k, experts=spec.experts,
                          experts_per_rank=spec.experts_per_rank, rank=ctx.rank, seed=spec.seed)
        routes[name] = routing.Routing(r.experts.to(device), r.weights.to(device))
    clock = _Clock(device)
    results = {name: {p: [] for p in PHASES} for name in spec.distributions}
    for i in range(spec.warmup_steps + spec.measured_steps):
        ctx.phase(f"{'warm-up' if i < spec.warmup_steps else 'timed'} round {i}")
        shift = i % len(spec.distributions)  # each round starts one later: no case always goes first
        for name in spec.distributions[shift:] + spec.distributions[:shift]:
            dist.barrier()
            got = _step(torch, dist, spec, ctx, x, local, routes[name], clock)
            if i >= spec.warmup_steps:
                for p in PHASES:
                    results[name][p].append(got[p])
    ctx.phase("check against the reference without communication")
    every = _experts(torch, spec, 0, spec.experts, device)
    for name in spec.distributions:
        dist.barrier()
        got = _step(torch, dist, spec, ctx, x, local, routes[name], clock)
        ref = _reference(torch, spec, x, every, routes[name])
        results[name].update(wrong=int((got["out"] != ref).sum().item()), sent_per_expert=got["sent_per_expert"],
                             received_per_local_expert=got["received_per_local_expert"],
                             routed_as=routing.effective(name))
    return results
