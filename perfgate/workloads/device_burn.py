"""TEST-ONLY: extra device work in proportion to a step, so that a GPU gate can be shown to fire.

The planted bug ``gpu_step_slowdown`` (perfgate.mutations) makes every training step do a given
fraction more work ON THE DEVICE, as a slower kernel in a new CUDA, cuBLAS or PyTorch would:
after each step, back-to-back bf16 matrix products on the step's stream, as many as take that
fraction of the step's device time. Never a sleep: a sleep slows the host, and a host-bound step
would show it while a device-bound one would hide it behind queued work. This is the opposite:
a device-bound step slows by the fraction, a host-bound one may absorb it in its idle gaps --
which is exactly what a real device-side regression does.

Calibrated once per case from its warm-up steps (their device span, CUDA events) and the measured
time of one product, so the injected share holds whatever the model and GPU.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass

from perfgate.workloads.device_time import event_span_ms


@dataclass
class DeviceBurn:
    """``run()`` issues ``count`` products of two ``n x n`` bf16 matrices (asynchronously)."""

    a: object
    b: object
    count: int

    def run(self) -> None:
        for _ in range(self.count):
            self.a @ self.b


def _product_ms(a, b, reps: int = 20) -> float:
    a @ b
    return event_span_ms(lambda: [a @ b for _ in range(reps)])[1] / reps


def calibrate(step_device_ms: list[float], fraction: float, device) -> DeviceBurn:
    """A burn worth ``fraction`` of the median step device time in ``step_device_ms``."""
    import torch

    target_ms = fraction * statistics.median(step_device_ms)
    # Largest product that still leaves ~20 of them in the target (fine-grained, few launches).
    for n in (4096, 2048, 1024, 512):
        gen = torch.Generator(device=device).manual_seed(1234)
        a = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, n, device=device, dtype=torch.bfloat16, generator=gen)
        one = _product_ms(a, b)
        if target_ms / one >= 20 or n == 512:
            return DeviceBurn(a, b, max(1, round(target_ms / one)))
    raise AssertionError("unreachable")


def step_span_ms(fn, device) -> float:
    """Device span of one call of ``fn`` on an idle device (CUDA events), for calibration."""
    import torch

    torch.cuda.synchronize(device)
    return event_span_ms(fn, device)[1]
