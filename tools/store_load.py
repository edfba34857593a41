"""Load test of the PostgreSQL results store (issue 51's acceptance), on a real server started here.

    .venv/bin/python tools/store_load.py            # ~5-10 min on 2 cores; prints the numbers docs/results-store.md quotes

8 writer processes, each its own hardware id, push 100 runs each concurrently; one writer is killed with
SIGKILL mid-run (and started again: it pushes its runs again, those already stored are not stored twice)
and the server is restarted (immediate shutdown) mid-run; writers retry a push the server refused while
down. Then every run each writer reported stored is read back and compared byte for byte, all 800 must be
there, and the store is filled to 10,000 runs to time one push and one series query at that size.
The server listens on 127.0.0.1 only and is stopped by its PID at the end (tests/postgres_server.py).
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

from perfgate.store.backends import StoreUnavailable, documents, open_store  # noqa: E402

WRITERS, RUNS, METRICS, TOTAL = 8, 100, 20, 10_000


def run_bytes(hw: str, i: int) -> bytes:
    """One synthetic run: METRICS results of realistic shape (five samples each)."""
    results = [{"test_id": f"perf/collectives/test_all_reduce.py::test_all_reduce[gloo-2rank-{k}KiB]",
                "area": "collectives", "metric": "busbw_gbps", "unit": "GB/s", "better": "higher", "tol": 0.05,
                "gated": True, "verdict": {"outcome": "pass"}, "tainted": [],
                "summary": {"median": 10.0 + i % 7 + k, "mad": 0.1, "iqr": 0.2, "n": 5,
                            "samples": [9.9 + i % 7 + k, 10.0 + i % 7 + k, 10.0 + i % 7 + k, 10.1 + k, 10.2 + k]}}
               for k in range(METRICS)]
    doc = {"schema_version": 1, "kind": "perfgate-results", "hardware_id": hw, "commit": f"{i:012x}",
           "created": f"2026-12-{1 + i // 1000:02d}T{(i // 60) % 24:02d}:{i % 60:02d}:00+00:00", "fingerprint": {},
           "results": results}
    return json.dumps(doc).encode()


def writer(url: str, hw: str, first: int, count: int) -> None:
    """Push runs first..first+count-1 of ``hw``; print 'stored <sha> <seconds>' after each push returns."""
    store = None
    for i in range(first, first + count):
        raw = run_bytes(hw, i)
        while True:
            try:
                store = store or open_store(url, create=True)
                t = time.perf_counter()
                stored = store.put(raw, f"{hw}/run-{i:05d}.json.gz")
                print(f"stored {stored.entry.sha256} {time.perf_counter() - t:.4f}", flush=True)
                break
            except StoreUnavailable as exc:  # a server restart: one line, retried
                print(f"retry {str(exc)[:120]}", file=sys.stderr, flush=True)
                if store is not None:
                    store.close()
                store = None
                time.sleep(0.5)


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--writer":
        writer(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
        return 0
    import postgres_server

    server = postgres_server.PostgresServer()
    try:
        url = server.new_database("load")
        with open_store(url, create=True):
            pass
        hws = [f"gpu-load-{w}x" for w in range(WRITERS)]

        def start(hw: str) -> subprocess.Popen:
            return subprocess.Popen([sys.executable, __file__, "--writer", url, hw, "0", str(RUNS)],
                                    stdout=subprocess.PIPE, text=True)
        procs = {hw: start(hw) for hw in hws}
        reported: dict[str, set[str]] = {hw: set() for hw in hws}
        push_s: list[float] = []
        killed = restarted = False
        t0 = time.perf_counter()
        while procs:
            for hw, p in list(procs.items()):
                line = p.stdout.readline()
                if not line:
                    p.wait()
                    del procs[hw]
                    continue
                _, sha, seconds = line.split()
                reported[hw].add(sha)
                push_s.append(float(seconds))
                if not killed and hw == hws[0] and len(reported[hw]) == 30:
                    os.kill(p.pid, signal.SIGKILL)  # mid-run, maybe mid-push
                    p.wait()
                    killed = True
                    procs[hw] = start(hw)           # it pushes all its runs again
                if not restarted and sum(map(len, reported.values())) >= 300:
                    server.restart()
                    restarted = True
        wall = time.perf_counter() - t0
        with open_store(url) as store:
            entries = store.entries()
            lost = [sha for hw in hws for sha in reported[hw] if store.entry(sha) is None]
            wrong = [e.name for e in entries
                     if store.raw(e.sha256) != run_bytes(e.hardware_id, int(e.name.split("-")[-1][:5]))]
        print(f"concurrent: {WRITERS} writers x {RUNS} runs ({METRICS} metrics each), one writer killed with SIGKILL "
              f"after 30 runs and restarted, the server restarted after 300 runs: {len(entries)} runs stored, "
              f"{sum(map(len, reported.values()))} reported stored, {len(lost)} of those lost, {len(wrong)} read "
              f"back different; {wall:.1f} s wall; push median {statistics.median(push_s) * 1000:.1f} ms, "
              f"p95 {sorted(push_s)[int(len(push_s) * 0.95)] * 1000:.1f} ms")
        # fill to TOTAL runs (4 writers), then time pushes and series queries at that size
        rest = TOTAL - len(entries) - 50
        fill = [subprocess.Popen([sys.executable, __file__, "--writer", url, f"gpu-fill-{k}x", "0", str(rest // 4)],
                                 stdout=subprocess.DEVNULL) for k in range(4)]
        for p in fill:
            p.wait()
        with open_store(url, create=True) as store:
            at = len(store.entries())
            times = []
            for i in range(50):
                t = time.perf_counter()
                store.put(run_bytes("gpu-load-0x", 50_000 + i), f"gpu-load-0x/late-{i:05d}.json.gz")
                times.append(time.perf_counter() - t)
            q = []
            for k in range(50):
                t = time.perf_counter()
                points = store.series(f"gpu-fill-{k % 4}x", f"perf/collectives/test_all_reduce.py::test_all_reduce"
                                      f"[gloo-2rank-{k % METRICS}KiB]", "busbw_gbps")
                q.append(time.perf_counter() - t)
            print(f"at {at} runs ({at * METRICS} metric rows): push median {statistics.median(times) * 1000:.1f} ms; "
                  f"series query ({len(points)} points) median {statistics.median(q) * 1000:.1f} ms, "
                  f"max {max(q) * 1000:.1f} ms")
        return 1 if lost or wrong or len(entries) != WRITERS * RUNS else 0
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
