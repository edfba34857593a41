"""The one question a person answers before baselines are written (refresh, calibrate).

A prompt is the commands' business: the store writes what it is given and never asks anyone.
"""
from __future__ import annotations

import sys


def confirmed(yes: bool, question: str) -> bool:
    """The one question before baselines are written (refresh, calibrate): ``--yes`` answers it; without a
    terminal to ask on, nothing is written and the reason says how to write anyway."""
    if yes:
        return True
    if not sys.stdin.isatty():
        print("not written: pass --yes to write without a terminal to confirm on", file=sys.stderr)
        return False
    if input(f"{question} [y/N] ").strip().lower() not in ("y", "yes"):
        print("not written")
        return False
    return True
