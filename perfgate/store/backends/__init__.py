"""Where runs are kept: open a results store by what the user named (perfgate.store.backends.base).

``--store SPEC`` (or $PERFGATE_RESULTS_STORE) names it:

- ``postgresql://user@host/db``: PostgreSQL, for a fleet (the [postgres] extra installs its driver);
  the password comes from the URL, ~/.pgpass or PGPASSWORD and is never printed or written anywhere;
- ``sqlite:///PATH`` or a path ending in ``.sqlite``, ``.sqlite3`` or ``.db``: an SQLite file;
- any other path: a folder laid out as ``<hardware-id>/<name>.json.gz`` (a code tree's digests, a
  results branch, a ``--perf-history`` folder).

Nothing named: the embedded default, an SQLite file in the user's data folder (``$XDG_DATA_HOME/perfgate/
results.sqlite``, else ``~/.local/share/perfgate/results.sqlite``), outside any code tree, no server.
"""
from __future__ import annotations

import os
from pathlib import Path

from perfgate.store.backends.base import ResultsStore, Stored
from perfgate.store.backends.documents import Entry, MetricRow, StoreError, StoreUnavailable

ENV = "PERFGATE_RESULTS_STORE"
SQLITE_SUFFIXES = (".sqlite", ".sqlite3", ".db")

__all__ = ["ENV", "Entry", "MetricRow", "ResultsStore", "StoreError", "StoreUnavailable", "Stored",
           "default_location", "describe", "is_url", "open_store", "spec_of"]


def default_location() -> Path:
    """The embedded default: an SQLite file in the user's data folder, never inside a code tree."""
    base = os.environ.get("XDG_DATA_HOME") or str(Path.home() / ".local" / "share")
    return Path(base) / "perfgate" / "results.sqlite"


def spec_of(named: str | os.PathLike | None) -> str:
    """What the user named (``--store``), else $PERFGATE_RESULTS_STORE, else the embedded default."""
    if named is not None and str(named) != "":
        return str(named)
    return os.environ.get(ENV) or str(default_location())


def is_url(spec: str) -> bool:
    """Whether a store spec is a database URL (else it is a path: a folder or an SQLite file)."""
    return spec.startswith(("postgresql:", "postgresql+", "postgres:", "sqlite:"))


def describe(spec: str) -> str:
    """How messages name a store: a URL without its password."""
    if is_url(spec):
        from perfgate.store.backends.sql import engine_url, shown_url

        try:
            return shown_url(engine_url(spec))
        except Exception:  # an unparsable URL: say nothing of it that could hold a secret
            return spec.split(":", 1)[0] + "://(unparsable URL)"
    return spec


def open_store(named: str | os.PathLike | None = None, *, create: bool = False) -> ResultsStore:
    """The store the user named (see the module's docstring). ``create``: a writer may create the folder,
    file or tables; a reader never does (a read-only login is enough to read)."""
    spec = spec_of(named)
    if is_url(spec):
        from perfgate.store.backends.sql import SqlStore

        try:
            return SqlStore(spec, create=create)
        except (ValueError, TypeError) as exc:
            if isinstance(exc, StoreError):
                raise
            raise StoreError(f"results store {describe(spec)}: not a usable URL ({type(exc).__name__}); "
                             f"e.g. postgresql://perfgate@db.example/perfgate or sqlite:///runs.sqlite") from None
    path = Path(spec).expanduser()
    if path.suffix in SQLITE_SUFFIXES:
        from perfgate.store.backends.sql import SqlStore

        if not create and not path.is_file():
            raise StoreError(f"results store {path}: no such SQLite file; push a run to it first "
                             f"(`perfgate store add --store {path} RESULTS.json`)")
        path.parent.mkdir(parents=True, exist_ok=True)
        return SqlStore(f"sqlite:///{path.resolve()}", create=create)
    from perfgate.store.backends.folder import FolderStore

    return FolderStore(path, create=create)
