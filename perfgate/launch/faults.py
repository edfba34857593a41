"""Test-only fault injection into real ranks: ``PERFGATE_TEST_FAULT=KIND@RANK[:PHASE]``.

Rank RANK fails on purpose when it marks a phase whose text contains PHASE (the first
phase, ``started``, when PHASE is empty; ``init_process_group`` injects before the
rendezvous). KIND is ``raise`` (an exception), ``exit`` (``os._exit(7)``, no traceback),
``kill`` (SIGKILL to itself), ``segv`` (a real segmentation fault) or ``hang`` (sleeps
forever, so the other ranks block in their next collective). It lets tests and nightly
drills inject a fault into any real workload, e.g. ``PERFGATE_TEST_FAULT=kill@1:sample 2``;
never set it otherwise (docs/reliability.md). The launchers validate the value before any
rank starts, and :class:`perfgate.launch.jobs.WorkerContext` fires it from ``ctx.phase``.
"""
from __future__ import annotations

import os
import re
import signal
import sys
import time
from dataclasses import dataclass

FAULT_ENV = "PERFGATE_TEST_FAULT"
FAULT_KINDS = ("raise", "exit", "kill", "segv", "hang")
FAULT_EXIT_CODE = 7


@dataclass(frozen=True)
class Fault:
    """A test-only injected fault (see the module docstring): what, on which rank, at which phase."""

    kind: str
    rank: int
    phase: str = ""

    @classmethod
    def parse(cls, text: str) -> "Fault":
        m = re.fullmatch(r"(\w+)@(\d+)(?::(.*))?", text.strip(), re.S)
        if not m or m.group(1) not in FAULT_KINDS:
            raise ValueError(f"{FAULT_ENV}={text!r}: expected KIND@RANK[:PHASE] with KIND one of "
                             f"{', '.join(FAULT_KINDS)}, e.g. 'kill@1:sample 2'")
        return cls(m.group(1), int(m.group(2)), m.group(3) or "")

    def due(self, rank: int, phase_text: str) -> bool:
        return rank == self.rank and self.phase in phase_text

    def fire(self, phase_text: str) -> None:
        where = f"{FAULT_ENV}={self.kind}@{self.rank}:{self.phase} at phase {phase_text!r}, t={time.time():.3f}"
        if self.kind == "raise":
            raise RuntimeError(f"injected fault ({where})")
        sys.stderr.write(f"perfgate: injected fault ({where})\n")
        sys.stderr.flush()
        if self.kind == "exit":
            os._exit(FAULT_EXIT_CODE)
        if self.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.kind == "segv":
            import faulthandler
            faulthandler._sigsegv()
        while True:  # hang
            time.sleep(3600)



def fault_from_env(env: dict[str, str] | None = None) -> Fault | None:
    """The fault asked for in ``env`` (default: this process's environment), or None."""
    text = (os.environ if env is None else env).get(FAULT_ENV)
    return Fault.parse(text) if text else None
