"""`perfgate fingerprint`: what perfgate sees of this machine, and its hardware id."""
from __future__ import annotations

import json
import os

from rich.console import Console
from rich.table import Table

from perfgate.machine import hardware
from perfgate.machine.hardware_id import check_hardware_id, resolve_hardware_id


def register(sub) -> None:
    p = sub.add_parser("fingerprint", help="print this machine's fingerprint and hardware id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def _mode(value) -> str:
    return "?" if value is None else ("on" if value else "off")


def run(args) -> int:
    # the id is checked as everywhere else (it names a baseline folder): printing `../x` as this
    # machine's id hands a path to whoever copies it into a command. The environment's first, before
    # the slow part.
    if os.environ.get("PERFGATE_HARDWARE_ID"):
        check_hardware_id(os.environ["PERFGATE_HARDWARE_ID"], source="PERFGATE_HARDWARE_ID")
    fp = hardware.fingerprint()
    hw = resolve_hardware_id(detect=lambda: hardware.hardware_id(fp))  # PERFGATE_HARDWARE_ID overrides, as in a run
    if args.json:
        print(json.dumps({"hardware_id": hw, "fingerprint": fp}, indent=1))
        return 0
    console = Console()
    console.print(f"[bold]hardware id:[/] {hw}")
    cpu = fp["cpu"]
    console.print(f"CPU: {cpu['model']}, {cpu['cores']} cores, {cpu['numa_nodes']} NUMA node(s), {cpu['arch']}")
    console.print(f"CPU ISA: {cpu.get('isa')} (torch: {cpu.get('torch_capability') or 'not installed'}); "
                  f"vendor {cpu.get('vendor')}, family {cpu.get('family')} model {cpu.get('model_number')} "
                  f"stepping {cpu.get('stepping')}; {cpu.get('threads_per_core') or '?'} thread(s)/core; "
                  f"clock base {cpu.get('base_mhz') or '?'} max {cpu.get('max_mhz') or '?'} MHz; "
                  f"memory {cpu.get('memory_gib') or '?'} GiB")
    console.print("CPU features: " + (" ".join(cpu.get("isa_features") or []) or "none seen"))
    for d in fp["disks"]:
        console.print(f"disk: {d['name']} {d['model'] or ''} {d['size_gib']} GiB "
                      f"{'rotational' if d['rotational'] else 'non-rotational'}")
    if fp["gpus"]:
        t = Table(title="GPUs")
        for col in ("#", "name", "memory GiB", "PCI bus", "power W (default)", "app clocks SM/mem MHz (default)",
                    "max SM/mem MHz", "MIG", "ECC", "PCIe max"):
            t.add_column(col)
        for g in fp["gpus"]:
            t.add_row(str(g["index"]), g["name"], str(g["memory_gib"]), g["pci_bus_id"],
                      f"{g.get('power_limit_w')} ({g.get('power_default_w')})",
                      f"{g.get('app_clock_sm_mhz')}/{g.get('app_clock_mem_mhz')} "
                      f"({g.get('default_app_clock_sm_mhz')}/{g.get('default_app_clock_mem_mhz')})",
                      f"{g.get('max_clock_sm_mhz')}/{g.get('max_clock_mem_mhz')}",
                      _mode(g.get("mig")), _mode(g.get("ecc")),
                      f"gen{g.get('pcie_max_gen')} x{g.get('pcie_max_width')}")
        console.print(t)
        links = Table(title="links (NV# = NVLink count; PIX/PXB/PHB/NODE/SYS = PCIe path)")
        links.add_column("")
        for i in range(len(fp["links"])):
            links.add_column(f"GPU{i}")
        for i, row in enumerate(fp["links"]):
            links.add_row(f"GPU{i}", *row)
        console.print(links)
    else:
        console.print("GPUs: none visible (NVML unavailable or no devices)")
    sw = fp["software"]
    console.print("software: " + ", ".join(f"{k} {v}" for k, v in sw.items() if v))
    return 0
