"""On PostgreSQL a read transaction sees one snapshot, as SQLite's does: a replica's index catching
up reads the change feed and then the changed rows, and a commit landing between those statements
must not show in the second and not the first (a state no one-at-a-time order of the calls had)."""

from __future__ import annotations

import pytest

from identity_server.store import SqlStore, Tx

pytestmark = pytest.mark.postgres


def _isolation(tx: Tx) -> str:
    return str(tx.conn.exec_driver_sql("SHOW transaction_isolation").scalar())


def test_a_read_does_not_see_a_commit_made_after_it_began(pg_url: str) -> None:
    reader, writer = SqlStore(pg_url), SqlStore(pg_url)
    try:
        with reader.read() as tx:
            assert tx.batch_reply("during", not_before=0.0) is None
            with writer.write() as wtx:
                wtx.put_batch_reply("during", "[]", now=1.0)
            assert tx.batch_reply("during", not_before=0.0) is None  # still the snapshot
        with reader.read() as tx:
            assert tx.batch_reply("during", not_before=0.0) == "[]"
    finally:
        reader.close()
        writer.close()


def test_writes_read_at_read_committed_after_the_lock(pg_url: str) -> None:
    """A write must see what the replica that held the lock before it committed: its
    snapshot cannot be taken before the lock is granted. Pooled connections go back to it
    after a read (the read's isolation is the read's alone)."""
    store = SqlStore(pg_url)
    try:
        for _ in range(3):
            with store.read() as tx:
                assert _isolation(tx) == "repeatable read"
            with store.write() as tx:
                assert _isolation(tx) == "read committed"
    finally:
        store.close()
