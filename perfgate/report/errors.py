"""How an operating-system error reads to a user: ``Permission denied: /proc/1/cwd``.

Python's own text (``[Errno 13] Permission denied: '/proc/1/cwd'``) shows an errno number and a
quoted repr; a file write that ran past ``ulimit -f`` has no file name at all and printed
``File too large (None)``. Every message perfgate prints for an OSError goes through
:func:`os_error`, and its caller adds what was being done and the fix.
"""
from __future__ import annotations


def os_error(exc: OSError) -> str:
    """The error's words and the file(s) it names, without errno numbers, quotes or ``None``."""
    words = exc.strerror or str(exc) or type(exc).__name__
    names = [str(n) for n in (exc.filename, exc.filename2) if n is not None]
    return f"{words}: {' -> '.join(names)}" if names else words
