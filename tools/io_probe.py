#!/usr/bin/env python3
"""Probe the storage under a MoE model file: the seed's io_probe, plus expert and layer reads.

    python tools/io_probe.py --model /models/Qwen3-30B-A3B-Q4_K_M.gguf
    python tools/io_probe.py --model M.gguf --direct --threads 1,4,16 --json probe.json
    python tools/io_probe.py --file /data/big.bin --block-bytes 1966080     # any file, no experts

Tables (rich): random reads of one block (default: the file's gate segment) at each thread count
with the page cache dropped per round (median / mean / p90 / p99 ms, MB/s); 4 KiB reads
(latency, IOPS); and for a GGUF model one expert as 3 sequential vs 3 parallel preads and one
layer of k missed experts at several I/O pool sizes, with parallel/sequential ratios and the
predicted decode rate at a given hit rate. Same code as perf/offload (perfgate.workloads.offload).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

try:
    import perfgate  # noqa: F401
except ImportError:  # run from a checkout without `pip install -e .`
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
from rich.console import Console
from rich.table import Table

from perfgate.workloads.offload.decode_model import DecodeModel
from perfgate.workloads.offload.expert_reads import ExpertReader, ReadSpec
from perfgate.workloads.offload.gguf_layout import GGUFLayoutError, read_expert_layout
from perfgate.workloads.offload.device_probe import DeviceProbe, summarize_rounds
from perfgate.workloads.offload.page_cache import direct_io_supported, page_cache_droppable


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", type=Path, help="GGUF MoE model file (expert layout read from it)")
    src.add_argument("--file", type=Path, help="any large file: device probe only")
    ap.add_argument("--block-bytes", type=int, help="read size for the device probe (default: gate segment, or 589824)")
    ap.add_argument("--threads", default="1,2,4,8,12,16", help="thread counts for the device probe")
    ap.add_argument("--reads", type=int, default=64, help="random reads per round (default 64, as the seed)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per cell, cache dropped before each")
    ap.add_argument("--direct", action="store_true", help="O_DIRECT instead of buffered reads + DONTNEED")
    ap.add_argument("--k", type=int, help="missed experts per layer (default: the file's expert_used_count, or 8)")
    ap.add_argument("--pools", default="8,16,24,32", help="I/O pool sizes for parallel layer reads")
    ap.add_argument("--split", default="1,2,4", help="chunks per segment to try for parallel layer reads")
    ap.add_argument("--samples", type=int, default=30, help="samples per expert/layer strategy")
    ap.add_argument("--hit-rate", type=float, default=0.70, help="hit rate for the decode prediction")
    ap.add_argument("--layers", type=int, help="MoE layers per token (default: the file's)")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="compute per layer for the decode prediction")
    ap.add_argument("--json", type=Path, help="write every number (and raw samples) here")
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args(argv)


def device_tables(path: Path, block: int, args, console: Console, out: dict) -> None:
    threads = _ints(args.threads)
    with DeviceProbe(path, direct=args.direct, seed=args.seed) as probe:
        rows = []
        with console.status("device probe...") as status:
            for t in threads:
                status.update(f"device probe: {block:,} B x {args.reads} reads at {t} threads")
                rows.append(summarize_rounds([probe.round(t, block, args.reads) for _ in range(args.rounds)]))
            small = []
            for t in (1, 16):
                status.update(f"4 KiB reads at {t} threads")
                small.append(summarize_rounds([probe.round(t, 4096, 256) for _ in range(args.rounds)]))
    tab = Table(title=f"random {block:,} B reads, {'O_DIRECT' if args.direct else 'page cache dropped per round'}")
    for col in ("threads", "median ms", "mean ms", "p90 ms", "p99 ms", "aggregate MB/s"):
        tab.add_column(col, justify="right")
    for r in rows:
        tab.add_row(str(r["threads"]), f"{r['median_ms']:.2f}", f"{r['mean_ms']:.2f}", f"{r['p90_ms']:.2f}",
                    f"{r['p99_ms']:.2f}", f"{r['aggregate_mbps']:,.0f}")
    console.print(tab)
    tab = Table(title="4 KiB random reads")
    for col in ("threads", "median us", "p99 us", "IOPS"):
        tab.add_column(col, justify="right")
    for r in small:
        tab.add_row(str(r["threads"]), f"{r['median_ms'] * 1e3:.0f}", f"{r['p99_ms'] * 1e3:.0f}", f"{r['iops']:,.0f}")
    console.print(tab)
    out["device"] = rows
    out["small_reads"] = small


def expert_tables(layout, args, console: Console, out: dict) -> None:
    k = args.k or layout.expert_used_count or 8
    n_layers = args.layers or len(layout.layers)
    specs = {"expert sequential": ReadSpec("sequential"), "expert parallel": ReadSpec("parallel"),
             f"layer sequential ({k} threads)": ReadSpec("sequential", k=k, threads=k)}
    for p in _ints(args.pools):
        specs[f"layer parallel ({p} threads)"] = ReadSpec("parallel", k=k, threads=p)
    for s in _ints(args.split):
        if s > 1:
            specs[f"layer parallel ({3 * k} threads, split {s})"] = ReadSpec("parallel", k=k, threads=3 * k, split=s)
    with ExpertReader(layout, direct=args.direct, seed=args.seed, max_k=k) as reader, \
            console.status(f"expert reads: {len(specs)} strategies x {args.samples} samples, interleaved"):
        reader.sample(specs[f"layer sequential ({k} threads)"])
        got = reader.interleaved(specs, args.samples)
        nbytes = {name: reader.bytes_of(s) for name, s in specs.items()}
    med = {name: float(np.median(v)) for name, v in got.items()}
    seq_ref = {"expert": med["expert sequential"], "layer": med[f"layer sequential ({k} threads)"]}
    tab = Table(title=f"cold reads of experts ({'O_DIRECT' if args.direct else 'cache dropped per sample'}), "
                      f"expert = {layout.expert_bytes:,} B in 3 segments")
    for col in ("strategy", "median ms", "p90 ms", "p99 ms", "MB/s", "vs sequential"):
        tab.add_column(col, justify="right" if col != "strategy" else "left")
    rows = []
    for name, v in got.items():
        arr = np.array(v) * 1e3
        ref = seq_ref["expert" if name.startswith("expert") else "layer"]
        row = {"strategy": name, "median_ms": float(np.median(arr)), "p90_ms": float(np.percentile(arr, 90)),
               "p99_ms": float(np.percentile(arr, 99)), "mbps": nbytes[name] / med[name] / 1e6,
               "ratio_vs_sequential": med[name] / ref, "samples_s": v}
        rows.append(row)
        tab.add_row(name, f"{row['median_ms']:.2f}", f"{row['p90_ms']:.2f}", f"{row['p99_ms']:.2f}",
                    f"{row['mbps']:,.0f}", f"{row['ratio_vs_sequential']:.2f}x")
    console.print(tab)
    out["expert_reads"] = rows

    best = min((n for n in med if n.startswith("layer parallel") and "split" not in n), key=med.get)
    models = {
        "sequential segments": DecodeModel(n_layers, k, args.hit_rate, med["expert sequential"],
                                           seq_ref["layer"], args.compute_ms / 1e3),
        f"parallel segments, {best.split('(')[1].rstrip(')')}": DecodeModel(
            n_layers, k, args.hit_rate, med["expert parallel"], med[best], args.compute_ms / 1e3),
    }
    tab = Table(title=f"predicted decode: {n_layers} MoE layers, k = {k}, hit rate {args.hit_rate:.0%}, "
                      f"compute {args.compute_ms} ms/layer")
    for col in ("reads", "I/O ms/layer", "ms/token", "tok/s"):
        tab.add_column(col, justify="right" if col != "reads" else "left")
    for name, m in models.items():
        tab.add_row(name, f"{m.expected_layer_io_s() * 1e3:.2f}", f"{m.token_s() * 1e3:.1f}", f"{m.tok_per_s():.2f}")
    console.print(tab)
    out["decode_prediction"] = {name: m.as_dict() for name, m in models.items()}


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console(stderr=bool(args.json and str(args.json) == "-"))
    path = args.model or args.file
    ok, why = page_cache_droppable(path)
    if not ok and not args.direct:
        console.print(f"[red]{why}[/red]; use --direct or a file on a local disk")
        return 2
    if args.direct:
        ok, why = direct_io_supported(path)
        if not ok:
            console.print(f"[red]{why}[/red]")
            return 2
    out: dict = {"path": str(path), "direct": args.direct}
    layout = None
    if args.model:
        try:
            layout = read_expert_layout(args.model)
        except GGUFLayoutError as exc:
            console.print(f"[red]{exc}[/red]")
            return 2
        console.print(f"{path}: {len(layout.layers)} MoE layers x {layout.n_experts} experts, "
                      f"segments {', '.join(f'{b:,}' for b in layout.segment_bytes)} B "
                      f"({', '.join(layout.layers[0].tensor_type.values())}), k = {layout.expert_used_count}")
        out["layout"] = {"layers": len(layout.layers), "experts": layout.n_experts,
                         "segment_bytes": layout.segment_bytes, "expert_used_count": layout.expert_used_count}
    block = args.block_bytes or (layout.segment_bytes[0] if layout else 589_824)
    device_tables(path, block, args, console, out)
    if layout:
        expert_tables(layout, args, console, out)
    if args.json:
        text = json.dumps(out, indent=1)
        if str(args.json) == "-":
            print(text)
        else:
            args.json.write_text(text)
            console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
