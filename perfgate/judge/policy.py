"""What is gated (can fail a test) on this machine: the one place that decides it.

Absolute figures are not gated on CPU hardware ids: on shared CPU machines their run-to-run
noise is wider than any useful tolerance (they are recorded, and the gross-change guard still
fails a change no noise explains). Figures that depend on no machine (exact counts) or only on
its family (ratios measured inside one run) are gated everywhere. ``gate`` (``[tool.perfgate]
gate``, ``--perf-gate``) and a machine's ``[record_only]`` table adjust that; a busy machine
(preflight taint) gates nothing. The preflight check itself defaults to on where absolute
figures are gated by default (GPU ids). The plugin, ``perfgate compare``, the reports and the
refresh hints ask this module; none spells the rule again.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from perfgate.judge.metrics import MACHINE_FREE
from perfgate.judge.patterns import PatternTable

GATE_MODES = ("auto", "all", "ratios")
CPU_ID_PREFIX = "cpu-"


def is_cpu_id(hardware_id: str) -> bool:
    """A machine without GPUs (perfgate.machine.hardware.hardware_id names those ``cpu-...``)."""
    return hardware_id.startswith(CPU_ID_PREFIX)


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
        """Whether ``metric`` of ``test_id``, depending on ``dependency``, can fail its test here."""
        if tainted:
            return False
        if self.mode == "all":
            return True
        if self.record_only.lookup(test_id, metric) is not None:
            return False
        return dependency in MACHINE_FREE or self.absolute_gated

    def preflight(self, option: str) -> bool:
        """``--perf-preflight``: on, off, or auto (on where absolute figures gate by default: GPU ids)."""
        return option == "on" or (option == "auto" and not is_cpu_id(self.hardware_id))

    def recorded_only_note(self) -> str:
        """Why a run's not-gated figures are not gated, for the verdict line."""
        return f"not gated on {CPU_ID_PREFIX}*" if is_cpu_id(self.hardware_id) else "not gated on this machine"
