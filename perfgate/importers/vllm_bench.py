"""``vllm bench serve --save-result`` JSON -> the concurrency sweep's serving metrics.

A closed-loop run at ``--max-concurrency C`` with ``--request-rate inf`` is what
``perf/serving/test_concurrency_sweep.py::test_concurrency_sweep[<profile>-C=<C>]`` measures
(profile ``cpu`` on cpu-* hardware ids, else ``gpu``); its throughputs and latencies become
that test's ``output_tok_s``, ``request_rps``, ``total_tok_s``, ``ttft_ms``, ``tpot_ms``,
``e2el_ms`` and ``itl_p99_ms``. Per-request TTFTs (``--save-detailed``: ``ttfts``, seconds) are
kept as samples; the other latencies are the file's medians. A run with a request rate or
without a concurrency limit is an open-loop run no test has, and is left out with that reason.
Several files of the same C pool as runs (one sample each). Field names: the keys
perfgate.workloads.serving.vllm_bench reads (``median_ttft_ms``, ``output_throughput``, ...).
"""
from __future__ import annotations

from pathlib import Path

from perfgate.judge.policy import is_cpu_id
from perfgate.importers import Imported, ImportedNumber, ImportFormatError, finite, read_json

TOOL = "vllm bench serve"
DEFAULT_PATHS: tuple[Path, ...] = ()
SWEEP = "perf/serving/test_concurrency_sweep.py::test_concurrency_sweep"

# metric: (JSON key, unit, better)
METRICS = {
    "output_tok_s": ("output_throughput", "tok/s", "higher"),
    "request_rps": ("request_throughput", "req/s", "higher"),
    "total_tok_s": ("total_token_throughput", "tok/s", "higher"),
    "ttft_ms": ("median_ttft_ms", "ms", "lower"),
    "tpot_ms": ("median_tpot_ms", "ms", "lower"),
    "e2el_ms": ("median_e2el_ms", "ms", "lower"),
    "itl_p99_ms": ("p99_itl_ms", "ms", "lower"),
}


def _closed_loop_c(doc: dict) -> int | None:
    rate = doc.get("request_rate")
    c = doc.get("max_concurrency")
    if rate not in (None, "inf", float("inf")) or not isinstance(c, int) or c < 1:
        return None
    return c


def read(paths: list[Path], hardware_id: str | None) -> Imported:
    out = Imported(TOOL)
    profile = "cpu" if is_cpu_id(hardware_id or "") else "gpu"
    for path in paths:
        try:
            doc = read_json(path, TOOL)
            if not isinstance(doc, dict) or "output_throughput" not in doc:
                raise KeyError("output_throughput")
        except (ValueError, KeyError) as exc:
            raise ImportFormatError(f"{path}: not a `vllm bench serve --save-result` JSON file ({exc!r} "
                                    f"missing or unreadable)") from None
        name = Path(path).name
        if doc.get("failed"):
            out.left_out.append((name, f"{doc['failed']} failed request(s): its numbers do not describe the server"))
            continue
        c = _closed_loop_c(doc)
        if c is None:
            out.left_out.append((name, f"request rate {doc.get('request_rate')!r}, max concurrency "
                                       f"{doc.get('max_concurrency')!r}: only closed-loop runs (--max-concurrency C, "
                                       f"no --request-rate) match a perfgate test"))
            continue
        test_id = f"{SWEEP}[{profile}-C={c}]"
        software = {"vllm bench": doc.get("backend"), "model": doc.get("model_id")}
        out.when = doc.get("date") or out.when
        for metric, (key, unit, better) in METRICS.items():
            if key not in doc:
                out.left_out.append((f"{name} {metric}", f"no {key!r} in the file"))
                continue
            samples = (finite(doc[key], f"{path}: {key}"),)
            source = key
            if metric == "ttft_ms" and doc.get("ttfts"):
                samples = tuple(finite(x, f"{path}: ttfts") * 1e3 for x in doc["ttfts"])
                source = "ttfts (per request)"
            out.numbers.append(ImportedNumber(test_id, metric, unit, better, samples, name, source=source,
                                              software=software))
    return out
