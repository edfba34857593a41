"""The communication of one TP/PP/DP training step, as a table of rows (nccl-tests style specs).

A :class:`PhaseMix` sizes the step from a small transformer cut Megatron-style: per microbatch and
layer, TP all-reduces the attention and MLP outputs forward and their input gradients backward (4
calls, no sequence parallelism); PP hands each microbatch's activations to the next stage and its
gradients back (one ring exchange each between neighbouring stages: a send and a receive per rank);
DP all-reduces the stage's gradient shard once per step (one bucket). Each row names the collective
of :data:`perfgate.workloads.collectives.ops.OP_DEFS` it issues, so the step is made of the same
calls the collectives area times and checks.

:func:`expected_counts` is the exact call and byte count per dimension that the dispatcher must see
(perfgate.workloads.mesh.call_log): it depends on the layout and the mix, on no machine.
"""
from __future__ import annotations

from dataclasses import dataclass

from perfgate.workloads.collectives.ops import OP_DEFS
from perfgate.workloads.mesh.layout import MeshLayout

MIX_DIMS = ("tp", "pp", "dp")  # the dimensions a mix has rows for, in the order a step runs them
_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass(frozen=True)
class PhaseRow:
    """``calls_per_step`` calls of collective ``op`` on buffers of ``message_bytes``, in ``dim``'s groups."""

    dim: str
    op: str
    message_bytes: int
    calls_per_step: int
    why: str

    @property
    def dispatched_calls(self) -> int:
        """c10d operators the dispatcher sees (call_log counts each with the largest buffer it is handed):
        the op's row says how many one call is (OpDef.dispatched_per_call: a ring exchange is a send and a receive)."""
        return self.calls_per_step * OP_DEFS[self.op].dispatched_per_call

    @property
    def dispatched_bytes(self) -> int:
        return self.dispatched_calls * self.message_bytes


@dataclass(frozen=True)
class PhaseMix:
    """The step's sizes: ``tokens`` per microbatch of width ``hidden``, ``layers`` per pipeline stage."""

    hidden: int
    tokens: int
    layers: int
    microbatches: int
    dtype: str = "float32"

    def __post_init__(self) -> None:
        for name in ("hidden", "tokens", "layers", "microbatches"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.dtype not in _ELEMENT_BYTES:
            raise ValueError(f"dtype must be one of {', '.join(_ELEMENT_BYTES)}, got {self.dtype!r}")

    @property
    def element_bytes(self) -> int:
        return _ELEMENT_BYTES[self.dtype]

    def rows(self, layout: MeshLayout) -> tuple[PhaseRow, ...]:
        """The step's collectives on ``layout``: one row per dimension of degree > 1 among TP, PP, DP."""
        if layout.cp > 1:
            raise ValueError(f"the phase mix has no context-parallel row: layout {layout.describe()} has cp "
                             f"{layout.cp}; use cp 1")
        activation = self.tokens * self.hidden * self.element_bytes
        params_per_rank = self.layers * 12 * self.hidden ** 2 // layout.tp  # attention 4h^2 + MLP 8h^2, TP-split
        m = self.microbatches
        table = {
            "tp": PhaseRow("tp", "all_reduce", activation, 4 * self.layers * m,
                           "per layer and microbatch: attention and MLP outputs forward, their gradients backward"),
            "pp": PhaseRow("pp", "send_recv", activation, 2 * m,
                           "per microbatch: activations to the next stage, gradients back to the previous"),
            "dp": PhaseRow("dp", "all_reduce", params_per_rank * self.element_bytes, 1,
                           "once per step: the stage's TP shard of the gradients, one bucket"),
        }
        return tuple(table[d] for d in MIX_DIMS if getattr(layout, d) > 1)


def expected_counts(mix: PhaseMix, layout: MeshLayout) -> dict[str, dict[str, int]]:
    """``{dim: {"calls": c10d operators per step, "bytes": their bytes per step}}`` on every rank."""
    out: dict[str, dict[str, int]] = {}
    for row in mix.rows(layout):
        counts = out.setdefault(row.dim, {"calls": 0, "bytes": 0})
        counts["calls"] += row.dispatched_calls
        counts["bytes"] += row.dispatched_bytes
    return out
