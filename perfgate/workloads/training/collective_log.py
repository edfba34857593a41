"""Log every collective a training step issues, in order, as the dispatcher sees it.

Why a dispatch mode and not the profiler or a patched ``dist.all_gather_into_tensor``: every
c10d collective, whichever Python API or C++ reducer issued it (FSDP1's flat parameters,
FSDP2's foreach all-gather, DDP's comm hooks), reaches the dispatcher as one ``c10d::`` operator
on the calling thread (autograd carries the mode into backward), so one mode sees them all with
no name matching on trace events and no patching of the functions FSDP happens to call today.
A dispatch mode slows every op, so it runs only on a warm-up step, never a timed one.
"""
from __future__ import annotations

from torch.utils._python_dispatch import TorchDispatchMode

from perfgate.workloads.training.anatomy import BACKWARD

NAMESPACES = ("c10d", "_c10d_functional")


class CollectiveLog(TorchDispatchMode):
    """``with log: step``; ``log.ops``: ``c10d::`` operator names in issue order, and
    :data:`~perfgate.workloads.training.anatomy.BACKWARD` where :meth:`mark_backward` was called."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []

    def mark_backward(self) -> None:
        self.ops.append(BACKWARD)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace in NAMESPACES:
            self.ops.append(func._schema.name)
        return func(*args, **(kwargs or {}))
