"""Every wait on PostgreSQL is bounded: connecting to a server that does not answer, another
replica's write lock, and a replica hung inside a transaction while holding it."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

from identity_server.errors import StoreUnavailable
from identity_server.store import SqlStore, postgres


def _started(work: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException | None]]:
    """work on a thread of its own, and a list that gets what it raised (None: it returned)."""
    got: list[BaseException | None] = []

    def run() -> None:
        try:
            work()
            got.append(None)
        except BaseException as e:  # handed to the test
            got.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, got


def _outcome(work: Callable[[], Any], *, within_s: float) -> BaseException | None:
    """What work raised (None: it returned), failing the test if it is still waiting after
    within_s (it would wait forever without the bound under test)."""
    thread, got = _started(work)
    thread.join(within_s)
    assert got, f"still waiting after {within_s} s"
    return got[0]


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A port whose listener completes TCP connections but never says a word."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        yield listener.getsockname()[1]


def test_a_server_that_never_answers_fails_the_store_within_the_connect_timeout(
        silent_server: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "PG_CONNECT_TIMEOUT_S", 2)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/identity"
    error = _outcome(lambda: SqlStore(url), within_s=30)
    assert isinstance(error, StoreUnavailable)
    assert "cannot open the identity store" in str(error) and "timeout expired" in str(error)


def test_a_connect_timeout_in_the_url_is_the_users(silent_server: int) -> None:
    url = f"postgresql+psycopg://postgres@127.0.0.1:{silent_server}/identity?connect_timeout=2"
    assert "connect_timeout" not in postgres._pg_connect_args(url)
    assert postgres._pg_connect_args(url)["tcp_user_timeout"] == 60_000  # the others are still ours
    assert isinstance(_outcome(lambda: SqlStore(url), within_s=30), StoreUnavailable)


def _holding_the_write_lock(pg_url: str) -> psycopg.Connection[Any]:
    """Another replica, inside a write transaction (SqlStore's advisory lock taken)."""
    other = psycopg.connect(pg_url.replace("postgresql+psycopg", "postgresql"))
    other.execute("SELECT pg_advisory_xact_lock(%s)", (postgres._PG_LOCK_KEY,))
    return other


def _waiting_for_an_advisory_lock(conn: psycopg.Connection[Any]) -> bool:
    """Whether a session of the database waits for an advisory lock (seen from conn, which may
    be inside a transaction: pg_locks is read afresh by every statement)."""
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                       "AND NOT granted AND database = (SELECT oid FROM pg_database "
                       "WHERE datname = current_database())").fetchone()
    return bool(row and row[0])


def test_a_write_waiting_for_another_replicas_lock_gives_up_at_the_busy_timeout(
        pg_url: str) -> None:
    store = SqlStore(pg_url, busy_timeout_s=1)
    other = _holding_the_write_lock(pg_url)
    try:
        def write() -> None:
            with store.write() as tx:
                tx.max_seq()

        error = _outcome(write, within_s=30)
        assert isinstance(error, StoreUnavailable)
        assert "another server process has held the store's write lock for more than 1 s" in str(
            error)
        other.rollback()  # the lock is free again: the next write goes through
        assert _outcome(write, within_s=30) is None
    finally:
        other.close()
        store.close()


def test_the_sessions_get_the_bounds_unless_the_url_sets_them(pg_url: str) -> None:
    """Set by a statement on each connection, not as startup options (a pooler such as
    PgBouncer refuses those); a lock_timeout the URL's options give wins."""
    ours = SqlStore(pg_url, busy_timeout_s=1.5)
    users = SqlStore(pg_url + "%20-c%20lock_timeout%3D7s", busy_timeout_s=1.5)
    try:
        for store, lock_timeout in ((ours, "1500ms"), (users, "7s")):
            for _ in range(2):  # a read's rollback keeps them: they were committed
                with store.read() as tx:
                    row = tx.conn.exec_driver_sql(
                        "SELECT current_setting('lock_timeout'), "
                        "current_setting('idle_in_transaction_session_timeout')").one()
                assert tuple(row) == (lock_timeout, "1min")
    finally:
        ours.close()
        users.close()


def test_a_replica_hung_inside_a_transaction_loses_the_lock(
        pg_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(postgres, "PG_IDLE_IN_TRANSACTION_S", 1)
    hung, healthy = SqlStore(pg_url), SqlStore(pg_url, busy_timeout_s=20)
    inside = threading.Event()

    def hang_inside_a_write() -> None:
        with hung.write():
            inside.set()
            time.sleep(4)  # holds the lock, doing nothing, past the idle timeout

    try:
        hanging, hung_outcome = _started(hang_inside_a_write)
        assert inside.wait(10)

        def write() -> None:
            with healthy.write() as tx:
                tx.max_seq()

        assert _outcome(write, within_s=30) is None  # after ~1 s, not after the 4 s sleep
        assert hanging.is_alive()  # the hung replica's sleep was still going on
        hanging.join(30)
        assert isinstance(hung_outcome[0], StoreUnavailable)  # its session ended under it
    finally:
        hung.close()
        healthy.close()


def test_closing_the_store_ends_a_wait_for_another_replicas_lock(pg_url: str) -> None:
    store = SqlStore(pg_url, busy_timeout_s=60)
    other = _holding_the_write_lock(pg_url)
    try:
        def write() -> None:
            with store.write() as tx:
                tx.max_seq()

        waiting, got = _started(write)
        deadline = time.monotonic() + 10
        while not _waiting_for_an_advisory_lock(other) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert _waiting_for_an_advisory_lock(other), "the write never began to wait"
        store.close()
        waiting.join(10)  # well inside the 60 s lock timeout
        assert got, "the write still waits for the lock after the store closed"
        assert isinstance(got[0], StoreUnavailable) and "closing" in str(got[0])
    finally:
        other.close()
