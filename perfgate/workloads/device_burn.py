"""TEST-ONLY: extra device work in proportion to a step, so that a GPU gate can be shown to fire.

The planted bug ``gpu_step_slowdown`` (perfgate.mutations) makes every training step do a given
fraction more work ON THE DEVICE, as a slower kernel in a new CUDA, cuBLAS or PyTorch would:
after each step, back-to-back bf16 matrix products on the step's stream, as many as take that
fraction of the step's device time. Never a sleep: a sleep slows the host, and a host-bound step
would show it while a device-bound one would hide it behind queued work. This is the opposite:
a device-bound step slows by the fraction, a host-bound one may absorb it in its idle gaps --
which is exactly what a real device-side regression does.

Calibrated once per case from its warm-up steps (their device span, CUDA events) and the device
time of one product, so the injected share holds whatever the model and GPU.

One product's time is measured QUEUED behind a device-side spin, so the span between the events is
the products' own device time. Timed from an idle device instead, a small product measures the
host's launch rate: in a 1xH200 sitting (2026-12-04) ``serving_decode_slowdown:0.05`` timed 512 x 512
products at about ten times their device time inside the busy vLLM worker, planted 5 of them
(~0.03 ms, not the 0.27 ms asked for) and TPOT moved +0.5 %, not +5 %. The products are also never
smaller than ``MIN_N`` (~25 us each on an H200), so even where the burn starts on an idle device
its launches run ahead of the device and the products go back to back.
"""
from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from perfgate.workloads import timing

SIZES = (4096, 2048)     # square bf16 products tried, largest first
MIN_N = SIZES[-1]        # never smaller: smaller products are launch-bound on a busy host
MIN_PRODUCTS = 10        # the largest size that leaves this many in the target (rounding <= 5 %)
SPIN_CYCLES = 20_000_000  # the device spin the timed products queue behind (~10 ms at ~2 GHz)


@dataclass
class DeviceBurn:
    """``run()`` issues ``count`` products of two ``n x n`` bf16 matrices (asynchronously).

    ``target_ms`` is what was asked for (``fraction`` of the median step ``step_ms``), ``device_ms``
    what ``count`` products take on the device (one product's queued time ``product_ms`` each): the
    knob reports both, so a run says what it planted."""

    a: object
    b: object
    count: int
    product_ms: float = 0.0
    step_ms: float = 0.0
    fraction: float = 0.0

    @property
    def n(self) -> int:
        return int(self.a.shape[0])

    @property
    def target_ms(self) -> float:
        return self.fraction * self.step_ms

    @property
    def device_ms(self) -> float:
        return self.count * self.product_ms

    def run(self) -> None:
        for _ in range(self.count):
            self.a @ self.b


def queued_product_ms(a, b, reps: int = 20) -> float:
    """Device time of one ``a @ b``: ``reps`` products enqueued behind a device spin, so they run
    back to back whatever the host's launch rate, between two CUDA events."""
    import torch

    a @ b  # cuBLAS handle and heuristics out of the timing
    torch.cuda._sleep(SPIN_CYCLES)
    return timing.time_call(lambda: [a @ b for _ in range(reps)], timing.DEVICE)[1] * 1e3 / reps


def choose(target_ms: float, product_ms: Callable[[int], float]) -> tuple[int, int, float]:
    """(n, count, one product's ms) for a burn of ``target_ms``: the largest size in SIZES that
    leaves MIN_PRODUCTS products in the target, else the smallest (MIN_N), at least one product."""
    if not target_ms > 0:
        raise ValueError(f"a burn needs a positive target, got {target_ms!r} ms")
    for n in SIZES:
        one = product_ms(n)
        if not one > 0:
            raise ValueError(f"a {n} x {n} product measured {one!r} ms on the device")
        if target_ms / one >= MIN_PRODUCTS or n == MIN_N:
            return n, max(1, round(target_ms / one)), one
    raise AssertionError("unreachable")


def calibrate(step_device_ms: list[float], fraction: float, device) -> DeviceBurn:
    """A burn worth ``fraction`` of the median step device time in ``step_device_ms``."""
    import torch

    step_ms = statistics.median(step_device_ms)
    pairs = {}

    def product_ms(n: int) -> float:
        gen = torch.Generator(device=device).manual_seed(1234)
        pairs[n] = (torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen),
                    torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen))
        return queued_product_ms(*pairs[n])

    n, count, one = choose(fraction * step_ms, product_ms)
    return DeviceBurn(*pairs[n], count=count, product_ms=one, step_ms=step_ms, fraction=fraction)


def step_span_ms(fn, device) -> float:
    """Device span of one call of ``fn`` on an idle device (CUDA events), for calibration."""
    import torch

    torch.cuda.synchronize(device)
    return timing.time_call(fn, timing.DEVICE)[1] * 1e3
