"""Cross-check our read path against fio on the same file, block size and queue depth.

fio is the reference tool for storage benchmarks; if our Python pread loop (`device_probe.stream`) gets
a bandwidth close to fio's under the same access pattern, the numbers in this package measure the
device rather than our harness. The pattern on both sides: random reads, block-aligned offsets
with repeats allowed (fio --norandommap), O_DIRECT, one synchronous read in flight per thread
(fio --ioengine=psync --thread --numjobs=N, i.e. queue depth N), time-based.
"""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path


def fio_path() -> str | None:
    return shutil.which("fio")


def fio_version() -> str | None:
    exe = fio_path()
    if exe is None:
        return None
    return subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=30).stdout.strip()


def fio_command(path: str | Path, block_bytes: int, threads: int, duration_s: float, *, direct: bool = True) -> list[str]:
    return [
        fio_path() or "fio", "--name=perfgate-probe", f"--filename={path}", "--readonly",
        "--rw=randread", f"--bs={block_bytes}", f"--direct={int(direct)}", "--ioengine=psync",
        "--thread", f"--numjobs={threads}", "--group_reporting", "--norandommap", "--randrepeat=0",
        "--time_based", f"--runtime={max(1, round(duration_s * 1000))}ms", "--output-format=json",
    ]


def run_fio(path: str | Path, block_bytes: int, threads: int, duration_s: float = 2.0, *, direct: bool = True) -> dict:
    """Run fio once; returns MB/s, IOPS, completion-latency percentiles (ms) and the command."""
    if fio_path() is None:
        raise FileNotFoundError("fio is not installed (Debian/Ubuntu: apt-get install fio)")
    cmd = fio_command(path, block_bytes, threads, duration_s, direct=direct)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 120)
    if proc.returncode != 0:
        raise RuntimeError(f"fio failed ({proc.returncode}): {proc.stderr.strip()[-500:]}\ncommand: {' '.join(cmd)}")
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    rd = data["jobs"][0]["read"]
    pct = rd.get("clat_ns", {}).get("percentile", {})
    return {
        "mbps": rd["bw_bytes"] / 1e6,
        "iops": rd["iops"],
        "clat_median_ms": pct.get("50.000000", 0) / 1e6,
        "clat_p99_ms": pct.get("99.000000", 0) / 1e6,
        "command": " ".join(cmd),
    }
