"""What each GPU is set to, as far as performance goes: power limit, clocks, MIG, ECC, PCIe link.

An H200 capped at 500 W or with lowered application clocks is another machine for performance
purposes, although NVML calls it the same name. `query_device` asks NVML (the only impure
function here, and it never creates a CUDA context); `device_facts` turns its answers into the
fingerprint's per-GPU table and is pure, so tests feed answers of any machine; `variant_tags`
names what departs from the card's defaults, for the hardware id.
"""
from __future__ import annotations

from typing import Any, Callable


def _ask(fn: Callable[[], Any]) -> Any:
    """NVML answer, or None where the device or driver does not support the query."""
    try:
        return fn()
    except Exception:
        return None


def query_device(nvml, handle) -> dict[str, Any]:
    """The raw NVML answers for one device (units as NVML gives them: mW, MHz, bytes)."""
    sm, mem = nvml.NVML_CLOCK_SM, nvml.NVML_CLOCK_MEM
    return {
        "power_limit_mw": _ask(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle)),
        "power_default_mw": _ask(lambda: nvml.nvmlDeviceGetPowerManagementDefaultLimit(handle)),
        "app_clock_sm": _ask(lambda: nvml.nvmlDeviceGetApplicationsClock(handle, sm)),
        "app_clock_mem": _ask(lambda: nvml.nvmlDeviceGetApplicationsClock(handle, mem)),
        "default_app_clock_sm": _ask(lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(handle, sm)),
        "default_app_clock_mem": _ask(lambda: nvml.nvmlDeviceGetDefaultApplicationsClock(handle, mem)),
        "max_clock_sm": _ask(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, sm)),
        "max_clock_mem": _ask(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, mem)),
        "mig_mode": _ask(lambda: nvml.nvmlDeviceGetMigMode(handle)),
        "ecc_mode": _ask(lambda: nvml.nvmlDeviceGetEccMode(handle)),
        "pcie_max_gen": _ask(lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(handle)),
        "pcie_max_width": _ask(lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(handle)),
        "pcie_gen": _ask(lambda: nvml.nvmlDeviceGetCurrPcieLinkGeneration(handle)),
        "pcie_width": _ask(lambda: nvml.nvmlDeviceGetCurrPcieLinkWidth(handle)),
    }


def _watts(mw: Any) -> float | None:
    return round(mw / 1000, 1) if isinstance(mw, (int, float)) else None


def _current_mode(answer: Any) -> bool | None:
    """NVML returns (current, pending) for MIG and ECC modes; 1 is enabled."""
    if isinstance(answer, (tuple, list)) and answer:
        answer = answer[0]
    return bool(answer) if isinstance(answer, int) else None


def device_facts(answers: dict[str, Any]) -> dict[str, Any]:
    """Per-GPU fingerprint fields from `query_device`'s answers (pure).

    The PCIe link is recorded as its maximum (what the slot and card negotiate at load):
    the current generation drops to 1 when the card idles, which says nothing."""
    return {
        "power_limit_w": _watts(answers.get("power_limit_mw")),
        "power_default_w": _watts(answers.get("power_default_mw")),
        "app_clock_sm_mhz": answers.get("app_clock_sm"),
        "app_clock_mem_mhz": answers.get("app_clock_mem"),
        "default_app_clock_sm_mhz": answers.get("default_app_clock_sm"),
        "default_app_clock_mem_mhz": answers.get("default_app_clock_mem"),
        "max_clock_sm_mhz": answers.get("max_clock_sm"),
        "max_clock_mem_mhz": answers.get("max_clock_mem"),
        "mig": _current_mode(answers.get("mig_mode")),
        "ecc": _current_mode(answers.get("ecc_mode")),
        "pcie_max_gen": answers.get("pcie_max_gen"),
        "pcie_max_width": answers.get("pcie_max_width"),
        "pcie_gen_now": answers.get("pcie_gen"),
        "pcie_width_now": answers.get("pcie_width"),
    }


def variant_tags(gpu: dict[str, Any]) -> list[str]:
    """What departs from the card's defaults, as id parts: ``pl500W`` (power limit other than the
    default), ``sm1500``/``mem2619`` (application clocks other than the defaults), ``mig`` (MIG on),
    ``eccoff`` (ECC off where the card has it). Empty for a card as it ships: its id is unchanged.

    Fields NVML did not answer (or a fingerprint from before they were recorded) add nothing."""
    tags = []
    limit, default = gpu.get("power_limit_w"), gpu.get("power_default_w")
    if limit is not None and default is not None and abs(limit - default) >= 1:
        tags.append(f"pl{round(limit)}W")
    for clock in ("sm", "mem"):
        now, dflt = gpu.get(f"app_clock_{clock}_mhz"), gpu.get(f"default_app_clock_{clock}_mhz")
        if now is not None and dflt is not None and now != dflt:
            tags.append(f"{clock}{now}")
    if gpu.get("mig"):
        tags.append("mig")
    if gpu.get("ecc") is False:
        tags.append("eccoff")
    return tags
