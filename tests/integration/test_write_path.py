"""The store's write path stays right: commit markers, the SQLite store's kept write connection
through failures, waits and checkpoints. (The service's resolve path: test_resolve_path.py.)"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

import identity_server.store.sqlite as sqlite_module
from identity_server.errors import StoreUnavailable
from identity_server.store import ChangeRecord, SqlStore, WouldBlock
from identity_server.store.wal_index import own_commit_marker


@contextmanager
def _store(tmp_path: Path, **kw: float) -> Iterator[tuple[SqlStore, Path]]:
    db = tmp_path / "s.sqlite"
    store = SqlStore(f"sqlite:///{db}", **kw)
    try:
        yield store, db
    finally:
        store.close()


def _commit(store: SqlStore, seq: int) -> None:
    with store.write() as tx:
        tx.append_changes([ChangeRecord(seq, "created", f"P{seq}", "", {"name": f"n{seq}"}, 0.0)])


def _seqs(path: Path) -> list[int]:
    with sqlite3.connect(path) as con:
        return [r[0] for r in con.execute("SELECT seq FROM changes ORDER BY seq")]


@pytest.mark.parametrize("mapped", [True, False], ids=["wal-index mapped", "PRAGMA"])
def test_commit_state_is_the_marker_and_the_newest_sequence_together(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mapped: bool) -> None:
    """The marker moves on every commit, from this store's writer, another connection or
    another process, whether read from the mapped wal-index or asked of SQLite; reads move it
    not; it comes with the newest sequence number."""
    if not mapped:
        monkeypatch.setattr(sqlite_module.WalIndexHeader, "open", lambda *_: None)
    with _store(tmp_path) as (store, db):
        assert (store._wal_header is not None) is mapped
        before, last = store.commit_state()
        assert before is not None and last == 0
        _commit(store, 1)
        after, last = store.commit_state()
        assert (after != before, last) == (True, 1)
        with sqlite3.connect(db) as other:  # a commit from outside this store
            other.execute("INSERT INTO changes (seq, kind, entity_id, other_id, detail, "
                          "recorded_at) VALUES (2, 'created', 'P2', '', '{}', 0)")
        moved, last = store.commit_state()
        assert (moved not in (before, after), last) == (True, 2)
        assert store.commit_state() == (moved, 2)  # nothing committed since: unchanged
        with sqlite3.connect(db) as reader:  # reading commits nothing
            reader.execute("SELECT count(*) FROM changes").fetchone()
        assert store.commit_marker() == moved
        # Another process's commit that adds no change (evidence alone) moves it too.
        subprocess.run([sys.executable, "-c", (
            "import sqlite3, sys; con = sqlite3.connect(sys.argv[1]); "
            "con.execute(\"INSERT INTO evidence (entity_id, context_id, surface, raw_type, "
            "count) VALUES ('P2', 'paper-1', 'n2', '', 1)\"); con.commit()"), str(db)],
            check=True, timeout=60)
        assert store.commit_state() == (store.commit_marker(), 2)
        assert store.commit_marker() != moved


def _header(counter: int, rest: bytes = b"x" * 36, *, torn: bool = False) -> bytes:
    copy = b"\x07\x00\x00\x00" * 2 + counter.to_bytes(4, sys.byteorder) + rest
    other = copy if not torn else copy[:-1] + b"?"
    return other + copy


def test_an_own_commit_marker_only_when_the_counter_moved_by_the_callers_commit_alone() -> None:
    before = _header(41)
    assert own_commit_marker(before, _header(42, b"y" * 36), wrote=True) == _header(42, b"y" * 36)
    assert own_commit_marker(before, before, wrote=False) == before  # nothing committed
    assert own_commit_marker(before, _header(43), wrote=True) is None  # another commit too
    assert own_commit_marker(before, _header(42), wrote=False) is None  # someone else's
    assert own_commit_marker(before, _header(42, torn=True), wrote=True) is None  # mid-rewrite
    assert own_commit_marker(_header(0xFFFF_FFFF), _header(0), wrote=True) == _header(0)


def test_a_write_knows_the_marker_its_commit_left_unless_another_commit_followed(
        tmp_path: Path) -> None:
    with _store(tmp_path) as (store, db):
        with store.write() as tx:
            tx.append_changes([ChangeRecord(1, "created", "P1", "", {}, 0.0)])
        assert tx.commit_marker is not None and tx.commit_marker == store.commit_marker()
        with store.write() as empty:  # a transaction that changes nothing moves nothing
            pass
        assert empty.commit_marker == tx.commit_marker
        with sqlite3.connect(db) as other:  # another process commits after it
            other.execute("INSERT INTO changes (seq, kind, entity_id, other_id, detail, "
                          "recorded_at) VALUES (2, 'created', 'P2', '', '{}', 0)")
        assert store.commit_marker() != tx.commit_marker  # so a reader would catch up


def _descriptors_of(path: str) -> int:
    """How many of this process's open file descriptors refer to `path` (Linux /proc)."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == path
        except OSError:  # closed meanwhile
            pass
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs Linux /proc")
def test_stores_on_one_database_share_its_mapped_header_until_the_last_closes(
        tmp_path: Path) -> None:
    """Closing a store must not close the -shm file's descriptors while another store of the
    process still uses the database: that would drop SQLite's locks on it too."""
    db = tmp_path / "s.sqlite"
    first, second = SqlStore(f"sqlite:///{db}"), SqlStore(f"sqlite:///{db}")
    shm = f"{db}-shm"
    try:
        assert first._wal_header is not None and first._wal_header is second._wal_header
        _commit(first, 1)
        first.close()
        assert _descriptors_of(shm) >= 2  # SQLite's own and the mapping's, for `second`
        _commit(second, 2)
        with second.read() as tx:
            assert second.commit_marker() is not None and tx.max_seq() == 2
    finally:
        second.close()
    assert _descriptors_of(shm) == 0


def test_the_kept_write_connection_survives_a_failed_write(tmp_path: Path) -> None:
    with _store(tmp_path) as (store, db):
        _commit(store, 1)
        with pytest.raises(RuntimeError), store.write():
            raise RuntimeError("the use case failed")
        _commit(store, 3)
        assert _seqs(db) == [1, 3]  # the failed write left nothing; the next one committed


def test_a_busy_store_is_unavailable_and_the_next_write_works(tmp_path: Path) -> None:
    with _store(tmp_path, busy_timeout_s=0.1) as (store, db):
        _commit(store, 1)  # the kept connection is open before another process locks
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        with pytest.raises(StoreUnavailable, match="locked"):
            _commit(store, 2)
        other.execute("ROLLBACK")
        other.close()
        _commit(store, 3)
        assert _seqs(db) == [1, 3]


def test_a_write_waiting_for_another_process_takes_the_lock_when_freed_or_ends_on_close(
        tmp_path: Path) -> None:
    """A write waits, past SQLite's single busy wait (a quarter second), for another
    connection's write lock and commits once it is released; a write still waiting when the
    store closes ends with StoreUnavailable at once, not after the 30 s busy timeout."""
    with _store(tmp_path, busy_timeout_s=30.0) as (store, db):
        _commit(store, 1)
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        threading.Timer(0.8, lambda: other.execute("ROLLBACK")).start()
        _commit(store, 2)  # waited through several slices, then committed
        assert _seqs(db) == [1, 2]
        other.execute("BEGIN IMMEDIATE")
        outcome: list[BaseException] = []

        def waiting_write() -> None:
            try:
                _commit(store, 3)
            except BaseException as e:  # the outcome is what the test checks
                outcome.append(e)

        writer = threading.Thread(target=waiting_write)
        writer.start()
        time.sleep(0.4)
        assert writer.is_alive()  # waiting for the other connection
        started = time.monotonic()
        store.close()
        writer.join(10)
        assert not writer.is_alive() and time.monotonic() - started < 2
        assert len(outcome) == 1 and isinstance(outcome[0], StoreUnavailable)
        other.execute("ROLLBACK")
        other.close()
        assert _seqs(db) == [1, 2]


def test_in_wal_mode_a_busy_timeout_is_set_only_when_a_begin_needs_another(
        tmp_path: Path) -> None:
    """A WAL write transaction waits on nothing once begun, so the timeout its BEGIN waited with
    stays: writes that may wait run BEGIN, their statements and COMMIT, no PRAGMA; one that
    must not wait sets its own once, and the next that may wait sets it back once."""
    with _store(tmp_path) as (store, db):
        _commit(store, 1)
        driver = store._writer.connection.driver_connection  # type: ignore[union-attr]
        seen: list[str] = []
        driver.set_trace_callback(seen.append)
        _commit(store, 2)
        _commit(store, 3)
        assert not [s for s in seen if "busy_timeout" in s], seen
        with store.write(wait=False) as tx:
            tx.append_changes([ChangeRecord(4, "created", "P4", "", {}, 0.0)])
        _commit(store, 5)
        _commit(store, 6)
        driver.set_trace_callback(None)
        assert [s for s in seen if "busy_timeout" in s] == ["PRAGMA busy_timeout=0",
                                                           "PRAGMA busy_timeout=250"]
        assert _seqs(db) == [1, 2, 3, 4, 5, 6]


def test_a_write_that_must_not_wait_says_so_at_once_and_leaves_the_store_working(
        tmp_path: Path) -> None:
    """write(wait=False) raises WouldBlock, without waiting out the busy timeout, while another
    connection holds the write lock or this process's other writer holds the connection; a write
    that may wait still waits for the lock afterwards, and nothing was written."""
    with _store(tmp_path, busy_timeout_s=30.0) as (store, db):
        with store.write(wait=False) as tx:  # nothing in the way: it writes
            tx.append_changes([ChangeRecord(1, "created", "E1", "", {}, 0.0)])
        other = sqlite3.connect(db, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        with pytest.raises(WouldBlock), store.write(wait=False):
            pytest.fail("began while another connection writes")
        assert time.monotonic() - started < 5  # not the 30 s busy timeout
        other.execute("ROLLBACK")
        other.close()
        inside, release = threading.Event(), threading.Event()

        def hold_the_writer() -> None:
            with store.write():
                inside.set()
                release.wait(10)

        holder = threading.Thread(target=hold_the_writer)
        holder.start()
        assert inside.wait(10)
        with pytest.raises(WouldBlock), store.write(wait=False):
            pytest.fail("began while this process's other writer holds the connection")
        release.set()
        holder.join(10)
        _commit(store, 3)
        assert _seqs(db) == [1, 3]
        # A write that may wait still waits for another connection's lock after all that.
        other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
        other.execute("BEGIN IMMEDIATE")
        threading.Timer(0.3, lambda: other.execute("ROLLBACK")).start()
        started, cpu_started = time.monotonic(), time.thread_time()
        _commit(store, 4)
        assert time.monotonic() - started >= 0.25
        assert time.thread_time() - cpu_started < 0.15  # SQLite's wait sleeps; it does not spin
        other.close()
        assert _seqs(db) == [1, 3, 4]


def test_a_driver_error_in_a_hot_statement_is_a_store_error(tmp_path: Path) -> None:
    with _store(tmp_path) as (store, db):
        with sqlite3.connect(db) as con:  # another process breaks the schema under the server
            con.execute("ALTER TABLE changes RENAME TO changes_gone")
        with pytest.raises(StoreUnavailable, match="no such table"):
            _commit(store, 1)  # the change row goes through the driver's cursor


def _in_database_file(path: Path) -> list[int]:
    """Change seqs in the database file itself, ignoring the WAL (what a checkpoint copied)."""
    con = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
    try:
        return [r[0] for r in con.execute("SELECT seq FROM changes ORDER BY seq")]
    except sqlite3.OperationalError:  # not even the tables are in the file yet
        return []
    finally:
        con.close()


def test_commits_are_checkpointed_in_the_background_not_in_the_commit(tmp_path: Path) -> None:
    with _store(tmp_path, checkpoint_every_s=0.05) as (store, db):
        with store.write() as tx:
            assert tx.conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 0
        _commit(store, 1)
        deadline = time.monotonic() + 10
        while _in_database_file(db) != [1] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _in_database_file(db) == [1]  # copied out of the WAL without another commit
    assert not any(t.name == "sqlite-checkpoint" and t.is_alive() for t in threading.enumerate())


def test_without_the_background_checkpointer_commits_stay_in_the_wal(tmp_path: Path) -> None:
    """The check above can fail: a store whose checkpointer waits leaves the file as it was."""
    with _store(tmp_path, checkpoint_every_s=3600) as (store, db):
        _commit(store, 1)
        time.sleep(0.2)
        assert _in_database_file(db) == []
        assert _seqs(db) == [1]


@pytest.mark.parametrize("restart_at", [5, 10**9], ids=["restarting", "control: never"])
def test_a_wal_checkpointed_while_writes_go_on_starts_over(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restart_at: int) -> None:
    """Under a steady stream of writes every checkpoint finds a write under way, whose frames
    are newer than its copy; a writer starts the WAL over only when it begins with every frame
    copied, so with PASSIVE alone the WAL grows with each commit for as long as writes go on.
    Once the WAL is long, the writer copies the frames the checkpoint left right after its
    commit, and its next transaction starts the WAL over: it stays a few frames long. The
    control shows the check can fail."""
    monkeypatch.setattr(sqlite_module, "RESTART_AT_FRAMES", restart_at)
    commits = 300
    inside, done = threading.Event(), threading.Event()
    with _store(tmp_path, checkpoint_every_s=3600) as (store, db):  # checkpoints called below
        checkpointer = store._checkpointer
        assert checkpointer is not None

        def write_steadily() -> None:
            for seq in range(1, commits + 1):
                with store.write() as tx:
                    tx.append_changes(
                        [ChangeRecord(seq, "created", f"P{seq}", "", {"name": f"n{seq}"}, 0.0)])
                    inside.set()
                    time.sleep(0.002)  # the checkpoint below runs while this write is open
            done.set()

        writer = threading.Thread(target=write_steadily)
        writer.start()
        while not done.is_set():
            if inside.wait(0.05):
                inside.clear()
                checkpointer._checkpoint()
        writer.join(10)
        wal_bytes = os.path.getsize(f"{db}-wal")
        assert _seqs(db) == list(range(1, commits + 1))
    frame = 4096 + 24
    if restart_at < 10**9:
        # Bounded, not growing with the commits: a quarter of what the control grows to. (How
        # long it gets before a restart depends on when the threads run: on a loaded machine
        # a few dozen frames.)
        assert wal_bytes < commits // 4 * frame
    else:
        assert wal_bytes >= commits * frame
