"""The one check every hardware id passes before perfgate uses it, and the one place that
picks the id a session measures under.

A hardware id names a folder under the baselines root (``baselines/<hardware-id>/``), so
an unchecked id is a path: ``../../x`` or ``/abs/dir`` would read and write outside the
tree. Ids come in from the command line (``--perf-hardware-id``, ``--hardware-id``), the
environment (``PERFGATE_HARDWARE_ID``), results files and the names of baseline folders;
each of those calls :func:`check_hardware_id` with where the value came from, so the one
line a user sees names the source, the value and the rule. Which of option, environment and
detection applies is :func:`resolve_hardware_id`'s alone (the plugin, `perfgate fingerprint`,
the skip reasons of GPU markers).
"""
from __future__ import annotations

import os
import re
from typing import Callable

ENV = "PERFGATE_HARDWARE_ID"

# Conservative on purpose: letters, digits and . _ + - only (no separators, no spaces),
# starting with a letter or digit, at most 80 characters; ``..`` is refused separately.
HARDWARE_ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,79}$")

_RULE = ("use 1-80 letters, digits, '.', '_', '+' or '-', starting with a letter or digit, "
         "with no '/' and no '..' (e.g. 2xH200-NV18 or cpu-AMD-EPYC-2c)")


class HardwareIdError(ValueError):
    """A hardware id that cannot safely name a baseline folder; the message names its source."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 100 else text[:97] + "..."


def check_hardware_id(value: str, *, source: str) -> str:
    """Return ``value`` if it is a valid hardware id, else raise HardwareIdError naming ``source``."""
    if not isinstance(value, str):
        raise HardwareIdError(f"{source}: hardware id must be a string, got {_shown(value)}; {_RULE}")
    if not HARDWARE_ID_PATTERN.fullmatch(value) or ".." in value:
        raise HardwareIdError(f"{source}: {_shown(value)} is not a valid hardware id: {_RULE}")
    return value


def resolve_hardware_id(option: str | None = None, *, option_source: str = "--perf-hardware-id",
                        detect: Callable[[], str] | None = None) -> str:
    """The id to measure under, checked and naming where it came from: the command-line ``option``
    if given, else ``PERFGATE_HARDWARE_ID``, else the id derived from this machine's fingerprint."""
    if option is not None:
        return check_hardware_id(option, source=option_source)
    if os.environ.get(ENV):
        return check_hardware_id(os.environ[ENV], source=ENV)
    if detect is None:
        from perfgate.machine import hardware  # the fingerprint may ask torch and NVML: only when needed

        detect = hardware.hardware_id
    return check_hardware_id(detect(), source="detected hardware id (perfgate fingerprint)")
