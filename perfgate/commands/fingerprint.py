"""`perfgate fingerprint`: what perfgate sees of this machine, and its hardware id."""
from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from perfgate import hardware


def register(sub) -> None:
    p = sub.add_parser("fingerprint", help="print this machine's fingerprint and hardware id")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    fp = hardware.fingerprint()
    hw = hardware.hardware_id(fp)
    if args.json:
        print(json.dumps({"hardware_id": hw, "fingerprint": fp}, indent=1))
        return 0
    console = Console()
    console.print(f"[bold]hardware id:[/] {hw}")
    cpu = fp["cpu"]
    console.print(f"CPU: {cpu['model']}, {cpu['cores']} cores, {cpu['numa_nodes']} NUMA node(s), {cpu['arch']}")
    for d in fp["disks"]:
        console.print(f"disk: {d['name']} {d['model'] or ''} {d['size_gib']} GiB "
                      f"{'rotational' if d['rotational'] else 'non-rotational'}")
    if fp["gpus"]:
        t = Table(title="GPUs")
        for col in ("#", "name", "memory GiB", "PCI bus"):
            t.add_column(col)
        for g in fp["gpus"]:
            t.add_row(str(g["index"]), g["name"], str(g["memory_gib"]), g["pci_bus_id"])
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
