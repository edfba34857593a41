"""Energy a GPU used inside a region: NVML's cumulative energy counter, read beside the work.

Why a background reader and interpolation: NVML's total-energy counter (Volta and newer, in mJ)
advances in steps: on an H100 (driver 580) it changed every ~100 ms (20 updates in 2 s under a
700 W matrix load). Two plain reads around a 100 ms training step can therefore differ by zero or
by two updates' worth. So a thread reads the counter every ``poll_s`` and keeps the moments it
changed; the energy of any interval is the counter interpolated linearly between the updates
around its two ends. The error is then bounded by the power varying inside one ~100 ms update,
not by the update itself, and every timed step of a case gets an energy sample of its own.

Cost: the reader sleeps between reads and NVML's call releases the GIL, so at the default
10 ms it takes the GIL about 100 times a second for microseconds; it runs only around the
regions that ask for it. It never creates a CUDA context and never touches the device's work.

A machine without NVML, or a GPU whose driver does not keep the counter, gets
:class:`EnergyUnavailable` with the reason; callers record nothing then and say why.
"""
from __future__ import annotations

import bisect
import threading
import time
from typing import Any, Callable


class EnergyUnavailable(RuntimeError):
    """This GPU's energy cannot be read here (no NVML, no counter on this device or driver)."""


def _nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise EnergyUnavailable("nvidia-ml-py (pynvml) is not installed") from exc
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - any NVML failure means: no energy here
        raise EnergyUnavailable(f"NVML did not start: {exc}") from exc
    return pynvml


def nvml_handle(nvml, torch_device) -> Any:
    """The NVML handle of a torch CUDA device, matched by UUID (NVML numbers every GPU of the
    host, CUDA only the visible ones: indexes differ under CUDA_VISIBLE_DEVICES)."""
    import torch

    index = torch_device.index if torch_device.index is not None else torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    if uuid is not None:
        text = str(uuid)
        try:
            return nvml.nvmlDeviceGetHandleByUUID(text if text.startswith("GPU-") else f"GPU-{text}")
        except Exception:  # noqa: BLE001 - fall back to the bus id
            pass
    bus = getattr(torch.cuda.get_device_properties(index), "pci_bus_id", None)
    if bus is not None:
        pci = f"{getattr(torch.cuda.get_device_properties(index), 'pci_domain_id', 0):08X}:" \
              f"{bus:02X}:{getattr(torch.cuda.get_device_properties(index), 'pci_device_id', 0):02X}.0"
        try:
            return nvml.nvmlDeviceGetHandleByPciBusId(pci)
        except Exception:  # noqa: BLE001
            pass
    return nvml.nvmlDeviceGetHandleByIndex(index)


class EnergyMeter:
    """Reads a cumulative energy counter (J) from a thread; :meth:`joules` gives any interval's energy.

    ``read_mj`` is the counter (millijoules, non-decreasing); ``clock`` the time base the caller's
    interval ends use (``time.perf_counter``). Use as a context manager around the regions."""

    def __init__(self, read_mj: Callable[[], int], poll_s: float = 0.010, clock: Callable[[], float] = time.perf_counter):
        if not poll_s > 0:
            raise ValueError(f"poll_s must be positive, got {poll_s!r}")
        self._read, self._poll_s, self._clock = read_mj, poll_s, clock
        self._times: list[float] = []   # when the counter was seen to change (first read included)
        self._mj: list[float] = []      # its value then
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: str | None = None

    @classmethod
    def for_device(cls, torch_device, poll_s: float = 0.010) -> "EnergyMeter":
        nvml = _nvml()
        handle = nvml_handle(nvml, torch_device)
        try:
            first = nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
        except Exception as exc:  # noqa: BLE001
            raise EnergyUnavailable(f"this GPU's driver keeps no energy counter: {exc}") from exc
        if not isinstance(first, int) or first < 0:
            raise EnergyUnavailable(f"NVML's energy counter read {first!r}")
        return cls(lambda: nvml.nvmlDeviceGetTotalEnergyConsumption(handle), poll_s)

    @classmethod
    def for_visible_gpus(cls, poll_s: float = 0.020) -> "EnergyMeter":
        """Every GPU this process may use (CUDA_VISIBLE_DEVICES honoured, matched by UUID), their
        counters summed: a served model can span several GPUs of a process perfgate does not control."""
        from perfgate.machine import hardware

        uuids = [g["uuid"] for g in hardware.fingerprint()["gpus"] if g.get("uuid")]
        if not uuids:
            raise EnergyUnavailable("no GPU with a known UUID is visible here")
        nvml = _nvml()
        try:
            handles = [nvml.nvmlDeviceGetHandleByUUID(u) for u in uuids]
            first = [nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles]
        except Exception as exc:  # noqa: BLE001
            raise EnergyUnavailable(f"this GPU's driver keeps no energy counter: {exc}") from exc
        if any(not isinstance(v, int) or v < 0 for v in first):
            raise EnergyUnavailable(f"NVML's energy counters read {first!r}")
        return cls(lambda: sum(nvml.nvmlDeviceGetTotalEnergyConsumption(h) for h in handles), poll_s)

    def _sample(self) -> None:
        value = float(self._read())
        now = self._clock()
        with self._lock:
            if not self._mj or value != self._mj[-1]:
                if self._mj and value < self._mj[-1]:
                    self.error = f"the energy counter went backwards ({self._mj[-1]:.0f} -> {value:.0f} mJ)"
                self._times.append(now)
                self._mj.append(value)

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self._sample()
                self._stop.wait(self._poll_s)
        except Exception as exc:  # noqa: BLE001 - reported through joules()
            self.error = f"reading the energy counter failed: {exc}"

    def __enter__(self) -> "EnergyMeter":
        self._sample()
        self._thread = threading.Thread(target=self._run, name="perfgate-energy", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def wait_past(self, t: float, timeout_s: float = 2.0) -> bool:
        """Block until the counter has changed after time ``t`` (so ``t`` can be interpolated)."""
        deadline = self._clock() + timeout_s
        while self._clock() < deadline:
            with self._lock:
                if self._times and self._times[-1] > t:
                    return True
            time.sleep(self._poll_s / 2)
        return False

    def _at(self, t: float) -> float | None:
        """The counter (mJ) at time ``t``, linear between the updates around it; None outside them."""
        i = bisect.bisect_right(self._times, t)
        if i == 0 or i == len(self._times):
            return None
        t0, t1 = self._times[i - 1], self._times[i]
        e0, e1 = self._mj[i - 1], self._mj[i]
        return e0 + (e1 - e0) * (t - t0) / (t1 - t0)

    def joules(self, t0: float, t1: float) -> float | None:
        """Energy in J between ``t0`` and ``t1`` (the meter's clock); None where the counter's
        updates do not bracket both ends, or the counter misbehaved (:attr:`error`)."""
        if self.error or not t1 > t0:
            return None
        with self._lock:
            a, b = self._at(t0), self._at(t1)
        if a is None or b is None:
            return None
        return (b - a) / 1000.0

    def joules_each(self, intervals: list[tuple[float, float]]) -> list[float] | None:
        """:meth:`joules` of every interval, waiting for the update after the last one ends; None
        (nothing recorded) unless every interval has a positive energy."""
        if not intervals:
            return None
        self.wait_past(max(t1 for _, t1 in intervals))
        out = [self.joules(t0, t1) for t0, t1 in intervals]
        return out if all(j is not None and j > 0 for j in out) else None
