"""A guard that stops a group whose ranks issue their collectives in different orders, before data moves.

Why: a communicator (gloo, NCCL) matches collectives by their position in the call sequence, not by
the tensor. Two ranks that issue two same-shaped collectives A and B in opposite orders do not hang
and do not raise: each A is reduced with the other rank's B (seed report §16.8). PyTorch's own check
(``TORCH_DISTRIBUTED_DEBUG=DETAIL``) compares the operation and the shapes, which such calls share.

So before each collective, :meth:`OrderGuard.check` has every rank of the group show the others
which call it is about to make: its sequence number in this group and the call's name, in one
all_gather of a few bytes. Ranks that disagree all see the same gathered table, so every rank of the
group raises :class:`CollectiveOrderMismatch` at the same call, none of them having moved any data of
it, and the group stays usable (each rank issued the same number of collectives). A skipped call
shows up as a sequence mismatch at the next one. The cost is one small all_gather per guarded call:
guard a correctness pass, not a timed loop.
"""
from __future__ import annotations

NAME_BYTES = 48  # a call's name travels in this many bytes (longer names are cut)


class CollectiveOrderMismatch(RuntimeError):
    """The ranks of one group were about to issue different collectives.

    ``calls`` maps each global rank of the group to ``(sequence number, call name)``."""

    def __init__(self, group_name: str, calls: dict[int, tuple[int, str]]):
        self.group_name = group_name
        self.calls = calls
        by_call: dict[tuple[int, str], list[int]] = {}
        for rank, call in sorted(calls.items()):
            by_call.setdefault(call, []).append(rank)
        shown = "; ".join(f"rank(s) {ranks}: call #{seq} {name!r}" for (seq, name), ranks in by_call.items())
        super().__init__(f"collective order mismatch in {group_name}: {shown}. The communicator would have "
                         f"matched these calls by order and mixed their data; every rank must issue the "
                         f"group's collectives in the same order")


class OrderGuard:
    """Checks, before each collective of ``group``, that every rank of it issues the same one.

    ``name`` says which group it is in messages (``"tp group [0, 1]"``)."""

    def __init__(self, group, name: str):
        self.group = group
        self.name = name
        self.sequence = 0

    def check(self, call: str) -> None:
        """Raise :class:`CollectiveOrderMismatch` on every rank of the group unless all are about to issue ``call``."""
        import torch
        import torch.distributed as dist

        self.sequence += 1
        n = dist.get_world_size(self.group)
        encoded = call.encode()[:NAME_BYTES].ljust(NAME_BYTES, b"\0")
        mine = torch.tensor([self.sequence], dtype=torch.int64).view(torch.uint8)
        mine = torch.cat([mine, torch.frombuffer(bytearray(encoded), dtype=torch.uint8)])
        device = _group_device(self.group)
        table = torch.empty(n * mine.numel(), dtype=torch.uint8, device=device)
        dist.all_gather_into_tensor(table, mine.to(device), group=self.group)
        rows = table.cpu().view(n, -1)
        ranks = dist.get_process_group_ranks(self.group)
        calls = {ranks[i]: (int(row[:8].view(torch.int64)), _name(row[8:])) for i, row in enumerate(rows)}
        if len(set(calls.values())) > 1:
            raise CollectiveOrderMismatch(self.name, calls)


def _name(encoded) -> str:
    return bytes(encoded.tolist()).rstrip(b"\0").decode(errors="replace")


def _group_device(group):
    """Where the group's collectives take tensors: the current CUDA device for NCCL, else the CPU."""
    import torch
    import torch.distributed as dist

    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
