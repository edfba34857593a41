"""Names from files, shown safely: a test id or hardware id read from a results file could hold
terminal escape sequences (clear the screen, rewrite a line) or bidirectional overrides that
make a table lie. :func:`printable` shows them as Python escapes instead.

(The ``readers`` work adds the same for every report table in report/textable.py; when it
lands, this function should become that one.)
"""
from __future__ import annotations

import unicodedata

_BIDI = {"\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069",
         "\u200e", "\u200f", "\u061c"}


def printable(text: str) -> str:
    """``text`` with control, format and bidi-override characters written as escapes (``\\x1b``)."""
    if text.isprintable() and not any(c in _BIDI for c in text):
        return text
    out = []
    for c in text:
        if c == "\\":
            out.append(c)
        elif c in _BIDI or unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"):
            out.append(ascii(c)[1:-1])
        else:
            out.append(c)
    return "".join(out)
