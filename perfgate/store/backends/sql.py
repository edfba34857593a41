"""The results store in SQL: one schema and one code path for SQLite (the embedded default) and PostgreSQL.

Why SQLAlchemy Core (docs/results-store.md): the two databases differ in placeholders, binary types,
upserts and locking; Core writes each statement once, binds every value as a parameter (a test id
``x'); DROP TABLE perfgate_runs; --`` is a value, never SQL), and its URL object prints a URL with the
password masked. The only per-database lines below are how a writer takes the write lock.

Two tables. ``perfgate_runs``: one row per run or digest, keyed by the run's sha256, with its name,
hardware id, time, commit and gzipped bytes. ``perfgate_metrics``: one row per result, keyed by (run,
series), indexed by series (a hash of hardware id, test id and metric) and time, so a series is one
indexed query. A push writes the run and all its rows in one transaction: a writer killed mid-push
leaves nothing visible, and a second writer of the same run finds it stored and adds nothing.
Free text from documents (test ids, metric names, commits, times) is stored as UTF-8 bytes: PostgreSQL
text cannot hold NUL, and a stored name must read back exactly as written.
"""
from __future__ import annotations

import math
import time
from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.engine import URL, Engine, make_url

from perfgate.judge import signs
from perfgate.store.backends import documents
from perfgate.store.backends.base import ResultsStore, Stored, checked_raw
from perfgate.store.backends.documents import Entry, MetricRow, StoreError, StoreUnavailable

SCHEMA_VERSION = 1
_SCHEMA_LOCK = 0x70657266  # PostgreSQL advisory lock held while a writer creates the tables ("perf")


class Text8(sa.types.TypeDecorator):
    """A str stored as its UTF-8 bytes (lone surrogates kept): NUL and every other character round-trip."""

    impl = sa.LargeBinary
    cache_ok = True

    def process_bind_param(self, value, dialect):
        return None if value is None else value.encode("utf-8", "surrogatepass")

    def process_result_value(self, value, dialect):
        return None if value is None else bytes(value).decode("utf-8", "surrogatepass")


metadata = sa.MetaData()
meta = sa.Table("perfgate_store", metadata,
                sa.Column("key", sa.String(40), primary_key=True),
                sa.Column("value", sa.String(200), nullable=False))
runs = sa.Table("perfgate_runs", metadata,
                sa.Column("sha256", sa.String(64), primary_key=True),
                sa.Column("name", sa.String(200), nullable=False, unique=True),
                sa.Column("hardware_id", sa.String(80), nullable=False, index=True),
                sa.Column("created", Text8, nullable=False),
                sa.Column("commit", Text8),
                sa.Column("interrupted", sa.Boolean, nullable=False),
                sa.Column("digest", sa.Boolean, nullable=False),
                sa.Column("content", sa.LargeBinary, nullable=False),   # gzip of the stored bytes
                sa.Column("stored_at", sa.String(40), nullable=False))
metrics = sa.Table("perfgate_metrics", metadata,
                   sa.Column("run_sha256", sa.String(64), sa.ForeignKey("perfgate_runs.sha256", ondelete="CASCADE"),
                             primary_key=True),
                   sa.Column("series_key", sa.String(64), primary_key=True),
                   sa.Column("hardware_id", sa.String(80), nullable=False),
                   sa.Column("created", Text8, nullable=False),
                   sa.Column("area", sa.String(80), nullable=False),
                   sa.Column("test_id", Text8, nullable=False),
                   sa.Column("metric", Text8, nullable=False),
                   sa.Column("unit", sa.String(40), nullable=False),
                   sa.Column("better", sa.String(10), nullable=False),
                   sa.Column("tol", sa.Float, nullable=False),
                   sa.Column("gated", sa.Boolean, nullable=False),
                   sa.Column("median", sa.Float, nullable=False),
                   sa.Column("q1", sa.Float, nullable=False),
                   sa.Column("q3", sa.Float, nullable=False),
                   sa.Column("n", sa.BigInteger, nullable=False),
                   sa.Column("tainted", sa.Boolean, nullable=False),
                   sa.Column("outcome", sa.String(40), nullable=False),
                   sa.Column("baseline_median", sa.Float),
                   sa.Column("baseline_provenance", Text8),
                   sa.Index("perfgate_metrics_series", "series_key", "created"),
                   sa.Index("perfgate_metrics_hardware", "hardware_id", "created"))


def engine_url(spec: str) -> URL:
    """``postgresql://`` speaks through psycopg 3 (the [postgres] extra); ``sqlite:///PATH`` through Python's
    own sqlite3."""
    url = make_url(spec)
    if url.drivername in ("postgresql", "postgres"):
        url = url.set(drivername="postgresql+psycopg")
    return url


def shown_url(url: URL) -> str:
    """The URL as messages and pages show it: never its password."""
    return url.render_as_string(hide_password=True)


def _one_line(exc: BaseException, url: URL) -> str:
    """The driver's first line, with the password cut out should a driver ever echo it."""
    orig = getattr(exc, "orig", None) or exc
    line = next((x.strip() for x in str(orig).splitlines() if x.strip()), type(orig).__name__)
    if url.password:
        line = line.replace(str(url.password), "***")
    return line[:300]


class SqlStore(ResultsStore):
    """A results store in an SQLite file or a PostgreSQL database (perfgate.store.backends.open_store)."""

    def __init__(self, spec: str, *, create: bool):
        self.url = engine_url(spec)
        self.where = f"results store {shown_url(make_url(spec))}"
        self.sqlite = self.url.get_backend_name() == "sqlite"
        try:
            self.engine = self._engine()
            if create:
                self._create_schema()
            self._check_schema(create)
        except sa.exc.DBAPIError as exc:
            self.close()
            raise StoreUnavailable(f"{self.where}: cannot use it: {_one_line(exc, self.url)}") from None
        except ModuleNotFoundError as exc:
            raise StoreUnavailable(f"{self.where}: the driver {exc.name} is not installed: pip install "
                                   f"'perfgate[postgres]'") from None

    def _engine(self) -> Engine:
        if self.sqlite:
            # the driver's own transactions off: each transaction is begun below, a writer's with BEGIN
            # IMMEDIATE (the write lock first: two deferred writers deadlock on SQLite's lock upgrade)
            engine = sa.create_engine(self.url, connect_args={"timeout": 60})

            @event.listens_for(engine, "connect")
            def _connect(dbapi_connection, _record):
                dbapi_connection.isolation_level = None
                dbapi_connection.execute("PRAGMA foreign_keys=ON")
                dbapi_connection.execute("PRAGMA busy_timeout=60000")
                dbapi_connection.execute("PRAGMA journal_mode=WAL")  # readers never wait for a writer

            @event.listens_for(engine, "begin")
            def _begin(conn):
                conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get("write") else "BEGIN")
            return engine
        return sa.create_engine(self.url, pool_pre_ping=True, connect_args={"connect_timeout": 10})

    def _writing(self):
        """A connection whose transaction holds the write lock from its start (SQLite)."""
        return self.engine.connect().execution_options(write=True)

    def _create_schema(self) -> None:
        with self._writing() as conn, conn.begin():
            if not self.sqlite:  # eight writers starting at once create the tables once
                conn.execute(sa.select(sa.func.pg_advisory_xact_lock(_SCHEMA_LOCK)))
            metadata.create_all(conn, checkfirst=True)
            conn.execute(sa.insert(meta).from_select(
                ["key", "value"], sa.select(sa.literal("schema_version"), sa.literal(str(SCHEMA_VERSION))).where(
                    ~sa.exists().where(meta.c.key == "schema_version"))))

    def _check_schema(self, create: bool) -> None:
        with self.engine.connect() as conn:
            if not sa.inspect(conn).has_table("perfgate_store"):
                self.empty = True
                return
            version = conn.execute(sa.select(meta.c.value).where(meta.c.key == "schema_version")).scalar()
        self.empty = False
        if version != str(SCHEMA_VERSION):
            raise StoreError(f"{self.where}: schema version {version!r}, this perfgate reads {SCHEMA_VERSION}; "
                             f"use the perfgate that wrote it, or copy it into a new store with that perfgate")

    # --- writing -------------------------------------------------------------------------------
    def _put(self, entry: Entry, raw: bytes, rows: list[MetricRow]) -> Stored:
        row = {"sha256": entry.sha256, "name": entry.name, "hardware_id": entry.hardware_id,
               "created": entry.created, "commit": entry.commit, "interrupted": entry.interrupted,
               "digest": entry.digest, "content": documents.packed(raw),
               "stored_at": datetime.now(timezone.utc).isoformat(timespec="seconds")}
        try:
            with self._writing() as conn, conn.begin():
                found = conn.execute(sa.select(runs.c.sha256, runs.c.name, runs.c.digest).where(
                    (runs.c.sha256 == entry.sha256) | (runs.c.name == entry.name))).all()
                same = next((f for f in found if f.sha256 == entry.sha256), None)
                other = next((f for f in found if f.sha256 != entry.sha256), None)
                if same is not None and not (same.digest and not entry.digest):
                    return Stored(self._entry_where(conn, runs.c.sha256 == entry.sha256), added=False)
                if other is not None:
                    raise StoreError(f"{self.where}: {entry.name} already holds another run (sha256 "
                                     f"{other.sha256[:12]}); store this one under another name (--as NAME)")
                if same is not None:  # the whole run replaces its digest
                    conn.execute(sa.delete(metrics).where(metrics.c.run_sha256 == entry.sha256))
                    conn.execute(sa.delete(runs).where(runs.c.sha256 == entry.sha256))
                insert = self._insert_once(runs, ["sha256"]).values(row).returning(runs.c.sha256)
                inserted = conn.execute(insert).first()
                if inserted is None:  # another writer's push of this run committed while this one waited
                    # (RETURNING, not rowcount: psycopg's rowcount of this INSERT read -1 in 7 of 12 races)
                    return Stored(self._entry_where(conn, runs.c.sha256 == entry.sha256), added=False)
                if rows:
                    conn.execute(self._insert_once(metrics, ["run_sha256", "series_key"]), [_metric_row(r) for r in rows])
                stored = self._entry_where(conn, runs.c.sha256 == entry.sha256)
        except sa.exc.IntegrityError:
            # another writer stored the same name or run between the look-up and the insert (PostgreSQL
            # checks the unique name at the insert): what is stored now decides
            return self._after_race(entry)
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailable(f"{self.where}: {entry.name} not stored: {_one_line(exc, self.url)}") from None
        return Stored(stored, added=True)

    def _after_race(self, entry: Entry) -> Stored:
        found = self.entry(entry.sha256)
        if found is not None and (found.digest == entry.digest or not found.digest):
            return Stored(found, added=False)
        raise StoreError(f"{self.where}: {entry.name} already holds another run; store this one under another name "
                         f"(--as NAME)")

    def _insert_once(self, table: sa.Table, key: list[str]):
        """INSERT ... ON CONFLICT DO NOTHING, in the dialect of this database (same SQL text in both)."""
        if self.sqlite:
            from sqlalchemy.dialects.sqlite import insert
        else:
            from sqlalchemy.dialects.postgresql import insert
        return insert(table).on_conflict_do_nothing(index_elements=key)

    # --- reading -------------------------------------------------------------------------------
    def _read(self, statement):
        try:
            with self.engine.connect() as conn:
                return conn.execute(statement).all()
        except sa.exc.DBAPIError as exc:
            raise StoreUnavailable(f"{self.where}: cannot read it: {_one_line(exc, self.url)}") from None

    _ENTRY_COLUMNS = (runs.c.sha256, runs.c.name, runs.c.hardware_id, runs.c.created, runs.c.commit,
                      runs.c.interrupted, runs.c.digest)

    def _entry_where(self, conn, condition) -> Entry:
        return _entry(conn.execute(sa.select(*self._ENTRY_COLUMNS).where(condition)).one())

    def entries(self, hardware_id: str | None = None) -> list[Entry]:
        if self.empty or not documents.could_be_stored(hardware_id):
            return []
        q = sa.select(*self._ENTRY_COLUMNS).order_by(runs.c.created, runs.c.name)
        if hardware_id is not None:
            q = q.where(runs.c.hardware_id == hardware_id)
        return [_entry(r) for r in self._read(q)]

    def entry(self, key: str) -> Entry | None:
        if self.empty or not isinstance(key, str):
            return None
        if documents.SHA256.fullmatch(key):
            found = self._read(sa.select(*self._ENTRY_COLUMNS).where(runs.c.sha256 == key))
        elif 12 <= len(key) < 64 and all(ch in "0123456789abcdef" for ch in key):
            found = self._read(sa.select(*self._ENTRY_COLUMNS).where(runs.c.sha256.startswith(key, autoescape=True))
                               .limit(2))
            if len(found) > 1:
                raise StoreError(f"{self.where}: {key} is the start of several runs' sha256; give more digits")
        elif documents.could_be_stored(name=key):
            found = self._read(sa.select(*self._ENTRY_COLUMNS).where(runs.c.name == key))
        else:
            found = []
        return _entry(found[0]) if found else None

    def raw(self, sha256: str) -> bytes:
        entry = self.require(sha256)
        content = self._read(sa.select(runs.c.content).where(runs.c.sha256 == entry.sha256))[0][0]
        raw = documents.gunzipped(bytes(content), f"{self.where}: {entry.name}")
        return checked_raw(entry, raw, self.where)

    def metric_rows(self, hardware_id: str | None = None) -> list[MetricRow]:
        if self.empty or not documents.could_be_stored(hardware_id):
            return []
        q = _rows_query().order_by(metrics.c.created, runs.c.name)
        if hardware_id is not None:
            q = q.where(metrics.c.hardware_id == hardware_id)
        return [_metric(r) for r in self._read(q)]

    def series(self, hardware_id: str, test_id: str, metric: str) -> list[MetricRow]:
        if self.empty or not documents.could_be_stored(hardware_id):
            return []
        key = documents.series_key(hardware_id, test_id, metric)
        q = _rows_query().where(metrics.c.series_key == key).order_by(metrics.c.created, runs.c.name)
        return [_metric(r) for r in self._read(q)]

    def close(self) -> None:
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.dispose()


def _rows_query():
    return sa.select(metrics, runs.c.name, runs.c.commit).join(runs, runs.c.sha256 == metrics.c.run_sha256)


def _entry(r) -> Entry:
    return Entry(sha256=r.sha256, name=r.name, hardware_id=r.hardware_id, created=r.created, commit=r.commit,
                 interrupted=bool(r.interrupted), digest=bool(r.digest))


def _metric_row(r: MetricRow) -> dict:
    return {"run_sha256": r.sha256, "series_key": documents.series_key(r.hardware_id, r.test_id, r.metric),
            "hardware_id": r.hardware_id, "created": r.created, "area": r.area, "test_id": r.test_id,
            "metric": r.metric, "unit": r.unit, "better": r.better, "tol": r.tol, "gated": r.gated,
            "median": r.median, "q1": r.q1, "q3": r.q3, "n": r.n, "tainted": r.tainted, "outcome": r.outcome,
            "baseline_median": r.baseline_median, "baseline_provenance": r.baseline_provenance}


def _metric(r) -> MetricRow:
    """A row as read back, its numbers checked: a database edited by hand is read like a file edited by hand."""
    where = f"metric row of run {r.run_sha256[:12]}"
    values = {name: getattr(r, name) for name in ("tol", "median", "q1", "q3", "baseline_median")}
    for name, value in values.items():
        if value is None and name == "baseline_median":
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise StoreError(f"{where}: {name} {value!r} is not a finite number; store the run again")
    # quartiles derived from an IQR may dip below zero around a small rate: only measured values are signed
    problem = signs.problem(r.unit, [v for k, v in values.items() if k in ("median", "baseline_median") and v is not None])
    if problem or r.n < 1 or r.tol < 0 or not r.q1 <= r.median <= r.q3:
        raise StoreError(f"{where}: {problem or f'n {r.n}, tol {r.tol}, quartiles {r.q1}..{r.q3}'}: not a summary "
                         f"of a measurement; store the run again")
    return MetricRow(sha256=r.run_sha256, name=r.name, hardware_id=r.hardware_id, created=r.created,
                     commit=r.commit, area=r.area, test_id=r.test_id, metric=r.metric, unit=r.unit,
                     better=r.better, tol=r.tol, gated=r.gated, median=r.median, q1=r.q1, q3=r.q3, n=r.n,
                     tainted=r.tainted, outcome=r.outcome, baseline_median=r.baseline_median,
                     baseline_provenance=r.baseline_provenance)


def wait_until_reachable(spec: str, timeout_s: float) -> None:
    """Test and load-test helper: retry opening until the server answers (a restart in progress)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            SqlStore(spec, create=False).close()
            return
        except StoreUnavailable:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
