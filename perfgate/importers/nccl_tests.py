"""nccl-tests stdout (``all_reduce_perf``, ``all_gather_perf``, ...) -> the collectives tests' metrics.

Each ``*_perf`` table row becomes ``time_us`` and ``busbw_gbps`` of
``perf/collectives/test_collectives.py::test_<op>[nccl-<ranks>gpu-<size>]``: the same op,
rank count and size (nccl-tests and perfgate's engine both count ``size`` as the largest
buffer a rank sees and use the same bus-bandwidth factors, perfgate.workloads.collectives.ops). Which
binary is which op is each op's row (``OpDef.nccl_tests``), so a new op's row is all it takes.
The out-of-place columns are taken. perfgate captures sizes up to ``graph_max_bytes`` in a
CUDA graph and runs larger ones eagerly; a row is taken only from a run of the same kind
(``graph: N`` in the header), so a graph-mode size never gets an eager baseline. Several
launches of the same (op, ranks, graph mode) pool, one sample per launch. Left out, with the
reason: rows with wrong elements, sizes no perfgate test has, and the other mode's rows.
``time_over_p2p`` has no nccl-tests counterpart and is not imported.
"""
from __future__ import annotations

import re
from pathlib import Path

from perfgate.importers import Imported, ImportedNumber, ImportFormatError, finite, read_text
from perfgate.workloads.collectives import GPU, size_label
from perfgate.workloads.collectives.ops import OP_DEFS, CollectiveSpec

TOOL = "nccl-tests"
DEFAULT_PATHS: tuple[Path, ...] = ()
TEST = "perf/collectives/test_collectives.py::test_{op}[nccl-{ranks}gpu-{size}]"
GRAPH_MAX_BYTES = CollectiveSpec.__dataclass_fields__["graph_max_bytes"].default
_START = re.compile(r"^# Collective test starting: (\w+)_perf")
_HEADER = re.compile(r"nGpus (\d+) .*graph: (\d+)")
_RANK = re.compile(r"^#\s+Rank\s+\d+ ")


def _blocks(text: str):
    """(op, ranks, graph, [(line number, fields)]) per ``*_perf`` launch in the file."""
    op = None
    for lineno, line in enumerate(text.splitlines(), 1):
        m = _START.match(line)
        if m:
            if op is not None and rows:
                yield op, ranks, graph, rows
            op, ranks, graph, rows = m.group(1), 0, None, []
            continue
        if op is None:
            continue
        h = _HEADER.search(line)
        if h and line.startswith("# nThread"):
            graph = int(h.group(2)) > 0
        elif _RANK.match(line):
            ranks += 1
        elif line.strip() and not line.startswith("#"):
            fields = line.split()
            if len(fields) >= 9 and fields[0].isdigit():
                rows.append((lineno, fields))
    if op is not None and rows:
        yield op, ranks, graph, rows


def read(paths: list[Path], hardware_id: str | None) -> Imported:
    out = Imported(TOOL)
    sizes = {size_label(s) for s in GPU.sizes}
    found = False
    # each op's row names its nccl-tests binary (OpDef.nccl_tests): a new row is imported with no change here
    ops_by_binary = {d.nccl_tests: op for op, d in OP_DEFS.items() if d.nccl_tests}
    for path in paths:
        name = Path(path).name
        for op_name, ranks, graph, rows in _blocks(read_text(path, TOOL)):
            found = True
            op = ops_by_binary.get(f"{op_name}_perf")
            if op is None:
                out.left_out.append((f"{name}: {op_name}_perf", "no perfgate collectives test for this op"))
                continue
            if graph is None or ranks < 1:
                raise ImportFormatError(f"{path}: the {op_name}_perf block has no '# nThread ... graph:' header "
                                        f"or no '#  Rank' lines; pass nccl-tests' whole stdout")
            for lineno, f in rows:
                where = f"{path}:{lineno}"
                size = int(f[0])
                label = size_label(size)
                mode_wanted = size <= GRAPH_MAX_BYTES
                if label not in sizes:
                    out.left_out.append((f"{name}:{lineno} {op_name} {label}", "no perfgate test at this size"))
                    continue
                if graph != mode_wanted:
                    out.left_out.append((f"{name}:{lineno} {op_name} {label}",
                                         f"{'CUDA-graph' if graph else 'eager'} run; perfgate times this size "
                                         f"{'in a CUDA graph' if mode_wanted else 'eagerly'}"))
                    continue
                time_us, busbw, wrong = f[5], f[7], f[8]
                if wrong not in ("0", "N/A"):
                    out.left_out.append((f"{name}:{lineno} {op_name} {label}", f"{wrong} wrong elements"))
                    continue
                test_id = TEST.format(op=op, ranks=ranks, size=label)
                source = f"{name}:{lineno} {op_name}_perf {'graph' if graph else 'eager'} out-of-place"
                out.numbers.append(ImportedNumber(test_id, "time_us", "us", "lower",
                                                  (finite(time_us, f"{where} time"),), name, source=source))
                out.numbers.append(ImportedNumber(test_id, "busbw_gbps", "GB/s", "higher",
                                                  (finite(busbw, f"{where} busbw"),), name, source=source))
    if not found:
        raise ImportFormatError(f"{paths[0] if len(paths) == 1 else 'the files'}: no '# Collective test starting: "
                                f"<op>_perf' block; pass the stdout of nccl-tests' *_perf binaries")
    return out
