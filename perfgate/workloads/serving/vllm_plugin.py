"""TEST-ONLY: perfgate's vLLM plugin, which plants ``serving_decode_slowdown`` inside a real server.

A serving gate on the GPU must be shown to catch a device-side regression of the decode step,
as a slower attention or GEMM kernel in a new vLLM, CUDA or PyTorch would cause. The server is
a process perfgate does not control, so the bug goes in through vLLM's own plugin mechanism:
the ``vllm.general_plugins`` entry point (pyproject.toml) is loaded by every vLLM process, and
this function does nothing unless ``PERFGATE_TEST_MUTATION`` names the knob (perfgate.mutations).

With ``serving_decode_slowdown:F`` the GPU worker's ``execute_model`` is wrapped: after each
decode step's forward is enqueued (a step of at most ``DECODE_TOKENS`` scheduled tokens, so a
prompt's prefill is left alone), bf16 matrix products worth F of that step's device time run on
the same stream (perfgate.workloads.device_burn, the training knob's burn), so sampling and the
next step wait for them. The share is calibrated inside the server from decode steps after the
first ``SKIP_STEPS`` (vLLM's own kernel warm-up runs through the same method): the median span,
between CUDA events, of ``CALIBRATION_STEPS`` forwards started on an idle device. Never a sleep.

GPU only: on a machine without CUDA the server refuses to start with this knob set, instead of
running unmutated while the results say it was mutated.
"""
from __future__ import annotations

import functools
import logging

from perfgate import mutations

MUTATION = "serving_decode_slowdown"
DECODE_TOKENS = 64       # scheduled tokens at most in a step that counts as decode (the GPU sweep's C <= 32)
SKIP_STEPS = 32          # decode-like steps left out of the calibration (warm-up, first requests)
CALIBRATION_STEPS = 32   # forwards whose median device span sets the burn

log = logging.getLogger("perfgate.vllm_plugin")


class _DecodeBurn:
    """The wrapper's state in one worker process: calibration samples, then the burn."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction
        self.seen = 0
        self.spans_ms: list[float] = []
        self.burn = None

    def step(self, original, worker, scheduler_output):
        import torch

        from perfgate.workloads import device_burn
        from perfgate.workloads import timing

        tokens = scheduler_output.total_num_scheduled_tokens
        if not 0 < tokens <= DECODE_TOKENS:
            return original(worker, scheduler_output)
        if self.burn is not None:
            out = original(worker, scheduler_output)
            self.burn.run()
            return out
        self.seen += 1
        if self.seen <= SKIP_STEPS:
            return original(worker, scheduler_output)
        torch.cuda.synchronize()
        out, span_s = timing.time_call(lambda: original(worker, scheduler_output), timing.DEVICE)
        self.spans_ms.append(span_s * 1e3)
        if len(self.spans_ms) >= CALIBRATION_STEPS:
            self.burn = device_burn.calibrate(self.spans_ms, self.fraction, torch.cuda.current_device())
            log.warning("perfgate test-only mutation %s:%g: decode step %.3f ms (median of %d), burn of %d "
                        "bf16 %dx%d products after each decode forward: %.3f ms on the device (asked %.3f ms)",
                        MUTATION, self.fraction, self.burn.step_ms, len(self.spans_ms),
                        self.burn.count, self.burn.n, self.burn.n, self.burn.device_ms, self.burn.target_ms)
        return out


def register() -> None:
    """vLLM calls this in each of its processes; inert unless the test-only knob is set."""
    fraction = mutations.factor(MUTATION)
    if fraction is None:
        return
    import torch

    if not torch.cuda.is_available():
        raise RuntimeError(f"perfgate test-only mutation {MUTATION} needs a CUDA GPU (it adds device work to "
                           f"the decode step); unset {mutations.ENV} on this machine")
    from vllm.v1.worker import gpu_worker

    original = gpu_worker.Worker.execute_model
    if getattr(original, "_perfgate_burn", None) is not None:
        return  # loaded twice in one process (vLLM may): wrap once
    state = _DecodeBurn(fraction)

    @functools.wraps(original)
    def execute_model(self, scheduler_output):
        return state.step(original, self, scheduler_output)

    execute_model._perfgate_burn = state
    gpu_worker.Worker.execute_model = execute_model
