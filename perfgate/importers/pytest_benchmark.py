"""pytest-benchmark JSON (``.benchmarks/<machine>/NNNN_*.json``, ``--benchmark-json``) -> ``time_s``.

Each benchmark's ``fullname`` is its pytest node id, which is perfgate's test id for the same
test (perfgate.benchmark_bridge records ``time_s`` under it), so an imported history is the
baseline the next gated run of the same tests is judged against. Samples: the per-iteration
round times in ``stats.data`` where the file kept them (``--benchmark-json``, or
``--benchmark-save-data``); otherwise the file's median alone, with n = its rounds.
Benchmarks that errored are not in pytest-benchmark's files.
"""
from __future__ import annotations

from pathlib import Path

from perfgate.importers import Imported, ImportedNumber, ImportFormatError, finite, read_json
from perfgate.benchmark_bridge import METRIC
from perfgate.judge.metrics import MAX_MAGNITUDE

TOOL = "pytest-benchmark"
DEFAULT_PATHS: tuple[Path, ...] = ()


def _rounds(value, where: str) -> int:
    """``stats.rounds``: how many rounds the median stands for, a whole number >= 1 (the file's, not ours)."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_MAGNITUDE:
        raise ImportFormatError(f"{where}: {value!r} is not a number of rounds (a whole number >= 1, as "
                                f"pytest-benchmark writes it); the file is damaged there: re-run the benchmark or "
                                f"fix that value")
    return value


def read(paths: list[Path], hardware_id: str | None) -> Imported:
    out = Imported(TOOL)
    for path in paths:
        try:
            doc = read_json(path, TOOL)
            benches = doc["benchmarks"]
            if not isinstance(benches, list):
                raise TypeError("benchmarks is not a list")
        except (ValueError, KeyError, TypeError) as exc:
            raise ImportFormatError(f"{path}: not a pytest-benchmark JSON file ({exc}); write one with "
                                    f"`pytest --benchmark-json=FILE` or `--benchmark-autosave`") from None
        machine = doc.get("machine_info") or {}
        software = {"python": machine.get("python_version"), "pytest-benchmark": doc.get("version")}
        commit = (doc.get("commit_info") or {}).get("id")
        out.when, out.commit = doc.get("datetime") or out.when, commit or out.commit
        for i, b in enumerate(benches):
            where = f"{path}: benchmarks[{i}]"
            try:
                test_id, stats = b["fullname"], b["stats"]
                data = stats.get("data")
                if data:
                    samples = tuple(finite(x, f"{where}.stats.data") for x in data)
                    n = len(samples)
                else:
                    samples = (finite(stats["median"], f"{where}.stats.median"),)
                    n = _rounds(stats["rounds"], f"{where}.stats.rounds")
            except (KeyError, TypeError, AttributeError) as exc:
                raise ImportFormatError(f"{where}: missing or malformed key {exc}; is this file from "
                                        f"pytest-benchmark >= 3?") from None
            out.numbers.append(ImportedNumber(test_id, METRIC, "s", "lower", samples, Path(path).name, n=n,
                                              source=f"{b.get('name', test_id)}: "
                                                     f"{'stats.data' if data else 'stats.median'}",
                                              software=software))
    return out
