"""What the CPU is, as far as performance goes: parsed from /proc/cpuinfo text and sysfs values.

Why a module of its own: two cloud VMs can both call themselves "AMD EPYC" with 2 cores
while one runs AVX-512 kernels and the other AVX2 ones -- a 26x serving TTFT difference was
measured between two such machines of one workplace (issue 16). The parsing functions are
pure (they take the text and the numbers), so tests feed both kinds of machine; the readers
at the bottom are the only code that touches /proc, /sys or torch.
"""
from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from typing import Any

# ISA levels, weakest first. The level decides which vectorised kernels torch/oneDNN/vLLM run.
ISA_LEVELS = ("base", "sse4", "avx2", "avx512", "amx")
ARM_ISA_LEVELS = ("neon", "sve")
UNKNOWN_ISA = "isaunknown"

# Extensions that pick other kernels inside one level (bf16/int8 dot products, AMX tiles, fp16).
# Stored and compared, not part of the id.
_FEATURES = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni", "avx512_bf16",
             "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8", "amx_fp16",
             "asimd", "sve", "sve2", "bf16", "i8mm", "asimddp")


def parse_cpuinfo(text: str) -> dict[str, Any]:
    """The fields of /proc/cpuinfo that matter, from its text (x86 and aarch64 layouts).

    Only the first processor block is read for the model fields; processors are counted."""
    blocks = [b for b in re.split(r"\n\s*\n", text.strip()) if b.strip()]
    first: dict[str, str] = {}
    for block in blocks[:1]:
        for line in block.splitlines():
            if ":" in line:
                key, value = line.split(":", 1)
                first.setdefault(key.strip(), value.strip())
    processors = sum(1 for b in blocks if re.search(r"^processor\s*:", b, re.M))
    flags = set((first.get("flags") or first.get("Features") or "").split())
    physical = {m.group(1) for m in re.finditer(r"^physical id\s*:\s*(\S+)", text, re.M)}

    def number(key: str, base: int = 10) -> int | None:
        value = first.get(key)
        try:
            return int(value, base) if value is not None else None
        except ValueError:
            return None

    siblings, cores = number("siblings"), number("cpu cores")
    return {
        "vendor": first.get("vendor_id") or _arm_vendor(first.get("CPU implementer")),
        "model_name": first.get("model name") or first.get("Model name") or first.get("Hardware"),
        "family": number("cpu family"),
        "model_number": number("model") if "model" in first else number("CPU part", 16),
        "stepping": number("stepping") if "stepping" in first else number("CPU variant", 16),
        "microcode": first.get("microcode"),
        "processors": processors or None,
        "sockets": len(physical) or None,
        "threads_per_core": (siblings // cores) if siblings and cores else None,
        "mhz_reported": float(first["cpu MHz"]) if first.get("cpu MHz") else None,
        "flags": flags,
    }


def _arm_vendor(implementer: str | None) -> str | None:
    names = {"0x41": "ARM", "0x48": "HiSilicon", "0x4e": "NVIDIA", "0x51": "Qualcomm", "0xc0": "Ampere",
             "0x61": "Apple"}
    return names.get((implementer or "").lower(), implementer)


def isa_level(flags: set[str], arch: str) -> str:
    """The vector ISA level kernels will use, from the CPU flags, named as in the hardware id.

    x86 levels follow torch's dispatch rule (ATen DispatchStub): AVX512 needs avx512 f/bw/vl/dq
    and FMA, AVX2 needs avx2 and FMA; AMX (Sapphire Rapids and later) is a level above."""
    if arch in ("aarch64", "arm64"):
        return "sve" if "sve" in flags else "neon"
    if {"amx_tile", "amx_bf16"} <= flags and {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        return "amx"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq", "fma"} <= flags:
        return "avx512"
    if {"avx2", "fma"} <= flags:
        return "avx2"
    if "sse4_2" in flags:
        return "sse4"
    return "base" if flags else UNKNOWN_ISA


def isa_features(flags: set[str]) -> list[str]:
    return sorted(f for f in _FEATURES if f in flags)


def parse_meminfo_gib(text: str) -> float | None:
    m = re.search(r"^MemTotal:\s*(\d+)\s*kB", text, re.M)
    return round(int(m.group(1)) / 2**20, 1) if m else None


def model_words(model_name: str | None) -> str:
    """"AMD EPYC 7B13 64-Core Processor" -> "AMD-EPYC-7B13"; "Intel(R) Xeon(R) Platinum 8481C CPU @
    2.70GHz" -> "Intel-Xeon-Platinum": the first three words, trademarks and clock dropped."""
    words = re.sub(r"\(R\)|\(TM\)|\bCPU\b|\bProcessor\b|@.*$", " ", model_name or "").split()
    words = [re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9.]+", "-", w)).strip("-.") for w in words[:3]]
    return "-".join(w for w in words if w) or "unknown"


def nominal_mhz(model_name: str | None) -> float | None:
    """The base clock an Intel model name states ("@ 2.70GHz"); AMD names state none."""
    m = re.search(r"@\s*([0-9.]+)\s*GHz", model_name or "")
    return round(float(m.group(1)) * 1000) if m else None


def cpu_facts(cpuinfo_text: str, *, arch: str, cores: int, numa_nodes: int, memory_gib: float | None,
              base_mhz: float | None = None, max_mhz: float | None = None,
              torch_capability: str | None = None) -> dict[str, Any]:
    """The fingerprint's ``cpu`` table from the raw answers (pure: tests feed any machine).

    ``cores`` is what this process may run on (affinity), i.e. what a workload gets."""
    info = parse_cpuinfo(cpuinfo_text)
    flags = info.pop("flags")
    return {
        "model": info["model_name"] or "unknown",
        "vendor": info["vendor"],
        "family": info["family"],
        "model_number": info["model_number"],
        "stepping": info["stepping"],
        "microcode": info["microcode"],
        "isa": isa_level(flags, arch),
        "isa_features": isa_features(flags),
        "torch_capability": torch_capability,
        "cores": cores,
        "processors": info["processors"],
        "sockets": info["sockets"],
        "threads_per_core": info["threads_per_core"],
        "base_mhz": base_mhz or nominal_mhz(info["model_name"]),
        "max_mhz": max_mhz,
        "mhz_reported": info["mhz_reported"],
        "memory_gib": memory_gib,
        "numa_nodes": numa_nodes,
        "arch": arch,
    }


# ---- readers: the only impure part ----------------------------------------------------------

def read_text(path: str) -> str:
    try:
        with open(path) as fh:
            return fh.read()
    except OSError:
        return ""


def sysfs_mhz(name: str) -> float | None:
    """cpufreq's base_frequency / cpuinfo_max_freq of cpu0 in MHz; None on VMs without cpufreq."""
    text = read_text(f"/sys/devices/system/cpu/cpu0/cpufreq/{name}").strip()
    return round(int(text) / 1000) if text.isdigit() else None


TORCH_CACHE_ENV = "PERFGATE_TORCH_CPU_CAPABILITY"


def torch_cpu_capability(timeout: float = 60.0, python: str | None = None) -> str | None:
    """torch.backends.cpu.get_cpu_capability(), or None where torch is not installed.

    Asked in a child process unless torch is already imported here: importing torch into the
    pytest process costs seconds and memory and changes what later forks inherit. The answer
    is kept in an environment variable so xdist workers and child processes do not ask again.

    ``python``: another interpreter's torch (a `perfgate ab` side's venv), asked once per
    interpreter; `ab` hands the answer to each of that side's runs in the same variable, which
    spares every run of an A/B the child's torch import (1.8 s on 2 CPU cores)."""
    if python is not None and os.path.abspath(python) != os.path.abspath(sys.executable):
        return _asked_in_child(os.path.abspath(python), timeout)
    cached = os.environ.get(TORCH_CACHE_ENV)
    if cached is not None:
        return cached or None
    answer = None
    if "torch" in sys.modules:
        try:
            answer = str(sys.modules["torch"].backends.cpu.get_cpu_capability())
        except Exception:
            answer = None
    else:
        answer = _asked_in_child(sys.executable, timeout)
    os.environ[TORCH_CACHE_ENV] = answer or ""
    return answer


@functools.lru_cache(maxsize=None)
def _asked_in_child(python: str, timeout: float) -> str | None:
    try:
        out = subprocess.run([python, "-c", "import torch; print(torch.backends.cpu.get_cpu_capability())"],
                             capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None
