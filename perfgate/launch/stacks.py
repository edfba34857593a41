"""Which collective a rank is blocked in: read from its faulthandler dump or its traceback.

A hang report that says "rank 0 waits in all_reduce (distributed_c10d.py:3252), rank 1 is
not in a collective" points at the culprit; the launcher makes every rank dump its stacks
(faulthandler, on SIGUSR1) and reads the innermost ``torch.distributed`` frame here.
"""
from __future__ import annotations

import re
from pathlib import Path

_FRAME = re.compile(r'^\s*File "(?P<file>[^"]+)", line (?P<line>\d+),? in (?P<func>\S+)')


def _torch_frame(frames_innermost_first) -> str | None:
    for f in frames_innermost_first:
        path = f.group("file").replace("\\", "/")
        if "torch/distributed" in path and "c10d_logger" not in path and f.group("func") != "wrapper":
            return f"{f.group('func')} ({Path(path).name}:{f.group('line')})"
    return None


def traceback_collective(text: str) -> str | None:
    """The innermost torch.distributed call in a Python traceback (innermost frame last)."""
    frames = [m for m in (_FRAME.match(line) for line in text.splitlines()) if m]
    return _torch_frame(reversed(frames))


def stack_collective(log_text: str) -> str | None:
    """The torch.distributed call on a rank's main-thread stack in its last faulthandler dump.

    faulthandler prints frames innermost first; the first frame inside torch/distributed
    (skipping its logging wrapper) names the collective the rank is blocked in."""
    blocks = re.split(r"^(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):\s*$",
                      log_text, flags=re.M)
    for block in reversed(blocks[1:]):
        frames = [m for m in (_FRAME.match(line) for line in block.splitlines()) if m]
        if not any(f.group("file").replace("\\", "/").endswith("perfgate/launch/worker.py") and f.group("func") == "<module>" for f in frames):
            continue  # not the main thread of a rank
        found = _torch_frame(frames)
        if found:
            return found
        top = frames[0]
        return f"not in a collective: {top.group('func')} ({Path(top.group('file')).name}:{top.group('line')})"
    return None
