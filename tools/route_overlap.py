#!/usr/bin/env python3
"""Expert-cache analysis of a routing trace: the seed's route_overlap.

    python tools/route_overlap.py route.jsonl
    python tools/route_overlap.py route.txt --capacities 256,512,1024,2048,4096 --json overlap.json
    python tools/route_overlap.py --synthetic zipf1-reuse0.6            # no trace at hand: a generated one
    python tools/route_overlap.py route.jsonl --layer-miss-ms 7.6 --expert-miss-ms 2.5

Trace format (JSONL or text, documented in perfgate/workloads/offload/cache_sim.py):
    {"token": 0, "layer": 3, "experts": [12, 40, 7, 99, 1, 5, 230, 64]}
    0 3 12 40 7 99 1 5 230 64

Prints hit rates of LRU, Belady (the ceiling), the best static pin and admit-after-N at each
capacity (slots shared by all layers), the first-touch bound, reuse distributions, and U(k) -
how many reads k tokens decoded together would save. With --layer-miss-ms / --expert-miss-ms
(from tools/model_storage_probe.py) it adds the predicted decode rate at each LRU hit rate.
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

from rich.console import Console
from rich.table import Table

from perfgate.workloads.offload.cache_sim import TraceFormatError, analyze, load_trace
from perfgate.workloads.offload.decode_model import DecodeModel


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("trace", nargs="?", type=Path, help="routing trace (JSONL or text)")
    ap.add_argument("--synthetic", help="analyse a generated trace instead: zipfS-reuseR (e.g. zipf1-reuse0.6)")
    ap.add_argument("--capacities", help="cache slots to evaluate (default: 1/32 .. all of the distinct experts)")
    ap.add_argument("--admit-n", type=int, default=2, help="admit-after-N: cache an expert from its N-th request on")
    ap.add_argument("--k-list", default="1,2,4,8", help="token window sizes for U(k)")
    ap.add_argument("--layer-miss-ms", type=float, help="measured time to read k missed experts of a layer")
    ap.add_argument("--expert-miss-ms", type=float, help="measured time to read one missed expert")
    ap.add_argument("--compute-ms", type=float, default=0.0, help="compute per layer, for the prediction")
    ap.add_argument("--json", type=Path, help="write the full analysis here ('-' for stdout)")
    args = ap.parse_args(argv)
    if (args.trace is None) == (args.synthetic is None):
        ap.error("give a trace file or --synthetic, not both or neither")
    return args


def _synthetic(label: str):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from fixtures.route_traces import TraceSpec, synthetic_trace

    try:
        z, r = label.split("-")
        # the seed's shape: 48 decoded tokens, 40 MoE layers, 256 experts, k = 8
        spec = TraceSpec(tokens=48, layers=40, experts=256, k=8,
                         zipf_s=float(z.removeprefix("zipf")), reuse=float(r.removeprefix("reuse")))
    except ValueError:
        raise SystemExit(f"--synthetic wants zipfS-reuseR, e.g. zipf1-reuse0.6, not {label!r}") from None
    return synthetic_trace(spec)


def main(argv=None) -> int:
    args = parse_args(argv)
    console = Console(stderr=str(args.json) == "-")
    try:
        trace = _synthetic(args.synthetic) if args.synthetic else load_trace(args.trace)
    except (OSError, TraceFormatError) as exc:
        console.print(f"[red]{exc}[/red]")
        return 2
    caps = _ints(args.capacities) if args.capacities else None
    with console.status(f"simulating {trace.n_requests:,} requests..."):
        res = analyze(trace, caps, admit_n=args.admit_n, k_list=tuple(_ints(args.k_list)))
    console.print(f"{res['tokens']} tokens x {res['layers']} layers: {res['requests']:,} expert requests, "
                  f"{res['distinct']:,} distinct (layer, expert); first-touch bound "
                  f"{res['first_touch_bound']:.1%}; requests to once-used experts {res['singleton_fraction']:.1%}")

    predict = args.layer_miss_ms is not None and args.expert_miss_ms is not None
    k = max(len(ex) for _, _, ex in trace.steps)
    tab = Table(title="hit rate by policy and capacity (slots shared by all layers)")
    cols = ["slots", "LRU", "Belady", "pin (best static)", "pin coverage", f"admit-after-{args.admit_n}"]
    if predict:
        cols.append("LRU tok/s")
    for c in cols:
        tab.add_column(c, justify="right")
    for row in res["policies"]:
        cells = [f"{row['capacity']:,}", f"{row['lru']:.1%}", f"{row['belady']:.1%}", f"{row['pin']:.1%}",
                 f"{row['pin_coverage']:.1%}", f"{row[f'admit{args.admit_n}']:.1%}"]
        if predict:
            m = DecodeModel(res["layers"], k, row["lru"], args.expert_miss_ms / 1e3, args.layer_miss_ms / 1e3,
                            args.compute_ms / 1e3)
            row["predicted_tok_s_lru"] = m.tok_per_s()
            cells.append(f"{m.tok_per_s():.2f}")
        tab.add_row(*cells)
    console.print(tab)

    for key, title in (("stack_distance_hist", "reuse: distinct experts between two uses (LRU hits iff < slots)"),
                       ("token_gap_hist", "reuse: tokens between two uses of an expert")):
        tab = Table(title=title)
        tab.add_column("bucket")
        tab.add_column("requests", justify="right")
        tab.add_column("share", justify="right")
        items = list(res[key].items())
        while items and items[0][1] == 0:  # leading empty buckets say nothing
            items.pop(0)
        for bucket, n in items:
            tab.add_row(bucket, f"{n:,}", f"{n / res['requests']:.1%}")
        console.print(tab)

    tab = Table(title="U(k): distinct experts when k tokens are decoded together")
    for c in ("k", "U(k)", "reads per token", "saving vs k=1"):
        tab.add_column(c, justify="right")
    for kk, u in res["U"].items():
        tab.add_row(kk, f"{u['unique']:.1f}", f"{u['per_token']:.1f}", f"{u['saving']:.1%}")
    console.print(tab)

    if args.json:
        text = json.dumps(res, indent=1)
        if str(args.json) == "-":
            print(text)
        else:
            args.json.write_text(text)
            console.print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
