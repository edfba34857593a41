"""Count the collectives a step issues per mesh dimension, and their bytes, as the dispatcher sees them.

Why the dispatcher and not the step's own bookkeeping: the counts are gated exactly, so they must
come from what reached the communicator, not from the code that meant to issue them. The training
area's :class:`~perfgate.workloads.training.collective_log.CollectiveLog` already sees every
``c10d::`` operator on the calling thread; this subclass also reads which process group each one
went to (the operator's ``process_group`` argument) and the bytes of the largest buffer it was
handed (nccl-tests' size: all_reduce's buffer, all_gather's output, reduce_scatter's input, a send's
or a receive's buffer). A send/recv exchange is two operators: the send and the receive.
"""
from __future__ import annotations

from collections import Counter

from perfgate.workloads.training.collective_log import CollectiveLog


def _tensor_bytes(value) -> int:
    import torch

    if isinstance(value, torch.Tensor):
        return value.numel() * value.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


class GroupCallLog(CollectiveLog):
    """``with log: step``; then ``log.calls[group_name]`` and ``log.bytes[group_name]`` per process group."""

    def __init__(self):
        super().__init__()
        self.calls: Counter[str] = Counter()
        self.bytes: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "c10d":  # the functional collectives name their group by string: not used here
            group = self._group_name(func, args, kwargs or {})
            if group is not None:
                self.calls[group] += 1
                self.bytes[group] += max((_tensor_bytes(a) for a in args), default=0)
        return super().__torch_dispatch__(func, types, args, kwargs)

    @staticmethod
    def _group_name(func, args, kwargs) -> str | None:
        import torch.distributed as dist

        for i, arg in enumerate(func._schema.arguments):
            if arg.name == "process_group":
                value = args[i] if i < len(args) else kwargs.get(arg.name)
                return dist.ProcessGroup.unbox(value).group_name if value is not None else None
        return None

    def per_dim(self, group_dims: dict[str, str]) -> dict[str, dict[str, int]]:
        """``{dim: {"calls": n, "bytes": b}}`` for the groups named in ``group_dims`` (group name -> dim);
        calls to any other group are counted under ``"other"``."""
        out: dict[str, dict[str, int]] = {}
        for group, calls in self.calls.items():
            row = out.setdefault(group_dims.get(group, "other"), {"calls": 0, "bytes": 0})
            row["calls"] += calls
            row["bytes"] += self.bytes[group]
        return out
