"""Test-only mutations: planted performance bugs that prove the gates fire.

A gate that never fails proves nothing. Each mutation here plants one real performance bug in
the code under test (not in the measurement), so that ``tests/test_mutations.py`` can run the
real workload with the bug and assert that the gate's verdict is ``regression``.

Switched on only through one environment variable, never in normal runs::

    PERFGATE_TEST_MUTATION=name[,name...] pytest -m cpu perf/offload/test_expert_reads.py

Workers inherit the variable, so a mutation reaches every rank and the vLLM server. While one is
set, the plugin writes the names into the results document (``test_mutations``) and refuses
``--perf-refresh``; ``perfgate refresh`` refuses such results files: nobody can turn a run with a
planted bug into a baseline. docs/mutations.md has the table of bugs, metrics and tolerances.

The older ``PERFGATE_TEST_COLLECTIVE_SLOWDOWN=k`` (workloads/collectives/ops.py) is the same kind of
knob with a factor; ``collective_repeat`` here is its fixed k = 4 form.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

ENV = "PERFGATE_TEST_MUTATION"
RESULTS_KEY = "test_mutations"  # key of a results document measured with mutations on


@dataclass(frozen=True)
class Mutation:
    name: str
    area: str
    bug: str      # what the planted bug does, as a user would describe the regression
    where: str    # the one place in the code under test that reads it


MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation("collective_repeat", "collectives",
             "every timed gloo/NCCL collective is issued 4 times", "perfgate/workloads/collectives/ops.py"),
    Mutation("sequential_segments", "offload",
             "the three segments of an expert are read one after another by one thread instead of in parallel",
             "perfgate/workloads/offload/expert_reads.py (ExpertReader.plan)"),
    Mutation("probe_ignores_threads", "offload",
             "the device probe reads on one thread whatever thread count it is asked for",
             "perfgate/workloads/offload/device_probe.py (DeviceProbe.round)"),
    Mutation("skewed_stage_split", "training",
             "a 2-chunk pipeline puts 3/4 of the layers on the first stage (6/2 instead of 4/4 at PP=2)",
             "perfgate/workloads/pipeline/layout.py (ParallelLayout.chunk_layers)"),
    Mutation("ddp_no_overlap", "training",
             "DDP waits for each bucket's all-reduce inside backward: no communication/compute overlap",
             "perfgate/workloads/training/ddp.py (counting_hook)"),
    Mutation("serialized_batching", "serving",
             "the vLLM server is started with --max-num-seqs 1: requests are served one at a time",
             "perfgate/workloads/serving/server.py (start_server)"),
    Mutation("gpu_step_slowdown", "training",
             "every GPU training step does a given fraction more device work (gpu_step_slowdown:0.10 = 10 %): "
             "bf16 matrix products on the step's stream, calibrated to the step's device time",
             "perfgate/workloads/training/engine.py (BuiltCase.run_step, perfgate/workloads/device_burn.py)"),
    Mutation("cache_fifo_eviction", "offload",
             "the expert cache (admit-after-N policy) evicts in insertion order instead of least recently used",
             "perfgate/workloads/offload/cache_sim.py (admit_after_hits)"),
)}


class MutationError(ValueError):
    """PERFGATE_TEST_MUTATION names a mutation that does not exist."""


def _parsed(environ=None) -> dict[str, float | None]:
    """``name[:factor],...`` -> {name: factor or None}; raises on a bad factor."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    out: dict[str, float | None] = {}
    for part in (p.strip() for p in raw.split(",")):
        if not part:
            continue
        name, _, value = part.partition(":")
        try:
            out[name.strip()] = float(value) if value else None
        except ValueError:
            raise MutationError(f"{ENV}={raw!r}: factor {value!r} of {name!r} is not a number") from None
        if value and not (0 < out[name.strip()] < 100):
            raise MutationError(f"{ENV}={raw!r}: factor of {name!r} must be in (0, 100)")
    return out


def factor(name: str, environ=None) -> float | None:
    """The factor given with mutation ``name`` (``name:0.1`` -> 0.1), or None when it is off or has none."""
    return _parsed(environ).get(name) if name in active_names(environ) else None


def active_names(environ=None) -> tuple[str, ...]:
    """The mutations switched on, in the order given; raises on an unknown name."""
    raw = (os.environ if environ is None else environ).get(ENV, "")
    names = tuple(_parsed(environ))
    unknown = [n for n in names if n not in MUTATIONS]
    if unknown:
        raise MutationError(f"{ENV}={raw!r}: unknown mutation(s) {unknown}; known: {', '.join(MUTATIONS)} "
                            f"(unset it for a normal run)")
    return names


def active(name: str) -> bool:
    """Whether the code under test should plant bug ``name`` now (read on every call: cheap)."""
    if name not in MUTATIONS:
        raise KeyError(f"no mutation {name!r} in perfgate.mutations.MUTATIONS")
    return name in active_names()


def note() -> str | None:
    """One line for reports and results files, or None when no mutation is set."""
    names = active_names()
    if not names:
        return None
    return (f"{ENV}={','.join(names)}: planted performance bug(s), results are not baselines "
            f"({'; '.join(MUTATIONS[n].bug for n in names)})")


def collective_repeat() -> int:
    """How many times each timed collective is issued (1 normally)."""
    return 4 if active("collective_repeat") else 1
