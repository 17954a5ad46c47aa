"""The PostgreSQL store: writes of every replica serialised by a transaction-scoped advisory
lock (and, before it, the evidence of a paper by a lock of each paper), reads on one snapshot
each, and every wait on the network service bounded (connect args, session settings, lock waits
cancelled when the store closes).
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Collection, Iterator
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, make_url
from sqlalchemy.exc import OperationalError

from identity_server.errors import StoreUnavailable
from identity_server.store.base import (
    CLOSE_WAIT_S,
    WAIT_SLICE_S,
    BeforeLock,
    SqlStore,
    Tx,
    WouldBlock,
)

logger = logging.getLogger(__name__)

_PG_LOCK_KEY = 0x1D_E7_17  # the advisory lock that serialises identity writes
_STORE_LOCK = "SELECT pg_advisory_xact_lock(%s)"
# A paper's lock: the two-key form, a key space apart from the store's one-key lock. Taken in
# key order by every transaction, so two that share papers never wait on each other in a cycle.
_PG_PAPER_LOCK_CLASS = 0x1D_E7
_PAPER_LOCKS = "SELECT pg_advisory_xact_lock(%s, k) FROM unnest(%s::int4[]) AS k"

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


class PostgresStore(SqlStore):
    """The store in a PostgreSQL database, shared by any number of server processes."""

    is_sqlite = False
    locks_inside_transaction = True

    def __init__(self, url: str, *, busy_timeout_s: float = 60.0) -> None:
        # Connections waiting for the replicas' write lock (close() cancels the wait), and the
        # write transactions under way (close() gives them time to finish).
        self._waiting_for_lock: set[Any] = set()
        self._writes = 0
        self._writes_done = threading.Condition()
        super().__init__(url, busy_timeout_s=busy_timeout_s)

    def _create_engine(self) -> Engine:
        engine = create_engine(self.url, pool_pre_ping=True, pool_size=8,
                               connect_args=_pg_connect_args(self.url))
        _configure_postgres(engine, _pg_session_settings(self.url, self._busy_timeout_s))
        return engine

    def _unavailable_errors(self) -> tuple[type[Exception], ...]:
        import psycopg  # here: a SQLite server never loads it

        return (psycopg.OperationalError,)

    def _end_writes(self) -> bool:
        """Cancel writes waiting for the replicas' lock (again each slice: one may have been
        about to wait when the store began closing) and give those under way up to
        CLOSE_WAIT_S to finish; whether they all did."""
        deadline = time.monotonic() + CLOSE_WAIT_S
        with self._writes_done:
            while self._writes:
                for waiting in list(self._waiting_for_lock):
                    waiting.cancel()  # psycopg: thread-safe, asks the server to end the statement
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._writes_done.wait(min(left, WAIT_SLICE_S))
        return True

    def _prepare_read(self, conn: Connection) -> None:
        # One snapshot for the whole read, as SQLite's read transaction has: at READ COMMITTED
        # each statement sees the commits made since the last, so an index catching up could
        # read a change from the feed and the rows of a later commit, a state that never was.
        # Writes stay at READ COMMITTED: they read after taking the replicas' lock, and a
        # snapshot taken before it would miss the commit that waited for.
        conn.execution_options(isolation_level="REPEATABLE READ", postgresql_readonly=True)

    def _write_transaction(self, wait: bool,
                           before_lock: BeforeLock | None) -> Iterator[Tx]:
        if not wait:
            raise WouldBlock("only SQLite writes can be tried without waiting")
        if self._closing:
            raise StoreUnavailable("the identity store is closing")
        with self._writes_done:
            self._writes += 1
        try:
            with self.engine.connect() as conn:
                with conn.begin():
                    tx = Tx(conn, False)
                    if before_lock is not None:
                        papers, work = before_lock
                        self._lock(conn, _PAPER_LOCKS, (_PG_PAPER_LOCK_CLASS, _paper_keys(papers)),
                                   "the lock of a paper whose evidence this write records")
                        work(tx)
                    started = time.perf_counter()
                    self._lock(conn, _STORE_LOCK, (_PG_LOCK_KEY,), "the store's write lock")
                    locked = time.perf_counter()
                    self._observe_lock_wait(locked - started)
                    yield tx
                self._observe_lock_hold(time.perf_counter() - locked)
        finally:
            with self._writes_done:
                self._writes -= 1
                self._writes_done.notify_all()

    def _lock(self, conn: Connection, statement: str, params: tuple[Any, ...],
              what: str) -> None:
        """Take advisory locks (the store's, or papers'); waiting for them ends at the busy
        timeout (lock_timeout: see _pg_session_settings), or at once when the store closes."""
        driver = conn.connection.driver_connection
        self._waiting_for_lock.add(driver)
        try:
            if self._closing:
                raise StoreUnavailable("the identity store is closing")
            conn.exec_driver_sql(statement, params)
        except OperationalError as e:
            if self._closing:
                raise StoreUnavailable("the identity store is closing") from e
            if getattr(e.orig, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            raise StoreUnavailable(
                f"another server process has held {what} for more than "
                f"{self._busy_timeout_s:g} s; try again (a process hung inside a transaction "
                f"loses the lock after {PG_IDLE_IN_TRANSACTION_S} s)") from e
        finally:
            self._waiting_for_lock.discard(driver)


def _paper_keys(papers: Collection[str]) -> list[int]:
    """The papers' lock keys, distinct and in order (two papers may share one: they then only
    wait for each other)."""
    return sorted({int.from_bytes(hashlib.blake2b(p.encode("utf-8", "surrogatepass"),
                                                  digest_size=4).digest(), "big", signed=True)
                   for p in papers})


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
