"""Which carried distributions did vLLM's processes import? (the smallest-set finder)

Run the serving suite with PYTHONPROFILEIMPORTTIME=1: every Python process (the API server,
the engine core, `vllm bench serve`) then writes one `import time:` line per module it
imports into its log. This reads those lines from the given logs, maps each top-level
module to the distribution in SITE (a pip --target folder) that provides it, and prints
the distributions used, with the first module seen and which logs import them, then the
ones nobody imported. A distribution imported only inside `try: ... except ImportError`
counts as used here; the minimal set is then confirmed by serving with it alone.

Usage: python3 dev/gpu/vllm_import_trace.py SITE LOG_OR_DIR [...]   (dirs: every *.log below)
"""
from __future__ import annotations

import re
import sys
from collections import defaultdict
from pathlib import Path

LINE = re.compile(r"^import time:\s+\d+\s+\|\s+\d+\s+\|\s+(\S+)\s*$")


def _module_name(file_name: str) -> str:
    """`x.cpython-312-x86_64-linux-gnu.so`, `x.abi3.so`, `x.py` -> `x`; a package dir stays as is."""
    return re.sub(r"(\.cpython.*|\.abi3)?\.(py|so|pyd)$", "", file_name)


def top_levels(site: Path) -> dict[str, str]:
    """module name -> distribution name, from each .dist-info/RECORD in site.

    Regular packages and single-file modules are keyed by their top-level name; packages
    inside a namespace (``google/api`` of googleapis-common-protos beside the image's
    ``google/protobuf``) by their first two names, so a shared namespace names no owner.
    """
    owner: dict[str, str] = {}
    for record in site.glob("*.dist-info/RECORD"):
        dist = record.parent.name.split("-")[0]
        paths = [row.split(",")[0] for row in record.read_text().splitlines()]
        for path in paths:
            parts = path.split("/")
            if not parts[0] or parts[0].endswith((".dist-info", ".data")) or parts[0] == "..":
                continue
            if len(parts) == 1:
                owner.setdefault(_module_name(parts[0]), dist)
            elif f"{parts[0]}/__init__.py" in paths:
                owner.setdefault(parts[0], dist)
            else:
                owner.setdefault(f"{parts[0]}.{_module_name(parts[1])}", dist)
    return owner


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    site = Path(argv[1])
    owner = top_levels(site)
    logs: list[Path] = []
    for a in argv[2:]:
        p = Path(a)
        logs += sorted(p.rglob("*.log")) if p.is_dir() else [p]
    used: dict[str, set[str]] = defaultdict(set)
    first_module: dict[str, str] = {}
    for log in logs:
        kind = "bench" if "bench" in log.name else "server" if "server" in log.name else log.name
        for line in log.read_text(errors="replace").splitlines():
            m = LINE.match(line)
            if not m:
                continue
            names = m.group(1).split(".")
            dist = owner.get(".".join(names[:2])) or owner.get(names[0])
            if dist:
                used[dist].add(kind)
                first_module.setdefault(dist, m.group(1))
    print(f"# {len(logs)} logs, {len(used)} of {len(set(owner.values()))} distributions in {site} imported")
    for dist in sorted(used, key=str.lower):
        print(f"used   {dist:40s} {','.join(sorted(used[dist])):14s} first module: {first_module[dist]}")
    for dist in sorted(set(owner.values()) - set(used), key=str.lower):
        print(f"unused {dist}")
    return 0 if used else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
