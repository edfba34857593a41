"""Test-only mutations: planted performance bugs that prove the gates fire. One registry.

A gate that never fails proves nothing. Each mutation here plants one real performance bug in
the code under test (not in the measurement), so that ``tests/test_mutations.py`` can run the
real workload with the bug and assert that the gate's verdict is ``regression``.

Every test-only knob is one :class:`Mutation` in :data:`MUTATIONS`, switched on only through
the environment, never in normal runs::

    PERFGATE_TEST_MUTATION=name[:factor][,name[:factor]...] pytest -m cpu perf/...

A mutation with a factor (a graded slowdown) takes ``name:factor``; ``name`` alone uses its
default factor. That variable is the only one: one spelling per knob, one entry per bug. Workers
inherit it, so a mutation reaches every rank and the vLLM server. While any is on, the results document says so
(``test_mutations``), ``pytest --perf-refresh`` is refused and every baseline writer refuses such
results (perfgate.store.baseline_writer): nobody can turn a run with a planted bug into a
baseline. Adding a knob is adding one entry below and reading it with :func:`active` or
:func:`factor` in the code under test. docs/mutations.md has the table of bugs and metrics.
"""
from __future__ import annotations

import math
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
    default_factor: float | None = None  # graded mutations only: the factor of a bare ``name``
    neutral_factor: float = 1.0  # graded: the factor that changes nothing (counts as off); the least allowed
    max_factor: float = math.inf  # graded: factors must lie below this

    @property
    def graded(self) -> bool:
        return self.default_factor is not None


MUTATIONS: dict[str, Mutation] = {m.name: m for m in (
    Mutation("collective_slowdown", "collectives",
             "every timed collective takes k times as long (integer k: issued k times, default 4; fractional "
             "k, CPU only: a wait after each timed call stretches it)", "perfgate/workloads/collectives/ops.py",
             default_factor=4.0),
    Mutation("extra_param_copy", "training",
             "every training worker keeps a full extra copy of the parameters (a memory leak)",
             "perfgate/workloads/training/engine.py (maybe_extra_param_copy)"),
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
    Mutation("ddp_no_sync_ignored", "training",
             "gradient accumulation all-reduces after every micro-batch: DDP.no_sync() is never entered",
             "perfgate/workloads/training/ddp.py (accumulation_step)"),
    Mutation("fsdp_root_wrap", "training",
             "FSDP wraps only the root module instead of each transformer block (one flat parameter)",
             "perfgate/workloads/training/fsdp.py (wraps_blocks)"),
    Mutation("serialized_batching", "serving",
             "the vLLM server is started with --max-num-seqs 1: requests are served one at a time",
             "perfgate/workloads/serving/server.py (start_server)"),
    Mutation("eager_default", "serving",
             "every vLLM server is started with --enforce-eager: the default server loses torch.compile "
             "(and on a GPU its CUDA graphs)", "perfgate/workloads/serving/server.py (start_server)"),
    Mutation("kv_cache_shrunk", "serving",
             "every vLLM server without a KV override of its own gets the serving profile's small-KV block count "
             "(--num-gpu-blocks-override): the default server's KV cache is far too small for the load",
             "fixtures/serving.py (serving_target)"),
    Mutation("gpu_step_slowdown", "training",
             "every GPU training step does a given fraction more device work (gpu_step_slowdown:0.10 = 10 %): "
             "bf16 matrix products on the step's stream, calibrated to the step's device time",
             "perfgate/workloads/training/engine.py (BuiltCase.run_step, perfgate/workloads/device_burn.py)",
             default_factor=0.10, neutral_factor=0.0, max_factor=100.0),
    Mutation("serving_decode_slowdown", "serving",
             "every decode step of a GPU vLLM server does a given fraction more device work "
             "(serving_decode_slowdown:0.10 = 10 %): bf16 matrix products after each decode forward, calibrated "
             "inside the server to the step's device time (GPU only: the server refuses to start without CUDA)",
             "perfgate/workloads/serving/vllm_plugin.py (a vllm.general_plugins entry point)",
             default_factor=0.10, neutral_factor=0.0, max_factor=100.0),
    Mutation("moe_hot_expert", "moe",
             "the MoE router sends the uniform case's tokens to one hot expert (hot0.5: ~80 % of tokens pick "
             "expert 0), so one rank computes the most and every other waits for it in the combine",
             "perfgate/workloads/moe/routing.py (effective)"),
    Mutation("nccl_bad_default", "collectives",
             "NCCL's default is replaced by a bad fixed choice (NCCL_PROTO=Simple, one channel) in the tuner "
             "crossover sweep's default launch", "perfgate/workloads/collectives/tuner.py (launch_env)"),
    Mutation("cache_fifo_eviction", "offload",
             "the expert cache (admit-after-N policy) evicts in insertion order instead of least recently used",
             "perfgate/workloads/offload/cache_sim.py (admit_after_hits)"),
    Mutation("rmsnorm_uncoalesced", "kernels",
             "the Triton RMSNorm reads and writes each row with a strided pattern: the 32 lanes of a warp touch "
             "32 different cache lines instead of one contiguous run (same results, uncoalesced memory access)",
             "perfgate/workloads/kernels/rmsnorm_triton.py (variant)"),
)}


class MutationError(ValueError):
    """A mutation variable names a mutation that does not exist, or gives a bad factor."""


def _factor(m: Mutation, text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (m.neutral_factor <= value < m.max_factor and math.isfinite(value)):
        raise MutationError(f"{where}: the factor must be a finite number >= {m.neutral_factor:g}"
                            f"{f' and < {m.max_factor:g}' if math.isfinite(m.max_factor) else ''}, got {text!r}")
    return value


def _from_main_variable(raw: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    unknown = []
    for item in (x.strip() for x in raw.split(",")):
        if not item:
            continue
        name, sep, text = item.partition(":")
        m = MUTATIONS.get(name.strip())
        if m is None:
            unknown.append(name.strip())
            continue
        if sep and not m.graded:
            raise MutationError(f"{ENV}={raw!r}: {m.name} takes no factor (only graded mutations do: "
                                f"{', '.join(n for n, x in MUTATIONS.items() if x.graded)})")
        out[m.name] = _factor(m, text, f"{ENV}={raw!r}: {m.name}") if sep else m.default_factor
    if unknown:
        raise MutationError(f"{ENV}={raw!r}: unknown mutation(s) {unknown}; known: {', '.join(MUTATIONS)} "
                            f"(unset it for a normal run)")
    return out


def active_factors(environ=None) -> dict[str, float | None]:
    """Every mutation switched on, in registry order, with its factor (None: no factor).

    A graded knob at its neutral factor changes nothing and counts as off. Raises MutationError on an unknown
    name or a bad value, naming the variable."""
    env = os.environ if environ is None else environ
    on = _from_main_variable(env.get(ENV, ""))
    return {n: on[n] for n in MUTATIONS if n in on and on[n] != MUTATIONS[n].neutral_factor}


def active_names(environ=None) -> tuple[str, ...]:
    """The mutations switched on, in registry order; raises on an unknown name or a bad factor."""
    return tuple(active_factors(environ))


def active(name: str) -> bool:
    """Whether the code under test should plant bug ``name`` now (read on every call: cheap)."""
    if name not in MUTATIONS:
        raise KeyError(f"no mutation {name!r} in perfgate.mutations.MUTATIONS")
    return name in active_factors()


def factor(name: str, environ=None) -> float | None:
    """A graded mutation's factor now (``name:0.1`` -> 0.1), or None when it is off."""
    if name not in MUTATIONS or not MUTATIONS[name].graded:
        raise KeyError(f"no graded mutation {name!r} in perfgate.mutations.MUTATIONS")
    return active_factors(environ).get(name)


def describe(factors: dict[str, float | None]) -> str:
    return ",".join(n if k is None else f"{n}:{k:g}" for n, k in factors.items())


def note() -> str | None:
    """One line for reports and results files, or None when no mutation is set."""
    factors = active_factors()
    if not factors:
        return None
    return (f"test-only mutation(s) {describe(factors)}: planted performance bug(s), results are not "
            f"baselines ({'; '.join(MUTATIONS[n].bug for n in factors)})")


def results_mark() -> dict | None:
    """What a results document records while mutations are on (``doc[RESULTS_KEY]``), or None."""
    factors = active_factors()
    if not factors:
        return None
    return {"names": list(factors), "factors": {n: k for n, k in factors.items() if k is not None},
            "note": note()}
