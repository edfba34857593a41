"""Predicted decode rate of an SSD-offloaded MoE model from measured miss latencies.

Model (stated so it can be argued with):

  * A token passes L MoE layers one after another; each needs k experts.
  * Each expert hits the RAM cache independently with probability h (the hit rate), so the
    number of misses m in a layer is Binomial(k, 1 - h).
  * Reading m missed experts together costs t(m): 0 for m = 0, the measured one-expert read t1
    for m = 1, the measured k-miss layer read tk for m = k, linear in between,
        t(m) = t1 + (m - 1) (tk - t1) / (k - 1).
    (A device that saturates behaves linearly in m; a latency-bound one is flatter. Measuring
    both ends and interpolating keeps the model honest at the two points we know.)
  * Reads do not overlap compute or other layers (the seed's pager blocks the layer on its
    slowest miss); compute per layer c is an input (default 0: an I/O-only upper bound).

  token time  = L * (c + E[t(m)]),   E over m ~ Binomial(k, 1 - h)
  decode rate = 1 / token time

The seed's numbers as a check: L = 40, k = 8, h = 0.70, t1 ~ 2.5 ms, t8 = 7.6 ms give 3.4 ms of
I/O per layer, 137 ms per token, 7.3 tok/s of I/O alone - the seed measured 5.5 tok/s with compute
and barrier waits on top, and put the single-token ceiling of that machine at 6-7 tok/s.
"""
from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import binom


@dataclass(frozen=True)
class DecodeModel:
    n_layers: int
    k: int
    hit_rate: float
    expert_miss_s: float
    layer_miss_s: float
    compute_s_per_layer: float = 0.0

    def __post_init__(self):
        if self.n_layers < 1 or self.k < 1:
            raise ValueError(f"need n_layers >= 1 and k >= 1, got {self.n_layers}, {self.k}")
        if not 0.0 <= self.hit_rate <= 1.0:
            raise ValueError(f"hit_rate must be in [0, 1], got {self.hit_rate}")
        if self.expert_miss_s < 0 or self.layer_miss_s < 0 or self.compute_s_per_layer < 0:
            raise ValueError("latencies must be non-negative")

    def io_s(self, misses: int) -> float:
        """t(m): time to read m missed experts of one layer together."""
        if misses <= 0:
            return 0.0
        if self.k == 1:
            return self.expert_miss_s
        return self.expert_miss_s + (misses - 1) * (self.layer_miss_s - self.expert_miss_s) / (self.k - 1)

    def expected_layer_io_s(self) -> float:
        pmf = binom(self.k, 1.0 - self.hit_rate).pmf
        return sum(float(pmf(m)) * self.io_s(m) for m in range(1, self.k + 1))

    def token_s(self) -> float:
        return self.n_layers * (self.compute_s_per_layer + self.expected_layer_io_s())

    def tok_per_s(self) -> float:
        t = self.token_s()
        return float("inf") if t == 0 else 1.0 / t

    def as_dict(self) -> dict:
        return {
            "n_layers": self.n_layers, "k": self.k, "hit_rate": self.hit_rate,
            "expert_miss_ms": self.expert_miss_s * 1e3, "layer_miss_ms": self.layer_miss_s * 1e3,
            "compute_ms_per_layer": self.compute_s_per_layer * 1e3,
            "expected_layer_io_ms": self.expected_layer_io_s() * 1e3,
            "token_ms": self.token_s() * 1e3, "tok_per_s": self.tok_per_s(),
        }
