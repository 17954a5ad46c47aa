"""All identity-store I/O: SQLite by default, PostgreSQL by URL, both through SQLAlchemy 2 Core.

Writers are serialised by the database itself: SQLite's `BEGIN IMMEDIATE` (with WAL and a busy
timeout) or PostgreSQL's transaction-scoped advisory lock. Inside that lock the service first
catches up with the change feed, so every decision is made on the latest committed state; this is
what makes concurrent calls from many server processes equal some one-at-a-time order.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    and_,
    bindparam,
    create_engine,
    event,
    func,
    make_url,
    or_,
    select,
    update,
)
from sqlalchemy.exc import ArgumentError, DBAPIError, OperationalError, SQLAlchemyError

from identity_server import json_text
from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.errors import StoreUnavailable
from identity_server.store import schema as t
from identity_server.store.wal_index import WalIndexHeader, own_commit_marker

logger = logging.getLogger(__name__)

_PG_LOCK_KEY = 0x1D_E7_17  # the advisory lock that serialises identity writes
RETIRED = "retired"
WAL_SIZE_LIMIT = 64 * 1024 * 1024  # a WAL file bigger than this is cut back when it starts over
RESTART_AT_FRAMES = 1000  # a WAL this long (4 MB of pages) is started over (see _Checkpointer)
_TAIL_FRAMES = 200  # what a checkpoint leaves for the writer to copy, at most (mostly)
_CATCH_UP_PASSES = 4


@dataclass(frozen=True, slots=True)
class ChangeRecord:
    """One event of the change feed."""

    seq: int
    kind: str
    entity_id: str
    other_id: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    recorded_at: float = 0.0


@dataclass(frozen=True, slots=True)
class NameRow:
    display: str
    kind: str  # a NameKind value or "retired"
    position: int
    source: str


@dataclass(frozen=True, slots=True)
class LinkRow:
    a: str
    b: str
    state: str
    created_seq: int


def ordered_pair(x: str, y: str) -> tuple[str, str]:
    return (x, y) if x < y else (y, x)


_CLOSE_WAIT_S = 5.0  # close() waits this long for a write in progress
# A write waiting for another connection's lock asks SQLite to wait this long at a time, up to
# the busy timeout: SQLite's own wait cannot be cut short, and a store that closes meanwhile
# must not keep a thread waiting for a minute.
_WAIT_SLICE_S = 0.25
# Stored values to enums by dict lookup (Enum's own call costs ~3 µs a row read).
_KINDS = {k.value: k for k in NameKind}
_STATUSES = {st.value: st for st in Status}


class WouldBlock(Exception):
    """A write asked not to wait would have had to (the caller then writes where it may wait)."""


class SqlStore:
    """Owns the engine; hands out read and locked write transactions."""

    def __init__(self, url: str, *, busy_timeout_s: float = 60.0,
                 checkpoint_every_s: float = 1.0) -> None:
        self.url = url
        self.is_sqlite = url.startswith("sqlite")
        self._busy_timeout_s = busy_timeout_s
        self._closing = False
        # PostgreSQL connections waiting for the replicas' write lock (close() cancels the wait),
        # and the write transactions under way (close() gives them time to finish).
        self._waiting_for_lock: set[Any] = set()
        self._pg_writes = 0
        self._pg_writes_done = threading.Condition()
        self._watch: sqlite3.Connection | None = None
        self._wal_header: WalIndexHeader | None = None
        self._checkpointer: _Checkpointer | None = None
        self._watch_lock = threading.Lock()
        # SQLite: one connection kept for every write of this process (writes are serialised
        # anyway), instead of a pool checkout, begin and return per transaction: a third of a
        # small write transaction's cost.
        self._writer: Connection | None = None
        self._writer_lock = threading.Lock()
        # The kept writer's busy timeout as last set (ms; None: as opened), and the one its
        # statements need inside a write transaction: the whole one in a rollback journal,
        # whose COMMIT waits for readers; any in WAL mode (None), where a transaction holding
        # the write lock waits on nothing, so the timeout its BEGIN waited with stays, and a
        # PRAGMA runs only when a BEGIN needs another (one that must not wait, after one that
        # may).
        self._writer_busy_ms: int | None = None
        self._writer_inside_ms: int | None = None
        _check_url(url)
        database = _sqlite_file(url)  # None: PostgreSQL
        if database is not None and not os.path.isdir(os.path.dirname(database) or "."):
            raise StoreUnavailable(  # SQLite would say only "unable to open database file"
                f"cannot open the identity store at {url}: the directory "
                f"{os.path.dirname(database)!r} does not exist")
        try:
            if self.is_sqlite:
                self.engine: Engine = create_engine(
                    url,
                    connect_args={"timeout": busy_timeout_s, "check_same_thread": False},
                )
                _configure_sqlite(self.engine, checkpoint_in_background=database is not None)
            else:
                self.engine = create_engine(url, pool_pre_ping=True, pool_size=8,
                                            connect_args=_pg_connect_args(url))
                _configure_postgres(self.engine, _pg_session_settings(url, busy_timeout_s))
            t.metadata.create_all(self.engine)
            if database is not None:
                self._watch = _side_connection(database)
                self._wal_header = WalIndexHeader.open(database, self._watch)
                self._checkpointer = _Checkpointer(database, checkpoint_every_s)
        except (SQLAlchemyError, sqlite3.Error) as e:
            cause = e.orig if isinstance(e, DBAPIError) and e.orig is not None else e
            raise StoreUnavailable(
                f"cannot open the identity store at {_safe(url)}: {cause}") from e

    def close(self) -> None:
        """Close the store; no write starts after this, and one waiting for another process's
        write lock gives up within a quarter second. A write in progress gets a few seconds to
        finish; one still running then is left to fail on its own."""
        self._closing = True
        if self._checkpointer is not None:
            self._checkpointer.close()
        header, self._wal_header = self._wal_header, None
        if self._watch is not None:
            self._watch.close()
        finished = self._end_pg_writes()
        if finished and self._writer_lock.acquire(timeout=_CLOSE_WAIT_S):
            try:
                self._drop_writer()
            finally:
                self._writer_lock.release()
        else:
            logger.warning("closing the store while a write is still under way after %.0f s",
                           _CLOSE_WAIT_S)
            header = None  # its file stays open while that write's connection may be
        self.engine.dispose()
        if header is not None:  # last: every connection of this store is closed
            header.close()

    def _end_pg_writes(self) -> bool:
        """Cancel PostgreSQL writes waiting for the replicas' lock (again each slice: one may
        have been about to wait when the store began closing) and give those under way up to
        _CLOSE_WAIT_S to finish; whether they all did."""
        deadline = time.monotonic() + _CLOSE_WAIT_S
        with self._pg_writes_done:
            while self._pg_writes:
                for waiting in list(self._waiting_for_lock):
                    waiting.cancel()  # psycopg: thread-safe, asks the server to end the statement
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._pg_writes_done.wait(min(left, _WAIT_SLICE_S))
        return True

    def commit_marker(self) -> bytes | None:
        """A value that changes whenever anything is committed, or None when the store cannot
        tell (then callers must look). SQLite: the wal-index header, which every commit of any
        connection, in any process, rewrites; read from the -shm file mapped into memory, so
        asking costs no statement, no system call and no hand-over of the GIL (a statement
        cost a read a tenth of the server's throughput). Where the file cannot be mapped,
        `PRAGMA data_version` on a connection that never writes, which moves on the same
        commits."""
        header = self._wal_header
        if header is not None:
            return header.read()
        if self._watch is None:
            return None
        with self._watch_lock:
            version = int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        return version.to_bytes(8, "little")

    def commit_state(self) -> tuple[bytes | None, int]:
        """(commit_marker(), the newest change-feed sequence number), where the number is at
        least as new as the commit the marker stands for: the marker is read first, so a commit
        made in between can only make the two look out of step (callers then look again),
        never make the marker look newer than the number."""
        if self._watch is None:
            with self.read() as tx:
                return None, tx.max_seq()
        marker = self.commit_marker()
        with self._watch_lock:
            (last,) = self._watch.execute(
                "SELECT coalesce(max(seq), 0) FROM changes").fetchone()
        return marker, int(last)

    def write(self, *, wait: bool = True) -> AbstractContextManager[Tx]:
        """A transaction holding the store-wide write lock; commits when the block succeeds.

        With wait=False it raises WouldBlock instead of waiting for the lock, before anything
        is done: this process's other writer, another process's write transaction (SQLite), or
        a network round trip per statement (PostgreSQL: never taken without waiting).

        The transaction itself is the context manager, not wrapped in another: every Resolve
        that writes opens one."""
        return self._transaction(write=True, wait=wait)

    def read(self) -> AbstractContextManager[Tx]:
        return self._transaction(write=False)

    @contextmanager
    def _transaction(self, *, write: bool, wait: bool = True) -> Iterator[Tx]:
        if not wait and not (write and self.is_sqlite):
            raise WouldBlock("only SQLite writes can be tried without waiting")
        if write and self._closing:
            raise StoreUnavailable("the identity store is closing")
        try:
            if write and self.is_sqlite:
                if not self._writer_lock.acquire(blocking=wait):
                    raise WouldBlock("this process's other writer holds the write connection")
                try:
                    conn = self._writer_connection()
                    driver = conn.connection.driver_connection
                    assert driver is not None
                    if wait:
                        self._begin_waiting(conn, driver)
                    else:
                        self._begin_at_once(conn, driver)
                    header = self._wal_header
                    try:
                        before = header.read() if header is not None else None
                        changes = driver.total_changes
                        tx = Tx(conn, True, driver)
                        yield tx
                        wrote = driver.total_changes != changes
                        if conn.in_transaction():  # a Core statement joined the transaction
                            conn.commit()  # SQLAlchemy's commit: the driver's COMMIT
                        else:
                            driver.commit()
                        if before is not None and header is not None:
                            tx.commit_marker = own_commit_marker(before, header.read(), wrote)
                        if self._checkpointer is not None and self._checkpointer.tail_due:
                            self._checkpointer.copy_tail(driver)
                    except BaseException:
                        self._drop_writer()  # rolls back what is open; the next write starts afresh
                        raise
                finally:
                    self._writer_lock.release()
                return
            if not write:
                with self.engine.connect() as conn:
                    conn.info["write"] = False  # the pool's connections keep their info
                    if not self.is_sqlite:
                        # One snapshot for the whole read, as SQLite's read transaction has: at
                        # READ COMMITTED each statement sees the commits made since the last,
                        # so an index catching up could read a change from the feed and the
                        # rows of a later commit, a state that never was. Writes stay at READ
                        # COMMITTED: they read after taking the replicas' lock, and a snapshot
                        # taken before it would miss the commit that waited for.
                        conn.execution_options(isolation_level="REPEATABLE READ",
                                               postgresql_readonly=True)
                    with conn.begin():
                        yield Tx(conn, self.is_sqlite)
                return
            with self._pg_writes_done:
                self._pg_writes += 1
            try:
                with self.engine.connect() as conn:
                    conn.info["write"] = True
                    with conn.begin():
                        self._lock_pg(conn)
                        yield Tx(conn, self.is_sqlite)
            finally:
                with self._pg_writes_done:
                    self._pg_writes -= 1
                    self._pg_writes_done.notify_all()
        except DBAPIError as e:
            if e.connection_invalidated or isinstance(e.orig, _operational_errors()):
                raise StoreUnavailable(f"identity store error: {e.orig}") from e
            raise
        except _operational_errors() as e:  # from a statement run on the driver's own cursor
            raise StoreUnavailable(f"identity store error: {e}") from e

    def _lock_pg(self, conn: Connection) -> None:
        """The advisory lock that serialises writes across replicas; waiting for it ends at the
        busy timeout (lock_timeout: see _pg_session_settings), or at once when the store closes."""
        driver = conn.connection.driver_connection
        self._waiting_for_lock.add(driver)
        try:
            if self._closing:
                raise StoreUnavailable("the identity store is closing")
            conn.execute(select(func.pg_advisory_xact_lock(_PG_LOCK_KEY)))
        except OperationalError as e:
            if self._closing:
                raise StoreUnavailable("the identity store is closing") from e
            if getattr(e.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            raise StoreUnavailable(
                f"another server process has held the store's write lock for more than "
                f"{self._busy_timeout_s:g} s; try again (a process hung inside a transaction "
                f"loses the lock after {PG_IDLE_IN_TRANSACTION_S} s)") from e
        finally:
            self._waiting_for_lock.discard(driver)

    def _begin_at_once(self, conn: Connection, driver: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE with no busy wait: WouldBlock when another connection writes (once
        begun, a WAL write transaction waits on nothing: readers never block it)."""
        self._set_writer_busy_ms(conn, 0)
        try:
            driver.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as e:
            if _locked(e):
                raise WouldBlock("another connection holds the store's write lock") from e
            raise
        finally:
            if self._writer_inside_ms is not None:
                self._set_writer_busy_ms(conn, self._writer_inside_ms)

    def _begin_waiting(self, conn: Connection, driver: sqlite3.Connection) -> None:
        """BEGIN IMMEDIATE, waiting up to the busy timeout for another connection's write lock,
        a slice at a time: once the store is closing, the wait ends within a slice (then
        StoreUnavailable), instead of running out the whole timeout on a thread nobody waits
        for (SQLite's own wait cannot be cut short). Statements inside the transaction keep the
        busy timeout they need."""
        deadline = time.monotonic() + self._busy_timeout_s
        self._set_writer_busy_ms(conn, int(min(self._busy_timeout_s, _WAIT_SLICE_S) * 1000))
        try:
            while True:
                try:
                    driver.execute("BEGIN IMMEDIATE")
                    return
                except sqlite3.OperationalError as e:
                    if not _locked(e) or time.monotonic() >= deadline:
                        raise
                    if self._closing:
                        raise StoreUnavailable("the identity store is closing") from e
        finally:
            if self._writer_inside_ms is not None:
                self._set_writer_busy_ms(conn, self._writer_inside_ms)

    def _set_writer_busy_ms(self, conn: Connection, ms: int) -> None:
        """Give the kept writer this busy timeout, with a statement only when it changes."""
        if ms != self._writer_busy_ms:
            driver = conn.connection.driver_connection
            assert driver is not None
            driver.execute(f"PRAGMA busy_timeout={ms}")
            self._writer_busy_ms = ms

    def _writer_connection(self) -> Connection:
        """The kept SQLite write connection (under _writer_lock), opened on first use."""
        if self._writer is None:
            conn = self.engine.connect()
            conn.info["write"] = True
            driver = conn.connection.driver_connection
            assert driver is not None
            (mode,) = driver.execute("PRAGMA journal_mode").fetchone()
            self._writer_inside_ms = None if mode == "wal" else int(self._busy_timeout_s * 1000)
            self._writer_busy_ms = None  # as opened: the engine's timeout
            self._writer = conn
        return self._writer

    def _drop_writer(self) -> None:
        """Close the kept write connection (under _writer_lock), if any."""
        conn, self._writer = self._writer, None
        if conn is not None:
            try:
                conn.close()
            except SQLAlchemyError:  # pragma: no cover - closing a broken connection
                logger.warning("closing the store's write connection failed", exc_info=True)


def _locked(e: Exception) -> bool:
    """Whether a SQLite error says another connection holds the lock (SQLITE_BUSY)."""
    return "locked" in str(e) or "busy" in str(e)


def _check_url(url: str) -> None:
    """Refuse, with what to write instead, a store URL that would fail deep inside SQLAlchemy
    (an unknown scheme, a driver that is not installed) or not fail at all: SQLite in memory
    is a database per connection, lost at exit."""
    forms = ("the identity store is SQLite (sqlite:///PATH) or PostgreSQL "
             "(postgresql://USER@HOST:PORT/DATABASE, through psycopg)")
    if "://" not in url:
        raise StoreUnavailable(f"the store URL {_safe(url)!r} has no scheme: {forms}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        return  # create_engine names the problem
    backend, _, driver = parsed.drivername.partition("+")
    if backend == "sqlite" and driver in ("", "pysqlite"):
        if parsed.host:
            raise StoreUnavailable(
                f"the store URL {url!r} names a host, not a file: a SQLite URL has three "
                f"slashes before a relative path (sqlite:///{parsed.host}), four before an "
                "absolute one")
        if parsed.database in (None, "", ":memory:"):
            raise StoreUnavailable(
                f"the store URL {url!r} names no file (SQLite in memory would be a database per "
                "connection, lost at exit): write sqlite:///identity.sqlite, say")
    elif backend in ("postgresql", "postgres") and driver in ("", "psycopg"):
        if backend == "postgres":
            raise StoreUnavailable(f"unsupported store URL {_safe(url)}: write postgresql://, "
                                   f"not postgres:// ({forms})")
    else:
        raise StoreUnavailable(f"unsupported store URL {_safe(url)}: {forms}")


# PostgreSQL is a network service, so every wait on it is bounded, as SQLite's are by the busy
# timeout: connecting, a server or a network that stops answering (TCP keepalives; unacknowledged
# data), another replica's write lock (lock_timeout, the busy timeout), and a session that holds
# it while doing nothing (a replica hung inside a transaction: PostgreSQL ends the session, so
# the others go on). The first are libpq's own parameters; the last two are set by a statement
# on each new connection rather than as startup options, which a pooler such as PgBouncer
# refuses. Whatever the URL sets itself (a parameter, or `options=-c name=value`) is left alone.
PG_CONNECT_TIMEOUT_S = 10
PG_IDLE_IN_TRANSACTION_S = 60
_PG_TCP = {"keepalives": 1, "keepalives_idle": 30, "keepalives_interval": 10,
           "keepalives_count": 3, "tcp_user_timeout": 60_000}


def _pg_connect_args(url: str) -> dict[str, Any]:
    """libpq parameters bounding connecting and a silent peer, unless the URL sets them."""
    given = make_url(url).query
    return {name: value
            for name, value in {"connect_timeout": PG_CONNECT_TIMEOUT_S, **_PG_TCP}.items()
            if name not in given}


def _pg_session_settings(url: str, busy_timeout_s: float) -> dict[str, str]:
    """Server settings bounding lock waits and idle transactions, unless the URL's options
    set them."""
    options = make_url(url).query.get("options", "")
    options = " ".join(options) if isinstance(options, tuple) else options
    settings = {"lock_timeout": f"{max(1, round(busy_timeout_s * 1000))}ms",
                "idle_in_transaction_session_timeout": f"{PG_IDLE_IN_TRANSACTION_S * 1000}ms"}
    return {name: value for name, value in settings.items() if name not in options}


def _configure_postgres(engine: Engine, settings: dict[str, str]) -> None:
    """Each new connection gets `settings` for its session (committed: a SET inside a
    transaction that rolls back would be undone)."""
    if not settings:
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            for name, value in settings.items():
                cur.execute("SELECT set_config(%s, %s, false)", (name, value))
        dbapi_conn.commit()


def _sqlite_file(url: str) -> str | None:
    """The SQLite database file of a store URL, or None (PostgreSQL)."""
    if not url.startswith("sqlite"):
        return None
    database = make_url(url).database
    return database if database and database != ":memory:" else None


def _side_connection(database: str) -> sqlite3.Connection:
    """A plain sqlite3 connection beside the engine's, in autocommit (the change watch, the
    checkpointer): it never begins a transaction of its own."""
    return sqlite3.connect(database, check_same_thread=False, isolation_level=None)


def _operational_errors() -> tuple[type[BaseException], ...]:
    errors: list[type[BaseException]] = [sqlite3.OperationalError]
    try:
        import psycopg

        errors.append(psycopg.OperationalError)
    except ImportError:  # pragma: no cover - psycopg is a dependency
        pass
    return tuple(errors)


def _configure_sqlite(engine: Engine, *, checkpoint_in_background: bool) -> None:
    """WAL, a busy timeout, and transactions we begin ourselves (IMMEDIATE for writers); with
    a background checkpointer, no checkpoint inside a commit."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let the "begin" hook below issue BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute("PRAGMA synchronous=NORMAL")
        cur.execute("PRAGMA foreign_keys=ON")
        if checkpoint_in_background:
            cur.execute("PRAGMA wal_autocheckpoint=0")
            cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver's connection: SQLAlchemy's statement layers would cost more than BEGIN.
        # The kept writer's transactions are begun on the driver (SqlStore._transaction): a
        # Core statement run inside one joins it.
        driver = conn.connection.driver_connection
        assert driver is not None
        if not driver.in_transaction:
            driver.execute("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")


class _Checkpointer:
    """Copies a SQLite WAL's committed pages into the database file from a thread of its own.

    SQLite's automatic checkpoint runs inside whichever commit takes the WAL past 1,000 pages,
    with the write lock held and the file synced: every writer waits for it (a seventh of a
    ResolveBatch's time). A PASSIVE checkpoint on another connection blocks no reader and no
    writer. But a writer starts the WAL over only when it begins with every frame copied, and
    under a steady stream of writes one is always under way while the copy runs, its frames
    newer than the copy: the WAL would grow without end, every commit extending the file (on
    Linux 6.18's ext4, a few pages written past the end cost ~100 µs of kernel time, against
    ~25 µs over pages written before). So once the WAL holds RESTART_AT_FRAMES, the copy is
    repeated while each pass finds many new frames (each pass shorter than the last), and then
    this process's next writer, right after its commit, copies what is left (`copy_tail`: what
    the last pass missed, once a period; it syncs the database file, 5-50 ms under the
    benchmarks' load), and its next transaction starts the WAL over.
    """

    def __init__(self, database: str, every_s: float) -> None:
        self._conn = _side_connection(database)
        self._every_s = every_s
        self.tail_due = False  # the WAL is long: the next writer copies its tail
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failing = False
        while not self._stop.wait(self._every_s):
            try:
                self._checkpoint()
            except sqlite3.Error:
                if not failing:  # once per run of failures, not once a second
                    logger.warning("checkpointing the store's WAL failed; it keeps growing "
                                   "until a checkpoint succeeds", exc_info=True)
                failing = True
            else:
                failing = False

    def _checkpoint(self) -> None:
        """Copy the WAL; while that copy ran, writers added frames: copy those too (a shorter
        copy each pass) until a pass finds few new, then leave the last few to the writer."""
        frames = self._copy()
        for _ in range(_CATCH_UP_PASSES):
            if frames < RESTART_AT_FRAMES:
                break
            before, frames = frames, self._copy()
            if frames - before < _TAIL_FRAMES:  # also when the WAL started over meanwhile
                break
        self.tail_due = frames >= RESTART_AT_FRAMES

    def _copy(self) -> int:
        """A PASSIVE checkpoint; the frames in the WAL when it began."""
        _, frames, _ = self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
        return int(frames)

    def copy_tail(self, writer: sqlite3.Connection) -> None:
        """On the writer's connection, between its transactions, with this process's other
        writers held off: what the last copy left, so the next transaction starts the WAL over
        (unless a reader still reads old frames: then next period). Never fails the write."""
        self.tail_due = False
        try:
            writer.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()
        except sqlite3.Error:
            logger.debug("copying the WAL's tail failed; the next period tries again",
                         exc_info=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self._conn.close()


def _safe(url: str) -> str:
    """The URL without a password, for messages."""
    if "@" in url and "://" in url:
        scheme, rest = url.split("://", 1)
        return f"{scheme}://***@{rest.split('@', 1)[1]}"
    return url


class _Statements:
    """Statements built once per dialect, so SQLAlchemy compiles each only once.

    Those a resolve or a batch runs (names, evidence, entities, the change feed, links,
    placeholders, the stored reply) are plain SQL run on the driver's own cursor: the text is the
    same for SQLite and PostgreSQL (both have `ON CONFLICT ... DO UPDATE`), only the parameter
    style differs, and SQLAlchemy's per-statement layers cost more than the driver's work (a
    placeholder lookup built as a Core select took 104 µs on SQLite, the same query on the
    cursor 3 µs). Their parameters are positional, given as tuples in the order the statement
    names them: binding a row from a dict by name cost sqlite3 a quarter more.
    """

    def __init__(self, is_sqlite: bool) -> None:
        mark = "?" if is_sqlite else "%s"  # a positional parameter in the driver's style

        def raw(table: str, columns: tuple[str, ...], tail: str = "") -> str:
            marks = ", ".join(mark for _ in columns)
            return f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({marks}){tail}"

        def equal(*columns: str) -> str:
            return " AND ".join(f"{c} = {mark}" for c in columns)

        self.upsert_names = raw(
            "names", ("entity_id", "display", "kind", "position", "source"),
            " ON CONFLICT (entity_id, display) DO UPDATE SET kind = excluded.kind,"
            " position = excluded.position, source = excluded.source",
        )
        self.add_evidence = raw(
            "evidence", ("entity_id", "context_id", "surface", "raw_type", "count"),
            " ON CONFLICT (entity_id, context_id, surface, raw_type)"
            " DO UPDATE SET count = evidence.count + excluded.count",
        )
        self.insert_entity = raw(
            "entities", ("entity_id", "ordinal", "entity_type", "status", "placeholder",
                         "redirect_to", "created_at"),
        )
        self.insert_changes = raw(
            "changes", ("seq", "kind", "entity_id", "other_id", "detail", "recorded_at")
        )
        # A new or ambiguous mention with candidates looks up and writes a link per candidate.
        self.upsert_link = raw(
            "links", ("a", "b", "state", "created_seq", "actor", "reason", "decided_at"),
            " ON CONFLICT (a, b) DO UPDATE SET state = excluded.state, actor = excluded.actor,"
            " reason = excluded.reason, decided_at = excluded.decided_at",
        )
        self.link = "SELECT a, b, state, created_seq FROM links WHERE " + equal("a", "b")
        # Every ambiguous mention looks up its placeholder; the first makes it.
        self.insert_placeholder = raw("placeholders", ("display", "entity_type", "entity_id"))
        self.placeholder = "SELECT entity_id FROM placeholders WHERE " + equal(
            "display", "entity_type")
        self.upsert_reply = raw(
            "batch_replies", ("request_hash", "reply", "created_at"),
            " ON CONFLICT (request_hash) DO UPDATE SET reply = excluded.reply,"
            " created_at = excluded.created_at",
        )
        self.changes_after = (
            select(t.changes).where(t.changes.c.seq > bindparam("after")).order_by(t.changes.c.seq)
        )
        # Every batch with a context asks this first, and nearly always gets nothing back.
        self.batch_reply = (
            f"SELECT reply FROM batch_replies WHERE {equal('request_hash')}"
            f" AND created_at >= {mark}"
        )
        # Every write transaction asks this first, and nearly always gets nothing back.
        self.changes_after_raw = (
            "SELECT seq, kind, entity_id, other_id, detail, recorded_at FROM changes"
            f" WHERE seq > {mark} ORDER BY seq"
        )


_STATEMENTS: dict[bool, _Statements] = {}


class Tx:
    """One transaction's operations. Every method is a small statement or two.

    After a SQLite write transaction commits, `commit_marker` is the store's commit marker as
    that commit left it, when it is known that no other commit came after it (else None)."""

    def __init__(self, conn: Connection, is_sqlite: bool, driver: Any = None) -> None:
        self.conn = conn
        self._raw = driver  # the driver's connection, when the caller has it at hand
        self.commit_marker: bytes | None = None
        self._is_sqlite = is_sqlite
        if is_sqlite not in _STATEMENTS:
            _STATEMENTS[is_sqlite] = _Statements(is_sqlite)
        self._sql = _STATEMENTS[is_sqlite]

    def _driver(self) -> Any:
        """The driver's own connection under this transaction (sqlite3 or psycopg)."""
        raw = self._raw or self.conn.connection.driver_connection
        assert raw is not None
        return raw

    def _driver_one(self, sql: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """The first row of a query on the driver connection, in this transaction."""
        cursor = self._driver().cursor()
        try:
            cursor.execute(sql, params)
            row: tuple[Any, ...] | None = cursor.fetchone()
            return row
        finally:
            cursor.close()

    def _driver_many(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        """One statement for many rows on the driver connection, in this transaction."""
        cursor = self._driver().cursor()
        try:
            cursor.executemany(sql, rows)
        finally:
            cursor.close()

    # -- entities ------------------------------------------------------------------------------

    def load_entities(self, ids: Iterable[str]) -> dict[str, Entity]:
        wanted = list(set(ids))
        out: dict[str, Entity] = {}
        for chunk in _chunks(wanted, 500):
            rows = self.conn.execute(select(t.entities).where(t.entities.c.entity_id.in_(chunk)))
            entity_rows = {r.entity_id: r for r in rows}
            names: dict[str, list[Name]] = {eid: [] for eid in entity_rows}
            name_rows = self.conn.execute(
                select(t.names.c.entity_id, t.names.c.display, t.names.c.kind, t.names.c.position)
                .where(t.names.c.entity_id.in_(chunk))
                .where(t.names.c.kind != RETIRED)
            )
            for nr in name_rows:
                names[nr.entity_id].append(Name(nr.display, _KINDS[nr.kind], nr.position))
            for eid, r in entity_rows.items():
                out[eid] = _entity(r, names[eid])
        return out

    def iter_all_entities(self, batch: int = 50_000) -> Iterator[Entity]:
        """Every entity with its names, streamed in entity-id order (for start-up).

        Two ordered streams merged by id, read with plain driver cursors (start-up reads every
        row, and SQLAlchemy's row objects would double its cost). Ids are ordered by code point
        on both databases (PostgreSQL: the "C" collation), the order Python's `<` uses.
        """
        order = "entity_id" if self._is_sqlite else 'entity_id COLLATE "C"'
        entity_rows = self._stream(
            "SELECT entity_id, ordinal, entity_type, status, placeholder, redirect_to "
            f"FROM entities ORDER BY {order}", batch, "load_entities")
        name_rows = self._stream(
            "SELECT entity_id, display, kind, position FROM names "
            f"WHERE kind <> 'retired' ORDER BY {order}", batch, "load_names")
        kinds, statuses, loaded = _KINDS, _STATUSES, Entity.loaded  # locals: read once a row
        types: dict[str, str] = {}  # one string per type, not one per entity
        pending = next(name_rows, None)
        for eid, ordinal, entity_type, status_text, placeholder, redirect_to in entity_rows:
            entity_type = types.setdefault(entity_type, entity_type)
            found: list[Name] = []
            while pending is not None and pending[0] < eid:
                pending = next(name_rows, None)
            while pending is not None and pending[0] == eid:
                found.append(Name(pending[1], kinds[pending[2]], pending[3]))
                pending = next(name_rows, None)
            status = statuses[status_text]
            yield loaded(eid, entity_type, status, ordinal, bool(placeholder), redirect_to,
                         () if status is Status.MERGED else tuple(found))

    def _stream(self, sql: str, batch: int, name: str) -> Iterator[tuple[Any, ...]]:
        """Rows of one query in this transaction, fetched `batch` at a time."""
        raw = self._driver()
        # psycopg streams only from a named (server-side) cursor; sqlite3 always streams.
        cursor = raw.cursor() if self._is_sqlite else raw.cursor(name=name)
        try:
            cursor.execute(sql)
            while rows := cursor.fetchmany(batch):
                yield from rows
        finally:
            cursor.close()

    def insert_entities(self, entities: Sequence[Entity], *, now: float) -> None:
        if entities:
            self._driver_many(
                self._sql.insert_entity,
                [(e.entity_id, e.ordinal, e.entity_type, e.status.value, e.placeholder,
                  e.redirect_to, now) for e in entities],
            )

    def update_entity(self, entity_id: str, **values: Any) -> None:
        values = {k: (v.value if isinstance(v, Status) else v) for k, v in values.items()}
        self.conn.execute(
            update(t.entities).where(t.entities.c.entity_id == entity_id).values(**values)
        )

    def compress_redirects(self, source: str, target: str) -> list[str]:
        """Point everything that redirected to source at target; returns those ids."""
        ids = list(
            self.conn.scalars(
                select(t.entities.c.entity_id).where(t.entities.c.redirect_to == source)
            )
        )
        if ids:
            self.conn.execute(
                update(t.entities).where(t.entities.c.redirect_to == source).values(redirect_to=target)
            )
        return ids

    def merged_into(self, entity_id: str) -> list[str]:
        return list(
            self.conn.scalars(
                select(t.entities.c.entity_id).where(t.entities.c.redirect_to == entity_id)
            )
        )

    def entity_count(self) -> int:
        return int(self.conn.scalar(select(func.count()).select_from(t.entities)) or 0)

    # -- names ---------------------------------------------------------------------------------

    def name_rows(self, entity_id: str) -> list[NameRow]:
        rows = self.conn.execute(
            select(t.names.c.display, t.names.c.kind, t.names.c.position, t.names.c.source)
            .where(t.names.c.entity_id == entity_id)
            .order_by(t.names.c.position)
        )
        return [NameRow(r.display, r.kind, r.position, r.source) for r in rows]

    def put_names(self, entity_id: str, rows: Sequence[NameRow]) -> None:
        """Insert or overwrite (kind, position, source) of the given names of one entity."""
        self.put_names_of([(entity_id, r) for r in rows])

    def put_names_of(self, rows: Sequence[tuple[str, NameRow]]) -> None:
        if rows:
            self._driver_many(
                self._sql.upsert_names,
                [(eid, r.display, r.kind, r.position, r.source) for eid, r in rows],
            )

    def move_names(self, source: str, target: str, rows: Sequence[NameRow]) -> None:
        """Re-home a merged source's names on its target; rows carry the target's new kinds.

        The source's own rows stay, marked retired: nothing is deleted, and a merged entity has
        no names of its own.
        """
        self.conn.execute(
            update(t.names).where(t.names.c.entity_id == source).values(kind=RETIRED)
        )
        self.put_names(target, rows)

    # -- placeholders --------------------------------------------------------------------------

    def placeholder(self, display: str, entity_type: str) -> str | None:
        row = self._driver_one(self._sql.placeholder, (display, entity_type))
        return row[0] if row is not None else None

    def insert_placeholder(self, display: str, entity_type: str, entity_id: str) -> None:
        self._driver_many(self._sql.insert_placeholder, [(display, entity_type, entity_id)])

    def merged_placeholder_pairs(self, ids: Iterable[str] | None = None) -> dict[str, str]:
        """placeholder id -> its pair's display form, for the placeholders merged away (all of
        them, or those among ids)."""
        p, e = t.placeholders, t.entities
        query = (select(p.c.entity_id, p.c.display)
                 .join(e, e.c.entity_id == p.c.entity_id)
                 .where(e.c.status == Status.MERGED.value))
        if ids is None:
            return {r.entity_id: r.display for r in self.conn.execute(query)}
        out: dict[str, str] = {}
        for chunk in _chunks(list(ids), 500):
            rows = self.conn.execute(query.where(p.c.entity_id.in_(chunk)))
            out.update((r.entity_id, r.display) for r in rows)
        return out

    # -- links ---------------------------------------------------------------------------------

    def link(self, x: str, y: str) -> LinkRow | None:
        a, b = ordered_pair(x, y)
        r = self._driver_one(self._sql.link, (a, b))
        return LinkRow(*r) if r is not None else None

    def put_link(self, x: str, y: str, state: str, seq: int, *, actor: str | None = None,
                 reason: str | None = None, now: float | None = None) -> None:
        a, b = ordered_pair(x, y)
        self._driver_many(self._sql.upsert_link, [(a, b, state, seq, actor, reason, now)])

    def set_link_state(self, x: str, y: str, state: str) -> None:
        a, b = ordered_pair(x, y)
        self.conn.execute(
            update(t.links).where(t.links.c.a == a, t.links.c.b == b).values(state=state)
        )

    def links_of(self, entity_id: str) -> list[LinkRow]:
        """Open and distinct links touching one entity."""
        rows = self.conn.execute(
            select(t.links).where(
                or_(t.links.c.a == entity_id, t.links.c.b == entity_id),
                t.links.c.state.in_(("open", "distinct")),
            )
        )
        return [LinkRow(r.a, r.b, r.state, r.created_seq) for r in rows]

    def open_links(self, *, entity_id: str | None, after: tuple[int, str, str] | None,
                   limit: int) -> list[LinkRow]:
        q = select(t.links).where(t.links.c.state == "open")
        if entity_id:
            q = q.where(or_(t.links.c.a == entity_id, t.links.c.b == entity_id))
        if after is not None:
            seq, a, b = after
            q = q.where(
                or_(
                    t.links.c.created_seq > seq,
                    and_(t.links.c.created_seq == seq, t.links.c.a > a),
                    and_(t.links.c.created_seq == seq, t.links.c.a == a, t.links.c.b > b),
                )
            )
        q = q.order_by(t.links.c.created_seq, t.links.c.a, t.links.c.b).limit(limit)
        return [LinkRow(r.a, r.b, r.state, r.created_seq) for r in self.conn.execute(q)]

    # -- evidence ------------------------------------------------------------------------------

    def add_evidence(self, rows: dict[tuple[str, str, str, str], int]) -> None:
        """Add counts to evidence rows keyed (entity_id, context_id, surface, raw_type)."""
        if rows:
            self._driver_many(
                self._sql.add_evidence,
                [(*row, n) for row, n in rows.items()],
            )

    def evidence_summary(self, entity_ids: Sequence[str]) -> tuple[int, int]:
        """(resolves recorded, distinct contexts) over the given entities together."""
        r = self.conn.execute(
            select(
                func.coalesce(func.sum(t.evidence.c.count), 0),
                func.count(func.distinct(t.evidence.c.context_id)),
            ).where(t.evidence.c.entity_id.in_(list(entity_ids)))
        ).one()
        return int(r[0]), int(r[1])

    # -- change feed ---------------------------------------------------------------------------

    def max_seq(self) -> int:
        return int(self.conn.scalar(select(func.coalesce(func.max(t.changes.c.seq), 0))) or 0)

    def changes_after(self, seq: int, limit: int | None = None) -> list[ChangeRecord]:
        rows = (
            self.conn.exec_driver_sql(self._sql.changes_after_raw, (seq,))
            if not limit
            else self.conn.execute(self._sql.changes_after.limit(limit), {"after": seq})
        )
        return [
            ChangeRecord(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5]) for r in rows
        ]

    def append_changes(self, records: Sequence[ChangeRecord]) -> None:
        if records:
            self._driver_many(
                self._sql.insert_changes,
                [(c.seq, c.kind, c.entity_id, c.other_id, json_text.dumps(c.detail, sort_keys=True),
                  c.recorded_at) for c in records],
            )

    # -- idempotent batch replies ----------------------------------------------------------------

    def batch_reply(self, request_hash: str, *, not_before: float) -> str | None:
        row = self._driver_one(self._sql.batch_reply, (request_hash, not_before))
        return row[0] if row is not None else None

    def put_batch_reply(self, request_hash: str, reply: str, *, now: float) -> None:
        self._driver_many(self._sql.upsert_reply, [(request_hash, reply, now)])

    def purge_batch_replies(self, *, before: float) -> None:
        self.conn.execute(t.batch_replies.delete().where(t.batch_replies.c.created_at < before))


def _entity(r: Any, found: list[Name]) -> Entity:
    status = _STATUSES[r.status]
    return Entity(
        entity_id=r.entity_id,
        entity_type=r.entity_type,
        status=status,
        ordinal=r.ordinal,
        placeholder=bool(r.placeholder),
        redirect_to=r.redirect_to,
        names=() if status is Status.MERGED else tuple(found),
    )


def _chunks(items: Sequence[str], size: int) -> Iterator[Sequence[str]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
