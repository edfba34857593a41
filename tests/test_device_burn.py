"""The planted device slowdown's calibration (perfgate.workloads.device_burn): how many products of which size.

On a 1xH200 lease (2026-12-04) serving_decode_slowdown:0.05 asked for 0.27 ms a decode step and got ~0.03 ms:
the product time was measured from an idle device inside a busy vLLM worker, so 512 x 512 products timed the
host's launch rate (~10x their device time), and the calibration planted 5 of them. TPOT moved +0.5 %. These
tests hold the choice to products that are device work and counted from their queued device time. The last
test runs the real products on a GPU and skips elsewhere."""
from __future__ import annotations

import pytest

from perfgate.workloads import device_burn

# one product's device time on an H200 (bf16, measured queued): 4096^3 ~0.20 ms, 2048^3 ~0.026 ms
H200 = {4096: 0.20, 2048: 0.026, 1024: 0.004, 512: 0.0006}


def test_serving_five_percent_of_a_decode_step_is_ten_2048_products():
    n, count, one = device_burn.choose(0.05 * 5.438, H200.__getitem__)
    assert (n, count) == (2048, 10) and count * one == pytest.approx(0.27, rel=0.05)


def test_training_steps_keep_the_4096_products_the_power_runs_used():
    # gpt-1.3b mb4: ~142 ms of device time a step; 5 % is 36 products of 4096, as the old rule chose too
    assert device_burn.choose(0.05 * 142.0, H200.__getitem__)[:2] == (4096, 36)


def test_never_smaller_than_min_n_even_for_a_tiny_target():
    n, count, _ = device_burn.choose(0.005, H200.__getitem__)
    assert n == device_burn.MIN_N and count == 1


def test_a_launch_bound_timer_cannot_pull_the_size_below_min_n():
    """The 2026-12-04 failure: small products timed at the host's launch rate. Whatever the timer says
    of sizes below MIN_N, they are never asked for."""
    asked = []

    def timer(n):
        asked.append(n)
        return {4096: 0.20, 2048: 0.05}.get(n, 0.054)

    n, count, _ = device_burn.choose(0.27, timer)
    assert n >= device_burn.MIN_N and min(asked) >= device_burn.MIN_N
    assert (n, count) == (2048, 5)


@pytest.mark.parametrize("target", [0.0, -1.0, float("nan")])
def test_a_target_that_is_not_positive_is_refused(target):
    with pytest.raises(ValueError, match="positive target"):
        device_burn.choose(target, H200.__getitem__)


@pytest.mark.parametrize("bad", [0.0, float("nan"), -0.1])
def test_a_product_time_that_is_not_positive_is_refused(bad):
    with pytest.raises(ValueError, match="measured"):
        device_burn.choose(1.0, lambda n: bad)


def test_on_a_gpu_the_planted_burn_takes_what_was_asked():
    """Real products on the device: a burn asked for 0.27 ms (5 % of a 5.4 ms decode step) and one for 7 ms take
    that long on the device, timed behind a spin and timed from an idle device (products of MIN_N or more run
    back to back either way)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU: the burn is device work")
    from perfgate.workloads import timing

    def event_span_ms(fn):
        return timing.time_call(fn, timing.DEVICE)[1] * 1e3

    device = torch.cuda.current_device()
    for target in (0.27, 7.0):
        burn = device_burn.calibrate([target * 20], 0.05, device)
        assert burn.target_ms == pytest.approx(target)
        assert burn.device_ms == pytest.approx(target, rel=0.15), (burn.n, burn.count)
        torch.cuda._sleep(device_burn.SPIN_CYCLES)
        queued = event_span_ms(burn.run)
        torch.cuda.synchronize()
        idle = event_span_ms(burn.run)
        assert queued == pytest.approx(burn.device_ms, rel=0.15)
        assert idle == pytest.approx(burn.device_ms, rel=0.25), "the products are launch-bound from an idle device"
