"""Markers perfgate registers, and what each needs from the machine.

A test whose markers ask for more than the machine has is skipped with a reason naming
what is missing, so `pytest -m 8gpu perf/` on a 2-GPU box says why nothing ran.
"""
from __future__ import annotations

import os
import re

from perfgate.machine import hardware
from perfgate.machine.hardware_id import resolve_hardware_id

MARKERS = {
    "cpu": "runs on any machine (gloo, real files, vllm-cpu); what CI runs",
    "1gpu": "needs 1 GPU",
    "2gpu": "needs 2 GPUs",
    "4gpu": "needs 4 GPUs",
    "8gpu": "needs 8 GPUs",
    "nvlink": "needs NVLink between every pair of GPUs",
    "pcie": "needs GPUs linked over PCIe only (no NVLink)",
    "multinode": "needs a multi-node launch (torchrun --nnodes>1 or srun); see docs/multinode.md",
    "vllm": "needs vLLM (vllm on GPU, vllm-cpu on CPU)",
    "megatron": "needs Megatron-Core and CUDA",
    "triton": "needs Triton (GPU kernels written in it; torch.compile's GPU code)",
    "ssd": "reads real files from the local disk with the page cache dropped",
    "slow": "takes minutes; deselect with -m 'not slow'",
    "gpu_memory": "gpu_memory(gib): needs at least this much memory on each GPU (the case's own estimate)",
}

_GPU_MARKER = re.compile(r"^(\d+)gpu$")


def gpu_memory_gib() -> float | None:
    """The memory of this machine's smallest visible GPU (GiB, as NVML reports it), None without GPUs."""
    sizes = [g.get("memory_gib") for g in hardware.fingerprint()["gpus"]]
    sizes = [s for s in sizes if isinstance(s, (int, float))]
    return min(sizes) if sizes else None


def missing_requirements(marker_names: set[str], gpu_memory_need_gib: float | None = None) -> list[str]:
    """Human-readable list of what this machine lacks for a test with these markers (and, for a
    ``gpu_memory(gib)`` mark, that much memory on each GPU)."""
    missing: list[str] = []
    if gpu_memory_need_gib is not None and hardware.gpu_count() > 0:
        have = gpu_memory_gib()
        if have is not None and have < gpu_memory_need_gib:
            missing.append(f"needs >= {gpu_memory_need_gib:g} GiB of GPU memory, this GPU has {have:g} GiB "
                           f"({resolve_hardware_id()})")
    gpus = None
    for name in sorted(marker_names):
        m = _GPU_MARKER.match(name)
        if m:
            need = int(m.group(1))
            gpus = hardware.gpu_count() if gpus is None else gpus
            if gpus < need:
                hw = resolve_hardware_id()
                missing.append(f"needs {need} GPU{'s' if need > 1 else ''}, this machine ({hw}) has {gpus}")
    if "nvlink" in marker_names and not hardware.has_nvlink():
        missing.append("needs NVLink between GPUs, this machine has "
                       + (hardware.link_class(hardware.fingerprint()["links"]) or "no GPU pairs"))
    if "pcie" in marker_names:
        link = hardware.link_class(hardware.fingerprint()["links"])
        if link != "PCIe":
            missing.append(f"needs GPUs linked over PCIe only, this machine has {link or 'no GPU pairs'}")
    if "vllm" in marker_names and not hardware.has_module("vllm"):
        missing.append("needs vLLM: not installed (GPU: pip install vllm; CPU: scripts/install_vllm_cpu.sh)")
    if "megatron" in marker_names:
        if not hardware.has_module("megatron.core"):
            missing.append("needs Megatron-Core: not installed (pip install 'perfgate[megatron]')")
        if hardware.gpu_count() < 1:
            missing.append("needs CUDA: Megatron-Core's schedules allocate on CUDA, this machine has no GPU")
    if "triton" in marker_names and not hardware.has_module("triton"):
        missing.append("needs Triton: not installed (it comes with PyTorch's CUDA builds: pip install triton)")
    if "multinode" in marker_names and int(os.environ.get("PERFGATE_NNODES", "1")) < 2:
        missing.append("needs a multi-node launch: set PERFGATE_NNODES and run under torchrun/srun "
                       "(docs/multinode.md)")
    return missing
