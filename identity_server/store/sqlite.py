"""The SQLite store: one kept write connection per process, `BEGIN IMMEDIATE` as the store-wide
write lock (WAL mode, a busy timeout waited out in slices), WAL checkpoints on a thread of their
own, and a cheap look at whether any connection committed: the mapped wal-index header
(`wal_index`), else `PRAGMA data_version` on a connection that never writes.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import SQLAlchemyError

from identity_server.errors import StoreUnavailable
from identity_server.store.base import (
    CLOSE_WAIT_S,
    WAIT_SLICE_S,
    BeforeLock,
    SqlStore,
    Tx,
    WouldBlock,
    cannot_open,
)
from identity_server.store.wal_index import WalIndexHeader, own_commit_marker

logger = logging.getLogger(__name__)

WAL_SIZE_LIMIT = 64 * 1024 * 1024  # a WAL file bigger than this is cut back when it starts over
RESTART_AT_FRAMES = 1000  # a WAL this long is started over (see _Checkpointer)
_TAIL_FRAMES = 200  # what a checkpoint leaves for the writer to copy, at most (mostly)
_CATCH_UP_PASSES = 4


class SqliteStore(SqlStore):
    """The store in a SQLite file. Writes of this process share one kept connection (they are
    serialised anyway), instead of a pool checkout, begin and return per transaction."""

    is_sqlite = True
    locks_inside_transaction = False

    def __init__(self, url: str, *, busy_timeout_s: float = 60.0,
                 checkpoint_every_s: float = 1.0, synchronous: str = "normal") -> None:
        if synchronous.lower() not in ("normal", "full"):
            raise ValueError(f"synchronous={synchronous!r}: expected normal or full")
        self._synchronous = synchronous.upper()
        self._checkpoint_every_s = checkpoint_every_s
        self._database: str | None = None
        self._watch: sqlite3.Connection | None = None
        self._watch_lock = threading.Lock()
        self._wal_header: WalIndexHeader | None = None
        self._checkpointer: _Checkpointer | None = None
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
        super().__init__(url, busy_timeout_s=busy_timeout_s)

    def _create_engine(self) -> Engine:
        database = self._database = _sqlite_file(self.url)
        if database is not None and not os.path.isdir(os.path.dirname(database) or "."):
            raise StoreUnavailable(  # SQLite would say only "unable to open database file"
                f"cannot open the identity store at {self.url}: the directory "
                f"{os.path.dirname(database)!r} does not exist")
        engine = create_engine(
            self.url,
            connect_args={"timeout": self._busy_timeout_s, "check_same_thread": False},
        )
        _configure_sqlite(engine, checkpoint_in_background=database is not None,
                          synchronous=self._synchronous)
        return engine

    def _start(self) -> None:
        database = self._database
        if database is None:
            return
        try:
            self._watch = _side_connection(database)
            self._wal_header = WalIndexHeader.open(database, self._watch)
            self._checkpointer = _Checkpointer(database, self._checkpoint_every_s)
        except sqlite3.Error as e:
            raise cannot_open(self.url, e) from e

    def _unavailable_errors(self) -> tuple[type[Exception], ...]:
        return (sqlite3.OperationalError,)

    def close(self) -> None:
        self._closing = True
        if self._checkpointer is not None:
            self._checkpointer.close()
        header, self._wal_header = self._wal_header, None
        if self._watch is not None:
            self._watch.close()
        # The mapping goes last, once every connection of this store is closed; while a write's
        # connection may still be open, its file stays open too (see wal_index).
        if self._close_engine() and header is not None:
            header.close()

    def _end_writes(self) -> bool:
        """Give this process's write in progress CLOSE_WAIT_S to finish (one waiting for
        another connection's lock sees the store closing within a slice), then close the kept
        write connection; whether it finished."""
        if not self._writer_lock.acquire(timeout=CLOSE_WAIT_S):
            return False
        try:
            self._drop_writer()
        finally:
            self._writer_lock.release()
        return True

    # -- commits of other connections ----------------------------------------------------------

    def commit_marker(self) -> bytes | None:
        """A value that changes whenever any connection, in any process, commits. The
        wal-index header, which every such commit rewrites, read from the -shm file mapped
        into memory: no statement, so no hand-over of the GIL to another thread, which the
        server's event loop pays for on every lock-free read. Where the file cannot be mapped,
        `PRAGMA data_version` on a connection that never writes, which moves on the same
        commits (one connection for all threads: its values mean nothing on another)."""
        header = self._wal_header
        if header is not None:
            return header.read()
        if self._watch is None:
            return super().commit_marker()
        with self._watch_lock:
            version = int(self._watch.execute("PRAGMA data_version").fetchone()[0])
        return version.to_bytes(8, "little")

    def commit_state(self) -> tuple[bytes | None, int]:
        if self._watch is None:
            return super().commit_state()
        marker = self.commit_marker()
        with self._watch_lock:
            (last,) = self._watch.execute(
                "SELECT coalesce(max(seq), 0) FROM changes").fetchone()
        return marker, int(last)

    # -- transactions --------------------------------------------------------------------------

    def _prepare_read(self, conn: Connection) -> None:
        conn.info["write"] = False  # the pool's connections keep their info (see _on_begin)

    def _write_transaction(self, wait: bool,
                           before_lock: BeforeLock | None) -> Iterator[Tx]:
        if self._closing:
            raise StoreUnavailable("the identity store is closing")
        started = time.perf_counter()
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
            locked = time.perf_counter()
            self._observe_lock_wait(locked - started)
            header = self._wal_header
            try:
                before = header.read() if header is not None else None
                changes = driver.total_changes
                tx = Tx(conn, True, driver)
                if before_lock is not None:  # BEGIN IMMEDIATE took the store's lock already
                    before_lock[1](tx)
                yield tx
                wrote = driver.total_changes != changes
                if conn.in_transaction():  # a Core statement joined the transaction
                    conn.commit()  # SQLAlchemy's commit: the driver's COMMIT
                else:
                    driver.commit()
                self._observe_lock_hold(time.perf_counter() - locked)
                if before is not None and header is not None:
                    tx.commit_marker = own_commit_marker(before, header.read(), wrote)
                if self._checkpointer is not None and self._checkpointer.tail_due:
                    self._checkpointer.copy_tail(driver)
            except BaseException:
                self._drop_writer()  # rolls back what is open; the next write starts afresh
                raise
        finally:
            self._writer_lock.release()

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
        self._set_writer_busy_ms(conn, int(min(self._busy_timeout_s, WAIT_SLICE_S) * 1000))
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
        """The kept write connection (under _writer_lock), opened on first use."""
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


def _sqlite_file(url: str) -> str | None:
    """The database file of a SQLite URL, or None (in memory)."""
    database = make_url(url).database
    return database if database and database != ":memory:" else None


def _side_connection(database: str) -> sqlite3.Connection:
    """A plain sqlite3 connection beside the engine's, in autocommit (the change watch, the
    checkpointer): it never begins a transaction of its own."""
    return sqlite3.connect(database, check_same_thread=False, isolation_level=None)


def _configure_sqlite(engine: Engine, *, checkpoint_in_background: bool,
                      synchronous: str = "NORMAL") -> None:
    """WAL, a busy timeout, and transactions we begin ourselves (IMMEDIATE for writers); with
    a background checkpointer, no checkpoint inside a commit. synchronous NORMAL: a commit
    survives the process's crash, not the machine's power loss; FULL: both (an fsync a
    commit)."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        dbapi_conn.isolation_level = None  # let the "begin" hook below issue BEGIN
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute("PRAGMA foreign_keys=ON")
        if checkpoint_in_background:
            cur.execute("PRAGMA wal_autocheckpoint=0")
            cur.execute(f"PRAGMA journal_size_limit={WAL_SIZE_LIMIT}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        # On the driver's connection: SQLAlchemy's statement layers would cost more than BEGIN.
        # The kept writer's transactions are begun on the driver (_write_transaction): a Core
        # statement run inside one joins it.
        driver = conn.connection.driver_connection
        assert driver is not None
        if not driver.in_transaction:
            driver.execute("BEGIN IMMEDIATE" if conn.info.get("write") else "BEGIN")


class _Checkpointer:
    """Copies a SQLite WAL's committed pages into the database file from a thread of its own.

    SQLite's automatic checkpoint runs inside whichever commit takes the WAL past 1,000 pages,
    with the write lock held and the file synced: every writer waits for it. A PASSIVE
    checkpoint on another connection blocks no reader and no writer. But a writer starts the
    WAL over only when it begins with every frame copied, and under a steady stream of writes
    one is always under way while the copy runs, its frames newer than the copy: the WAL would
    grow without end, every commit extending the file (writing past a file's end costs the
    kernel more than writing over pages written before). So once the WAL holds
    RESTART_AT_FRAMES, the copy is repeated while each pass finds many new frames (each pass
    shorter than the last), and then this process's next writer, right after its commit,
    copies what is left (`copy_tail`: what the last pass missed, once a period; it syncs the
    database file), and its next transaction starts the WAL over.
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
                if not failing:  # once per run of failures, not once a period
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
