"""Validated descriptions of DDP and FSDP jobs.

A job is checked when it is built, in the pytest process, before any rank is spawned:
an impossible combination (a global batch that the world size and micro-batch do not
divide, a bf16 comm hook on gloo, five measured steps asked with a tracker that needs
more) fails with a message naming the numbers that disagree.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from perfgate.workloads.area import MIN_MEASURED_STEPS
from perfgate.workloads.training.model import get_config

BACKENDS = ("gloo", "nccl")
AMP_MODES = ("none", "bf16")  # autocast dtype for compute; parameters stay fp32
REDUCE_DTYPES = ("fp32", "fp16", "bf16")

# DDP comm hook per gradient-reduction dtype (torch.distributed.algorithms.ddp_comm_hooks.default_hooks).
DDP_HOOK_FOR_REDUCE = {"fp32": "allreduce_hook", "fp16": "fp16_compress_hook", "bf16": "bf16_compress_hook"}

# Exactly what DDP.register_comm_hook enforces; the tests skip with this text on gloo.
BF16_HOOK_NEEDS_NCCL = ("DDP refuses bf16_compress_hook unless the backend is NCCL >= 2.10 with CUDA "
                        "(torch's own check in DistributedDataParallel._check_comm_hook)")

FSDP_KINDS = ("ddp", "fsdp1-SHARD_GRAD_OP", "fsdp1-FULL_SHARD", "fsdp2-reshard", "fsdp2-noreshard")
WRAP_POLICIES = ("block", "root")


class SpecError(ValueError):
    """A job description that cannot run as written."""


def _check_common(model: str, world_size: int, backend: str, amp: str, seed: int, lr: float) -> None:
    try:
        get_config(model)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    if world_size < 1:
        raise SpecError(f"world_size must be >= 1, got {world_size}")
    if backend not in BACKENDS:
        raise SpecError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if amp not in AMP_MODES:
        raise SpecError(f"amp must be one of {AMP_MODES}, got {amp!r}")
    if amp == "bf16" and backend != "nccl":
        raise SpecError("amp='bf16' is for GPUs (nccl); CPU runs compute in fp32 so that modes agree to 5 decimals")
    if lr <= 0:
        raise SpecError(f"lr must be > 0, got {lr}")


@dataclass(frozen=True)
class Schedule:
    """How many optimizer steps to run: warm-up (discarded), timed, then memory-tracked.

    Timed and tracked steps are separate phases because the memory trackers are
    TorchDispatchModes that slow every op; each timed step and each tracked step is one sample.
    """

    warmup_steps: int = 3
    measured_steps: int = 8
    tracked_steps: int = 0
    profiled_steps: int = 0  # GPU: steps under the profiler for device busy time (never the timed ones)

    def __post_init__(self) -> None:
        if self.warmup_steps < 1:
            raise SpecError(f"warmup_steps must be >= 1 (the first step builds buckets and optimizer "
                            f"state), got {self.warmup_steps}")
        if self.measured_steps < MIN_MEASURED_STEPS:
            raise SpecError(f"measured_steps must be >= {MIN_MEASURED_STEPS} (one sample per step), "
                            f"got {self.measured_steps}")
        if self.tracked_steps and self.tracked_steps < MIN_MEASURED_STEPS:
            raise SpecError(f"tracked_steps must be 0 or >= {MIN_MEASURED_STEPS}, got {self.tracked_steps}")
        if self.profiled_steps and self.profiled_steps < MIN_MEASURED_STEPS:
            raise SpecError(f"profiled_steps must be 0 or >= {MIN_MEASURED_STEPS}, got {self.profiled_steps}")

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measured_steps + self.profiled_steps + self.tracked_steps


@dataclass(frozen=True)
class DDPCase:
    """One DDP configuration inside a job.

    ``no_sync``: with gradient accumulation, skip the all-reduce on all but the last
    micro-batch (``DDP.no_sync()``); False all-reduces after every micro-batch.
    ``reduce_dtype`` picks the comm hook (fp32 -> allreduce_hook, fp16/bf16 -> compress hooks).
    """

    label: str
    micro_batch: int
    grad_accum: int = 1
    bucket_cap_mb: float = 25.0
    no_sync: bool = True
    reduce_dtype: str = "fp32"
    track_memory: bool = False  # also run the job's tracked_steps under MemTracker

    def __post_init__(self) -> None:
        if not self.label:
            raise SpecError("a DDP case needs a label")
        if self.micro_batch < 1:
            raise SpecError(f"{self.label}: micro_batch must be >= 1, got {self.micro_batch}")
        if self.grad_accum < 1:
            raise SpecError(f"{self.label}: grad_accum must be >= 1, got {self.grad_accum}")
        if not self.bucket_cap_mb > 0:
            raise SpecError(f"{self.label}: bucket_cap_mb must be > 0, got {self.bucket_cap_mb}")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise SpecError(f"{self.label}: reduce_dtype must be one of {REDUCE_DTYPES}, got {self.reduce_dtype!r}")

    @property
    def comm_hook(self) -> str:
        return DDP_HOOK_FOR_REDUCE[self.reduce_dtype]


def strong_scaling_case(label: str, *, global_batch: int, micro_batch: int, world_size: int,
                        **kw) -> DDPCase:
    """A case whose gradient accumulation keeps ``global_batch`` sequences per optimizer step."""
    per_pass = micro_batch * world_size
    if global_batch < per_pass or global_batch % per_pass:
        raise SpecError(f"{label}: global batch {global_batch} is not a multiple of micro-batch {micro_batch} "
                        f"x world size {world_size} = {per_pass}")
    return DDPCase(label, micro_batch=micro_batch, grad_accum=global_batch // per_pass, **kw)


@dataclass(frozen=True)
class DDPJob:
    """All DDP cases one launch measures on ``world_size`` ranks.

    ``reference_cases`` run on a one-rank process group of rank 0 inside the same launch
    (the other ranks idle at a barrier meanwhile): the world-1 reference of a scaling
    ratio, measured next to the world-N steps. ``interleave`` runs the timed steps of all
    cases round-robin (see engine.run_cases); CPU only, since it keeps every case alive.
    """

    model: str
    world_size: int
    backend: str
    cases: tuple[DDPCase, ...]
    schedule: Schedule = Schedule()
    amp: str = "none"
    seed: int = 0
    lr: float = 1e-4
    reference_cases: tuple[DDPCase, ...] = ()
    interleave: bool = False

    def __post_init__(self) -> None:
        _check_common(self.model, self.world_size, self.backend, self.amp, self.seed, self.lr)
        if not self.cases:
            raise SpecError("a DDP job needs at least one case")
        labels = [c.label for c in self.cases + self.reference_cases]
        dupes = sorted({x for x in labels if labels.count(x) > 1})
        if dupes:
            raise SpecError(f"case labels must be unique, repeated: {dupes}")
        if self.reference_cases and self.world_size < 2:
            raise SpecError(f"reference_cases {[c.label for c in self.reference_cases]} are one-rank runs "
                            f"beside a multi-rank job; world_size is {self.world_size}")
        if self.interleave and self.backend == "nccl":
            raise SpecError("interleave keeps every case alive at once, which breaks per-case "
                            "torch.cuda.max_memory_allocated; use it with gloo only")
        for c in self.cases + self.reference_cases:
            if c.reduce_dtype == "bf16" and self.backend != "nccl":
                raise SpecError(f"{c.label}: {BF16_HOOK_NEEDS_NCCL}; this job's backend is {self.backend}")
        tracked = [c.label for c in self.cases + self.reference_cases if c.track_memory]
        if tracked and self.schedule.tracked_steps < MIN_MEASURED_STEPS:
            raise SpecError(f"cases {tracked} track memory but the "
                            f"schedule has tracked_steps={self.schedule.tracked_steps} (need >= {MIN_MEASURED_STEPS})")

    def only(self, labels) -> "DDPJob":
        """The same job restricted to ``labels`` (a re-measurement needs only its own cases)."""
        wanted = set(labels)
        known = {c.label for c in self.cases + self.reference_cases}
        if wanted - known:
            raise SpecError(f"unknown case labels {sorted(wanted - known)}; known: {sorted(known)}")
        return replace(self, cases=tuple(c for c in self.cases if c.label in wanted),
                       reference_cases=tuple(c for c in self.reference_cases if c.label in wanted))

    def tokens_per_step(self, case: DDPCase, world_size: int | None = None) -> int:
        """Tokens one optimizer step consumes across all ranks (``world_size`` of the case's group)."""
        world = self.world_size if world_size is None else world_size
        return case.micro_batch * case.grad_accum * world * get_config(self.model).seq_len


@dataclass(frozen=True)
class ShardingMode:
    """DDP or an FSDP flavour, with the dtype gradients are reduced in.

    The seed report insists the reduce dtype be controlled: an FSDP run reducing in fp16
    is compared with DDP using the fp16 compress hook, never with fp32 DDP.
    """

    kind: str
    reduce_dtype: str = "fp32"
    # The step anatomy (§16.9): "block" wraps each GPTBlock, then the root; "root" the root alone.
    wrap: str = "block"
    # FSDP1 BackwardPrefetch.BACKWARD_PRE (its default); False: None. FSDP2 has no public switch to
    # turn its implicit backward prefetch off (set_modules_to_backward_prefetch only replaces it).
    backward_prefetch: bool = True

    def __post_init__(self) -> None:
        if self.kind not in FSDP_KINDS:
            raise SpecError(f"kind must be one of {FSDP_KINDS}, got {self.kind!r}")
        if self.reduce_dtype not in REDUCE_DTYPES:
            raise SpecError(f"{self.kind}: reduce_dtype must be one of {REDUCE_DTYPES}, got {self.reduce_dtype!r}")
        if self.wrap not in WRAP_POLICIES:
            raise SpecError(f"{self.kind}: wrap must be one of {WRAP_POLICIES}, got {self.wrap!r}")
        if self.is_ddp and not self.is_default_wrapping:
            raise SpecError("DDP has no wrap policy or backward prefetch: only FSDP modes vary them")
        if not self.backward_prefetch and not self.kind.startswith("fsdp1"):
            raise SpecError(f"{self.kind}: backward prefetch can be turned off for FSDP1 only "
                            f"(FSDP2 has no public switch for its implicit prefetch)")

    @property
    def is_default_wrapping(self) -> bool:
        """Block-level wrapping with backward prefetch: the modes of the memory and throughput tests."""
        return self.wrap == "block" and self.backward_prefetch

    @property
    def label(self) -> str:
        suffix = ("-rootwrap" if self.wrap == "root" else "") + ("" if self.backward_prefetch else "-noprefetch")
        return f"{self.kind}-{self.reduce_dtype}reduce{suffix}"

    @property
    def is_ddp(self) -> bool:
        return self.kind == "ddp"

    @property
    def keeps_gathered_weights(self) -> bool:
        """FSDP2 without resharding after forward keeps the gathered weights beside the shards
        (perfgate.workloads.training.memory_need counts them)."""
        return self.kind == "fsdp2-noreshard"

    @property
    def reference(self) -> "ShardingMode":
        """The DDP mode this one is compared with: same reduce dtype."""
        return ShardingMode("ddp", self.reduce_dtype)


@dataclass(frozen=True)
class FSDPJob:
    """DDP and FSDP modes measured one after another in one launch, same model, data and batch."""

    model: str
    world_size: int
    backend: str
    modes: tuple[ShardingMode, ...]
    micro_batch: int = 2
    schedule: Schedule = Schedule(warmup_steps=2, measured_steps=6, tracked_steps=5)
    amp: str = "none"
    seed: int = 0
    lr: float = 1e-4
    tracked_reduce_dtypes: tuple[str, ...] = ("fp32",)  # modes whose memory the trackers break down
    interleave: bool = False  # round-robin timed steps over the modes (gloo only, see DDPJob)

    def __post_init__(self) -> None:
        _check_common(self.model, self.world_size, self.backend, self.amp, self.seed, self.lr)
        if self.interleave and self.backend == "nccl":
            raise SpecError("interleave keeps every mode alive at once, which breaks per-mode "
                            "torch.cuda.max_memory_allocated; use it with gloo only")
        if not self.modes:
            raise SpecError("an FSDP job needs at least one mode")
        if self.micro_batch < 1:
            raise SpecError(f"micro_batch must be >= 1, got {self.micro_batch}")
        labels = [m.label for m in self.modes]
        if len(set(labels)) != len(labels):
            raise SpecError(f"modes must be unique, got {labels}")
        for m in self.modes:
            if m.is_ddp and m.reduce_dtype == "bf16" and self.backend != "nccl":
                raise SpecError(f"{m.label}: {BF16_HOOK_NEEDS_NCCL}; this job's backend is {self.backend}")
            if not m.is_ddp and m.reference not in self.modes:
                raise SpecError(f"{m.label} needs its reference {m.reference.label} in the same job "
                                f"(throughput and memory ratios are measured in one launch)")
        if self.schedule.tracked_steps < MIN_MEASURED_STEPS:
            raise SpecError(f"FSDP jobs measure memory with the trackers: tracked_steps must be >= "
                            f"{MIN_MEASURED_STEPS}, got {self.schedule.tracked_steps}")

    def only(self, labels) -> "FSDPJob":
        """The same job restricted to the modes ``labels`` and the DDP references they need."""
        wanted = set(labels)
        known = {m.label for m in self.modes}
        if wanted - known:
            raise SpecError(f"unknown mode labels {sorted(wanted - known)}; known: {sorted(known)}")
        keep = [m for m in self.modes if m.label in wanted or any(
            m == other.reference for other in self.modes if other.label in wanted)]
        return replace(self, modes=tuple(keep))

    def tracks(self, mode: ShardingMode) -> bool:
        # the prefetch comparison reads throughput and collectives only: no tracked steps for it
        return mode.reduce_dtype in self.tracked_reduce_dtypes and mode.backward_prefetch

    def mode(self, label: str) -> ShardingMode:
        for m in self.modes:
            if m.label == label:
                return m
        raise KeyError(f"no mode {label!r} in job; modes: {[m.label for m in self.modes]}")

    @property
    def tokens_per_step(self) -> int:
        return self.micro_batch * self.world_size * get_config(self.model).seq_len
