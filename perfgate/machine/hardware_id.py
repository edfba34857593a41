"""The one check every hardware id passes before perfgate uses it, and the one place that
picks the id a session measures under.

A hardware id names a folder under the baselines root (``baselines/<hardware-id>/``), so
an unchecked id is a path: ``../../x`` or ``/abs/dir`` would read and write outside the
tree. Ids come in from the command line (``--perf-hardware-id``, ``--hardware-id``), the
environment (``PERFGATE_HARDWARE_ID``), results files and the names of baseline folders;
each of those calls :func:`check_hardware_id` with where the value came from, so the one
line a user sees names the source, the value and the rule. Which of option, environment and
detection applies is :func:`resolve_hardware_id`'s alone (the plugin, `perfgate fingerprint`,
the skip reasons of GPU markers). What an id says (family, variant, size) is read back by
:func:`parse_hardware_id` alone.
"""
from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass
from typing import Callable

from perfgate.machine import cpu_info

ENV = "PERFGATE_HARDWARE_ID"

# Conservative on purpose: letters, digits and . _ + - only (no separators, no spaces),
# starting with a letter or digit, at most 80 characters; ``..`` is refused separately.
HARDWARE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,79}$")

_RULE = ("use 1-80 letters, digits, '.', '_', '+' or '-', starting with a letter or digit, "
         "with no '/' and no '..' (e.g. 2xH200-NV18 or cpu-AMD-EPYC-2c)")


class HardwareIdError(ValueError):
    """A hardware id that cannot safely name a baseline folder; the message names its source."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def check_hardware_id(value: str, *, source: str) -> str:
    """Return ``value`` if it is a valid hardware id, else raise HardwareIdError naming ``source``."""
    if not isinstance(value, str):
        raise HardwareIdError(f"{source}: hardware id must be a string, got {_shown(value)}; {_RULE}")
    if not HARDWARE_ID_PATTERN.fullmatch(value) or ".." in value:
        raise HardwareIdError(f"{source}: {_shown(value)} is not a valid hardware id: {_RULE}")
    return value


def resolve_hardware_id(option: str | None = None, *, option_source: str = "--perf-hardware-id",
                        detect: Callable[[], str] | None = None) -> str:
    """The id to measure under, checked and naming where it came from: the command-line ``option``
    if given, else ``PERFGATE_HARDWARE_ID``, else the id derived from this machine's fingerprint."""
    if option is not None:
        return check_hardware_id(option, source=option_source)
    if os.environ.get(ENV):
        return check_hardware_id(os.environ[ENV], source=ENV)
    if detect is None:
        from perfgate.machine import hardware  # the fingerprint may ask torch and NVML: only when needed

        detect = hardware.hardware_id
    return check_hardware_id(detect(), source="detected hardware id (perfgate fingerprint)")


# The grammar of the ids perfgate.machine.hardware.hardware_id derives, read back by :func:`parse_hardware_id`:
#   cpu-<model words>[-<isa>]-<cores>c                     cpu-AMD-EPYC-avx512-2c (no ISA before it was recorded)
#   <count>x<model>[-<NV#|PCIe>][-<setting>...]            2xH200-NV18-pl500W, 1xH100-80GB-HBM3, 8xV100-PCIE-32GB-PCIe
CPU_ID_PREFIX = "cpu-"
_CPU_ID = re.compile(r"^cpu-(?P<model>.+?)(?:-(?P<isa>" + "|".join(
    cpu_info.ISA_LEVELS + cpu_info.ARM_ISA_LEVELS + (cpu_info.UNKNOWN_ISA,)) + r"))?-(?P<cores>\d+)c$")
# a GPU's settings other than its defaults (perfgate.machine.gpu_info.variant_tags), in any order
_SETTINGS = re.compile(r"^(?P<base>.+?)(?P<tags>(?:-(?:pl\d+W|sm\d+|mem\d+|mig|eccoff))*)$")
_GPUS = re.compile(r"^(?P<count>\d+)x(?P<model>.+?)(?:-(?P<link>NV\d+|PCIe))?$")


@dataclass(frozen=True)
class HardwareIdParts:
    """What an id says. Ids of one family are the same hardware model and size in another setting:
    ``cpu-AMD-EPYC-avx2-2c`` and ``cpu-AMD-EPYC-avx512-2c`` are the family ``cpu-AMD-EPYC-2c`` with
    variants ``avx2`` and ``avx512``; ``1xH200-pl500W`` is the family ``1xH200``, variant ``pl500W``.
    An id a user chose (``lab-B``) is its own family, of no known size."""

    family: str
    variant: str | None          # the ISA level of a CPU id (isaunknown before it was part of the id), or a
    #                              GPU id's settings joined by "-"; None for a GPU at its defaults
    is_cpu: bool = False
    cpu_cores: int | None = None
    gpu_count: int | None = None
    gpu_model: str | None = None  # "H200", "H100-80GB-HBM3", "A100+H100" for mixed cards
    interconnect: str = ""        # "NV18" (every pair on NVLink, the fewest links) or "PCIe"; "" for one GPU


@functools.lru_cache(maxsize=1024)
def parse_hardware_id(hardware_id: str) -> HardwareIdParts:
    """The one reader of a hardware id's parts (family and variant, CPU cores, GPU count, model and
    interconnect); every rule that compares ids (baseline and tolerance fallbacks, the refresh's check of
    which machine measured a run) reads them here."""
    m = _CPU_ID.match(hardware_id)
    if m:
        return HardwareIdParts(family=f"cpu-{m['model']}-{m['cores']}c", variant=m["isa"] or cpu_info.UNKNOWN_ISA,
                               is_cpu=True, cpu_cores=int(m["cores"]))
    if hardware_id.startswith(CPU_ID_PREFIX):  # a CPU id of another shape (written by hand): no size known
        return HardwareIdParts(family=hardware_id, variant=None, is_cpu=True)
    s = _SETTINGS.match(hardware_id)
    base, variant = s["base"], s["tags"][1:] or None
    g = _GPUS.match(base)
    if not g:
        return HardwareIdParts(family=base, variant=variant)
    count, model, link = int(g["count"]), g["model"], g["link"] or ""
    if count == 1 and link:  # one GPU has no interconnect: the word is the model's
        model, link = f"{model}-{link}", ""
    return HardwareIdParts(family=base, variant=variant, gpu_count=count, gpu_model=model, interconnect=link)
