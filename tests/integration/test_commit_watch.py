"""The store tells "nothing committed since" from SQLite's wal-index header without a SQLite
call, and that shortcut never hides a commit: from this store, another connection, another
process; and a mapping that stops following the commits is found out and dropped."""

from __future__ import annotations

import logging
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import identity_server.store.sql as sql_module
from identity_server.store.sql import ChangeRecord, SqlStore
from identity_server.store.wal_index import HEADER_BYTES, WalIndexHeader


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqlStore]:
    s = SqlStore(f"sqlite:///{tmp_path / 's.sqlite'}")
    try:
        yield s
    finally:
        s.close()


def _insert_change(db: Path, seq: int) -> None:
    with sqlite3.connect(db) as other:
        other.execute("INSERT INTO changes (seq, kind, entity_id, other_id, detail, recorded_at) "
                      f"VALUES ({seq}, 'created', 'P{seq}', '', '{{}}', 0)")


def _db(store: SqlStore) -> Path:
    database = sql_module.make_url(store.url).database
    assert database
    return Path(database)


def test_the_header_is_mapped_and_moves_with_every_commit(store: SqlStore) -> None:
    header = WalIndexHeader.open(str(_db(store)))
    assert header is not None
    try:
        before = header.read()
        assert len(before) == HEADER_BYTES
        assert header.read() == before  # nothing committed: the same bytes
        _insert_change(_db(store), 1)
        assert header.read() != before
    finally:
        header.close()


def test_no_header_without_an_initialised_wal_index(tmp_path: Path) -> None:
    db = tmp_path / "none.sqlite"
    assert WalIndexHeader.open(str(db)) is None  # no -shm file at all
    Path(f"{db}-shm").write_bytes(b"\0" * 10)
    assert WalIndexHeader.open(str(db)) is None  # too short to hold a header
    Path(f"{db}-shm").write_bytes(b"\1" * 32768)
    assert WalIndexHeader.open(str(db)) is None  # not a wal-index SQLite set up


def test_repeated_looks_skip_sqlite_until_something_is_committed(
    store: SqlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql_module, "WAL_INDEX_TRUSTED_S", 3600.0)  # however slow this machine
    first = store.commit_marker()
    assert first is not None and store._wal_index is not None

    class NoSqlite:
        def execute(self, *_: object) -> None:
            raise AssertionError("asked SQLite although the header did not move")

    real = store._watch
    monkeypatch.setattr(store, "_watch", NoSqlite())
    assert [store.commit_marker() for _ in range(100)] == [first] * 100
    monkeypatch.setattr(store, "_watch", real)
    _insert_change(_db(store), 1)  # another connection commits: the header moves
    assert store.commit_marker() not in (None, first)


def test_a_commit_by_another_process_is_seen_at_once(store: SqlStore) -> None:
    before = store.commit_marker()
    script = ("import sqlite3, sys; c = sqlite3.connect(sys.argv[1]); "
              "c.execute(\"INSERT INTO changes (seq, kind, entity_id, other_id, detail, "
              "recorded_at) VALUES (7, 'created', 'P7', '', '{}', 0)\"); c.commit()")
    subprocess.run([sys.executable, "-c", script, str(_db(store))], check=True, timeout=60)
    after, last = store.commit_marker(), store.commit_state()[1]
    assert after != before and last == 7


def test_a_commit_through_the_store_moves_the_marker(store: SqlStore) -> None:
    before = store.commit_marker()
    with store.write() as tx:
        tx.append_changes([ChangeRecord(1, "created", "P1", "", {"name": "n"}, 0.0)])
    assert store.commit_marker() != before


def test_a_mapping_that_stops_following_commits_is_dropped(
    store: SqlStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Should the mapped file ever stop being the one SQLite writes, the header stands still
    while commits go on: the time-limited trust sends a look to SQLite, which sees the marker
    move under an unchanged header, warns and stops using the mapping."""
    db = _db(store)
    frozen = tmp_path / "frozen.sqlite"
    shutil.copy(f"{db}-shm", f"{frozen}-shm")  # a copy nobody writes
    stale = WalIndexHeader.open(str(frozen))
    assert stale is not None
    with store._watch_lock:
        real, store._wal_index = store._wal_index, stale
        assert real is not None
        real.close()
        store._last_look = None
    first = store.commit_marker()
    _insert_change(db, 1)
    monkeypatch.setattr(sql_module, "WAL_INDEX_TRUSTED_S", 0.0)  # the trust has run out
    with caplog.at_level(logging.WARNING, logger=sql_module.__name__):
        moved = store.commit_marker()
    assert moved != first
    assert store._wal_index is None
    assert "stopped following its commits" in caplog.text
    _insert_change(db, 2)
    assert store.commit_marker() != moved  # still right, through SQLite every time


def test_closing_the_store_drops_the_mapping(tmp_path: Path) -> None:
    s = SqlStore(f"sqlite:///{tmp_path / 'c.sqlite'}")
    s.commit_marker()
    mapped = s._wal_index
    assert mapped is not None
    s.close()
    assert s._wal_index is None
    with pytest.raises(ValueError):
        mapped.read()  # unmapped: no reader can touch the file after close
