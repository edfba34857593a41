"""What is gated (can fail a test) on this machine: the one place that decides it.

Absolute figures are not gated on CPU hardware ids: on shared CPU machines their run-to-run
noise is wider than any useful tolerance (they are recorded, and the gross-change guard still
fails a change no noise explains). Figures that depend on no machine (exact counts) or only on
its family (ratios measured inside one run) are gated everywhere. ``gate`` (``[tool.perfgate]
gate``, ``--perf-gate``) and a machine's ``[record_only]`` table adjust that; a busy machine
(taint: the preflight check, or the load watch while measuring) gates only what load cannot move:
exact counts and structural figures (``depends="nothing"``: parameter-count ratios, seeded routing
loads), and a tainted figure worse than its load explains still fails (perfgate.judge.load_bound).
The preflight check itself defaults to on where the machine has
GPUs: what the machine is, not how its id is spelled (`--perf-hardware-id test-box` on a CPU box
is still a CPU box, issue 47). The plugin, ``perfgate compare``, the reports and the refresh hints
ask this module; none spells the rule again.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from perfgate.judge.metrics import MACHINE_FREE
from perfgate.judge.patterns import PatternTable
from perfgate.machine.hardware_id import CPU_ID_PREFIX, parse_hardware_id

GATE_MODES = ("auto", "all", "ratios")
# What a busy machine cannot move: figures that depend on nothing (exact counts; ratios of parameter
# counts or of a seeded routing's loads). They are never tainted. Issue 47: a routing bug that took
# rank_load_max_over_mean 1.03 -> 2.21 and a stage split that took stage_param_imbalance 1.01 -> 1.53
# read `worse (tainted)` on a busy box and passed.
LOAD_FREE = frozenset({"nothing"})


def load_moves(dependency: str) -> bool:
    """Whether a busy machine can move a figure that depends on ``dependency`` (so taint voids it)."""
    return dependency not in LOAD_FREE


def is_cpu_id(hardware_id: str) -> bool:
    """A machine without GPUs (perfgate.machine.hardware.hardware_id names those ``cpu-...``)."""
    return parse_hardware_id(hardware_id).is_cpu


@dataclass(frozen=True)
class GatePolicy:
    hardware_id: str
    mode: str = "auto"  # one of GATE_MODES
    record_only: PatternTable = field(default_factory=PatternTable)

    def __post_init__(self):
        if self.mode not in GATE_MODES:
            raise ValueError(f"gate must be one of {GATE_MODES}, got {self.mode!r}")

    @classmethod
    def of(cls, hardware_id: str, settings) -> "GatePolicy":
        """The policy of a session (or `perfgate compare`) on ``hardware_id`` with these Settings."""
        return cls(hardware_id, settings.gate, settings.record_only)

    @property
    def absolute_gated(self) -> bool:
        """Whether absolute figures (depending on the host or the device) can fail here."""
        return self.mode == "all" or (self.mode == "auto" and not is_cpu_id(self.hardware_id))

    def gates(self, test_id: str, metric: str, dependency: str, *, tainted: bool = False) -> bool:
        """Whether ``metric`` of ``test_id``, depending on ``dependency``, can fail its test here;
        ``tainted``: measured on a busy machine, which voids what load can move."""
        if tainted and load_moves(dependency):
            return False
        if self.mode == "all":
            return True
        if self.record_only.lookup(test_id, metric) is not None:
            return False
        return dependency in MACHINE_FREE or self.absolute_gated

    @staticmethod
    def preflight(option: str, machine_has_gpus: Callable[[], bool]) -> bool:
        """``--perf-preflight``: on, off, or auto: on where the machine has GPUs. Asked of the machine
        (``machine_has_gpus``, called only under auto: the fingerprint costs seconds), never of the id:
        a custom id on a CPU box turned the GPU machine's check on, its foreign-CPU limit tainted all 64
        metrics of a shared box and the refresh wrote nothing (issue 47). A CPU machine is watched while
        it measures instead (perfgate.machine.load_watch)."""
        return option == "on" or (option == "auto" and machine_has_gpus())

    def recorded_only_note(self) -> str:
        """Why a run's not-gated figures are not gated, for the verdict line."""
        return f"not gated on {CPU_ID_PREFIX}*" if is_cpu_id(self.hardware_id) else "not gated on this machine"
