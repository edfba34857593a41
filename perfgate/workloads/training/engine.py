"""The one step loop every training case runs: warm-up, timed, device-profiled, memory-tracked steps.

The DDP and FSDP modules build a :class:`BuiltCase` -- a ``step(i) -> loss`` closure
(forward, backward and optimizer step ``i``), a tracker factory, an all-reduce counter --
and :func:`run_cases` owns the rest: barriers, timing, device synchronisation, per-step
peak memory, the per-rank result record, and the order of steps (one case after another,
or round-robin). Keeping this in one place is what makes DDP and FSDP numbers comparable.

Device time (GPU only, ``Schedule.profiled_steps``): a few further steps each run under
torch.profiler (perfgate.workloads.device_time) give the device's busy time per step and its
share of the step: the proof that a GPU step time measures the GPU, recorded beside it.

Memory, by source:
- GPU: ``torch.cuda.max_memory_allocated`` with the peak reset before every timed step, less the
  case's floor: what was allocated when it was built (``info.alloc_floor_gib``). The floor is what
  earlier cases of the launch left that ``gc`` cannot free: an FSDP1 model's flat parameters sit in
  a reference cycle through C++ from its construction on (torch 2.11 and 2.13), and every later
  case counted them (fsdp2-reshard read 70.5 GiB after two FSDP1 modes, +10 GiB for each). Without
  the floor a case's figure depended on which cases ran before it in the same launch.
- CPU and GPU: torch's own trackers (``MemTracker`` for DDP/FSDP1, ``FSDPMemTracker`` for
  FSDP2) over ``tracked_steps`` further steps, entered afresh per step so that each step
  yields its own peak and the category breakdown at that peak. On CPU this is the primary
  figure: process RSS (~300+ MiB of interpreter and libraries) hides sharding savings.
- Process RSS after each timed step, as a secondary figure.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.distributed as dist

from perfgate import mutations
from perfgate.workloads import device_burn, device_energy, device_time, timing

# Tracker reference types -> the categories we report. Names are the enums' .name values of
# torch.distributed._tools.mem_tracker._MemRefType and fsdp2_mem_tracker._FSDPRefType.
CATEGORY_OF = {
    "PARAM": "params", "SHARDED_PARAM": "params", "UNSHARDED_PARAM": "params",
    "GRAD": "grads", "SHARDED_GRAD": "grads", "UNSHARDED_GRAD": "grads",
    "OPT": "optimizer",
    "ACT": "activations",
    "TEMP": "temp", "ALL_GATHER": "temp", "REDUCE_SCATTER": "temp",
    "BUFFER": "other", "OTH": "other", "INP": "other",
}
CATEGORIES = ("params", "grads", "optimizer", "activations", "temp", "other")


@dataclass
class CaseResult:
    """What one rank measured for one case. Plain lists so the parent can pickle and JSON it."""

    label: str
    rank: int
    world_size: int
    step_s: list[float] = field(default_factory=list)  # timed steps, wall time on this rank
    losses: list[float] = field(default_factory=list)  # every step, warm-up included
    allreduce_calls: list[int] = field(default_factory=list)  # per timed step (DDP only)
    comm_blocked_s: list[float] = field(default_factory=list)  # per timed step: backward inside the comm hook
    comm_exposed_s: list[float] = field(default_factory=list)  # per timed step: comm no compute hid (DDP, CPU)
    collective_ops: list[list[str]] = field(default_factory=list)  # per logged warm-up step (training.anatomy)
    peak_alloc_bytes: list[int] = field(default_factory=list)  # per timed step (CUDA only)
    rss_bytes: list[int] = field(default_factory=list)  # after each timed step
    tracked_peak_bytes: list[int] = field(default_factory=list)  # per tracked step, tracker total
    tracked_categories: list[dict[str, int]] = field(default_factory=list)  # breakdown at each peak
    device_busy_ms: list[float] = field(default_factory=list)  # per profiled step (CUDA only)
    device_span_ms: list[float] = field(default_factory=list)  # per profiled step, CUDA events
    step_energy_j: list[float] = field(default_factory=list)  # per timed step, this rank's GPU (NVML)
    burn_products: int = 0  # TEST-ONLY gpu_step_slowdown: matrix products added to each step
    tracker_error: str | None = None
    extra_param_copy: bool = False
    info: dict[str, Any] = field(default_factory=dict)


def extra_param_copy_enabled() -> bool:
    """TEST-ONLY knob (registered mutation ``extra_param_copy``, ``PERFGATE_TEST_MUTATION=extra_param_copy``): keep
    a full extra copy of the parameters, a deliberate memory regression that shows the FSDP memory gate fires."""
    return mutations.active("extra_param_copy")


def maybe_extra_param_copy(model: torch.nn.Module) -> list[torch.Tensor]:
    """Clone every parameter and keep the clones alive for the whole case (TEST-ONLY).

    Called on the unwrapped model, so the copy is full-size whatever the sharding: the
    kind of leak a wrapper bug that forgets to free the original parameters would cause.
    Never set it outside the harness's own tests; it exists only to prove the memory gate fires.
    """
    if not extra_param_copy_enabled():
        return []
    return [p.detach().clone() for p in model.parameters()]


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def autocast(device: torch.device, amp: str):
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=(amp == "bf16"))


def make_adamw(params, device: torch.device, lr: float) -> torch.optim.Optimizer:
    # fused AdamW on GPUs, as the seed; the default (foreach) implementation on CPU.
    return torch.optim.AdamW(params, lr=lr, fused=True if device.type == "cuda" else None)


def _rss_bytes() -> int:
    try:
        import psutil

        return int(psutil.Process().memory_info().rss)
    except Exception:  # psutil missing or /proc unreadable: RSS is secondary, never fatal
        return 0


def _categorize(snapshot: dict, device: torch.device) -> tuple[int, dict[str, int]]:
    """Tracker peak snapshot {device: {reftype: bytes}} -> (total, bytes per category) on ``device``."""
    per_dev = {str(dev): snap for dev, snap in snapshot.items()}
    snap = per_dev.get(str(device))
    if snap is None and device.type == "cpu":
        snap = per_dev.get("cpu")
    if snap is None:
        return 0, dict.fromkeys(CATEGORIES, 0)
    cats = dict.fromkeys(CATEGORIES, 0)
    total = 0
    for key, nbytes in snap.items():
        name = getattr(key, "name", str(key))
        if name == "Total" or str(key) == "Total":
            total = int(nbytes)
            continue
        cats[CATEGORY_OF.get(name, "other")] += int(nbytes)
    return total, cats


def free_storages(*owners) -> None:
    """Free the memory of a finished case's parameters, gradients, buffers and optimizer state,
    whatever still refers to their tensors.

    An FSDP1 model's flat parameters sit in a reference cycle through C++ that ``gc`` cannot break
    (torch 2.11 and 2.13): on an H100 each finished FSDP1 case of the 368M model kept 2.75 GiB
    allocated, and the 1.3 B launch ran out of its 80 GB after a few modes (75.1 GiB allocated). The
    tensor objects may outlive the case; their storages need not: each is resized to nothing here."""
    seen: set[int] = set()

    def drop(t) -> None:
        if not isinstance(t, torch.Tensor):
            return
        local = t.to_local() if hasattr(t, "to_local") else t  # FSDP2's DTensor parameters
        try:
            storage = local.untyped_storage()
        except (RuntimeError, NotImplementedError):  # a tensor without storage of its own (meta, sparse)
            return
        if storage.data_ptr() in seen or storage.nbytes() == 0:
            return
        seen.add(storage.data_ptr())
        storage.resize_(0)

    for owner in owners:
        if isinstance(owner, torch.optim.Optimizer):
            for state in owner.state.values():
                for value in state.values():
                    drop(value)
        elif isinstance(owner, torch.nn.Module):
            for p in owner.parameters():
                drop(p.grad)
                p.grad = None
                drop(p)
            for b in owner.buffers():
                drop(b)
        else:
            drop(owner)


def release(device: torch.device) -> None:
    """Drop what the finished case left so the next case's peak starts from the same floor."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


@dataclass
class BuiltCase:
    """A case ready to step: what :func:`run_cases` needs, built by the DDP or FSDP module.

    ``group`` is the process group the case trains on (None: every rank); ranks outside it
    hold ``step=None`` and only join the barriers, which is how a one-rank reference run
    (world 1 inside a world-N launch) leaves the other ranks idle while it is timed.
    """

    result: CaseResult
    step: Callable[[int], float] | None
    group: Any = None
    make_tracker: Callable[[], Any] | None = None
    allreduce_counter: Callable[[], int] | None = None
    keepalive: list = field(default_factory=list)  # e.g. the TEST-ONLY extra parameter copy
    owners: tuple = ()  # the case's modules and optimizers: their storages are freed when it ends
    next_step: int = 0
    alloc_floor_bytes: int = 0  # GPU: allocated before the case was built (the module docstring)
    burn: Any = None  # TEST-ONLY device work after each step (perfgate.workloads.device_burn)

    @property
    def active(self) -> bool:
        return self.step is not None

    def run_step(self) -> float:
        loss = self.step(self.next_step)
        self.next_step += 1
        if self.burn is not None:
            self.burn.run()
        return loss


def _warmup(case: BuiltCase, schedule, device: torch.device) -> None:
    if not case.active:
        return
    for _ in range(schedule.warmup_steps):
        case.result.losses.append(case.run_step())
    fraction = mutations.factor("gpu_step_slowdown")
    if fraction and device.type == "cuda":  # TEST-ONLY: calibrated on this case's own steps
        spans = []
        for _ in range(3):
            spans.append(device_burn.step_span_ms(lambda: case.result.losses.append(case.run_step()), device))
        case.burn = device_burn.calibrate(spans, fraction, device)
        case.result.burn_products = case.burn.count
        # what was planted, on the device's clock: the asked-for share of the step and the products' time
        case.result.info["burn_ms"] = {"target": case.burn.target_ms, "device": case.burn.device_ms,
                                       "n": case.burn.n, "step_median": case.burn.step_ms}


def _profiled_steps(case: BuiltCase, schedule, device: torch.device) -> None:
    """Steps under the profiler: device busy time and span per step (GPU only; never the timed ones)."""
    if not (case.active and device.type == "cuda" and schedule.profiled_steps):
        return
    res = case.result
    for _ in range(schedule.profiled_steps):
        dist.barrier(group=case.group)
        loss, window = device_time.measure(case.run_step, device)
        res.device_busy_ms.append(window.busy_ms)
        res.device_span_ms.append(window.span_ms)
        res.losses.append(loss)


def _timed_step(case: BuiltCase, device: torch.device) -> tuple[float, float] | None:
    """One timed step. All ranks enter the world barrier; members of the case then step.
    Returns the step's (start, end) on the host clock (perfgate.workloads.timing.now; the end once the device
    drained), the clock the energy meter's windows are read against; None on a rank outside the case."""
    dist.barrier()
    if not case.active:
        return None
    res = case.result
    synchronize(device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    calls0 = case.allreduce_counter() if case.allreduce_counter else 0
    blocked0 = getattr(case.allreduce_counter, "blocked_s", None)
    exposed0 = getattr(case.allreduce_counter, "exposed_s", None)
    t0 = timing.now()  # the previous step ended drained; the barrier's device tail stays in, as it always did
    loss = case.run_step()
    t1 = timing.now(device)
    res.step_s.append(t1 - t0)
    if case.allreduce_counter:
        res.allreduce_calls.append(case.allreduce_counter() - calls0)
    if blocked0 is not None:
        res.comm_blocked_s.append(case.allreduce_counter.blocked_s - blocked0)
    if exposed0 is not None:
        res.comm_exposed_s.append(case.allreduce_counter.exposed_s - exposed0)
    if device.type == "cuda":
        res.peak_alloc_bytes.append(int(torch.cuda.max_memory_allocated(device)) - case.alloc_floor_bytes)
    res.rss_bytes.append(_rss_bytes())
    res.losses.append(loss)
    return t0, t1


def _timed_steps(case: BuiltCase, schedule, device: torch.device) -> None:
    """The timed steps; on a GPU, the energy its device used in each of them beside its time.

    The energy counter is read by a thread (perfgate.workloads.device_energy) while the steps run,
    so each timed step gets its own joules with no extra steps; where it cannot be read, the
    reason goes into ``info["energy_unavailable"]`` and nothing is recorded."""
    meter = None
    if device.type == "cuda" and case.active:
        try:
            meter = device_energy.EnergyMeter.for_device(device)
        except device_energy.EnergyUnavailable as exc:
            case.result.info["energy_unavailable"] = str(exc)
    windows = []
    with meter if meter is not None else nullcontext():
        for _ in range(schedule.measured_steps):
            window = _timed_step(case, device)
            if window is not None:
                windows.append(window)
        if meter is not None:
            joules = meter.joules_each(windows)
            if joules is None:
                case.result.info["energy_unavailable"] = meter.error or (
                    "the energy counter did not advance across every timed step")
            else:
                case.result.step_energy_j = joules


@contextmanager
def _grad_hooks_removed_after():
    """Remove, after the block, the multi-grad hooks torch's module tracker registered in it.

    ``ModTracker`` (inside ``MemTracker`` and ``FSDPMemTracker``) hooks every module's inputs and
    outputs with ``register_multi_grad_hook`` and drops the handles. Each hook's closure holds the
    autograd nodes it hangs on: a cycle through C++ that ``gc`` cannot break, so the tracked step's
    graph -- and through its AccumulateGrad nodes the case's parameters and gradients -- outlived the
    case. The next case's ``max_memory_allocated`` counted them: on the H200, test_ddp_microbatch's
    1.3b-mb4 read 56.8 GiB after the tracked cases before it and 38.0 GiB alone. Removing the hooks
    frees the graph (tests/test_training_case_isolation.py holds weak references to a case's parameters).
    """
    from torch.distributed._tools import mod_tracker

    handles = []
    register = mod_tracker.register_multi_grad_hook

    def keeping_the_handle(*args, **kwargs):
        handle = register(*args, **kwargs)
        handles.append(handle)
        return handle

    mod_tracker.register_multi_grad_hook = keeping_the_handle
    try:
        yield
    finally:
        mod_tracker.register_multi_grad_hook = register
        for handle in handles:
            handle.remove()


def _tracked_steps(case: BuiltCase, schedule, device: torch.device) -> None:
    """Memory-tracked steps: the tracker is entered afresh per step, so each step has its own peak."""
    if not (case.active and case.make_tracker and schedule.tracked_steps):
        return
    res = case.result
    try:
        tracker = case.make_tracker()
    except Exception as exc:  # noqa: BLE001 - reported; the parent decides if it matters
        res.tracker_error = f"{type(exc).__name__}: {exc}"
        return
    for _ in range(schedule.tracked_steps):
        dist.barrier(group=case.group)
        try:
            with _grad_hooks_removed_after(), tracker:
                loss = case.run_step()
            total, cats = _categorize(tracker.get_tracker_snapshot("peak"), device)
            tracker.reset_mod_stats()
        except Exception as exc:  # noqa: BLE001 - a tracker bug must not hide the timings
            # Deterministic tracker failures hit every rank at the same op, so stopping the
            # tracked phase here keeps the ranks' collectives matched.
            res.tracker_error = f"{type(exc).__name__}: {exc}"
            return
        res.tracked_peak_bytes.append(total)
        res.tracked_categories.append(cats)
        res.losses.append(loss)


def run_cases(builders: list[Callable[[], BuiltCase]], schedule, device: torch.device, *,
              interleave: bool = False, phase: Callable[[str], None] = lambda text: None) -> list[CaseResult]:
    """Warm up, time and memory-track every case; return this rank's results in order.

    Losses are returned, not judged: the test asserts they are finite, with every case in hand.

    Sequential (``interleave=False``): one case at a time, built, run, freed -- what GPUs
    need, because ``max_memory_allocated`` sees every live tensor of the process.
    Interleaved: every case is built first and the timed steps go round-robin (case A
    step 1, case B step 1, ..., case A step 2, ...), so two cases' i-th steps lie next to
    each other in time and slow drift of a shared machine's load cancels out of the
    paired ratios. Trackers only count their own case's tensors, so memory stays per case.
    """
    results: list[CaseResult] = []
    if not interleave:
        for build in builders:
            floor = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
            case, build_s = timing.time_call(build)
            case.alloc_floor_bytes = floor
            if device.type == "cuda":
                case.result.info["alloc_floor_gib"] = floor / 2**30
            # where a case's wall time goes (attached with its info): a one-case session on the
            # H200 took 32 s for ~2 s of timed steps, and `perfgate ab` pays that per round
            spent = case.result.info["phase_s"] = {"build": build_s}
            for name, text, run in (
                    ("warmup", "warm-up", lambda: _warmup(case, schedule, device)),
                    ("timed", "timed steps", lambda: _timed_steps(case, schedule, device)),
                    ("profiled", "device-profiled steps", lambda: _profiled_steps(case, schedule, device)),
                    ("tracked", "memory-tracked steps", lambda: _tracked_steps(case, schedule, device))):
                phase(f"{case.result.label}: {text}")
                spent[name] = timing.time_call(run)[1]
            if case.active:
                results.append(case.result)
            free_storages(*case.owners, *case.keepalive)
            del case
            release(device)
        return results
    cases = [build() for build in builders]
    for case in cases:
        phase(f"{case.result.label}: warm-up")
        _warmup(case, schedule, device)
    phase("timed rounds over all cases")
    for _ in range(schedule.measured_steps):
        for case in cases:
            _timed_step(case, device)
    for case in cases:
        _profiled_steps(case, schedule, device)
    for case in cases:
        phase(f"{case.result.label}: memory-tracked steps")
        _tracked_steps(case, schedule, device)
    return [case.result for case in cases if case.active]
