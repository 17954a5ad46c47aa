"""The DuckDB sink on its own: redirect chains across syncs, and the sync position."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import duckdb
import pytest

from identity_client import ChangeEvent, ChangeKind, Link
from ingest.sink import GraphSink, SinkError


def merged(seq: int, source: str, target: str) -> ChangeEvent:
    return ChangeEvent(seq, ChangeKind.MERGED, source, target, "{}",
                       datetime(2026, 1, 1, tzinfo=UTC))


def test_redirect_chains_resolve_across_syncs(tmp_path: Path) -> None:
    with GraphSink(tmp_path / "g.duckdb") as sink:
        assert sink.apply_changes([merged(3, "a", "b")], [], last_sequence=5) == 1
        assert sink.last_sequence() == 5
        assert sink.apply_changes([merged(7, "b", "c"), merged(8, "x", "a")], None,
                                  last_sequence=9) == 2
        assert sink.query("SELECT from_id, to_id, merged_into FROM redirects ORDER BY 1") == [
            ("a", "c", "b"), ("b", "c", "c"), ("x", "c", "a")]
        assert sink.last_sequence() == 9
        # Nothing new: nothing written, position kept.
        assert sink.apply_changes([], None, last_sequence=9) == 0
        assert sink.last_sequence() == 9


def test_links_are_replaced_by_each_sync(tmp_path: Path) -> None:
    with GraphSink(tmp_path / "g.duckdb") as sink:
        sink.apply_changes([], [Link("a", "b", 4), Link("c", "d", 6)], last_sequence=6)
        sink.apply_changes([], [Link("c", "d", 6)], last_sequence=7)
        assert sink.query("SELECT entity_id, other_id FROM possibly_same_as") == [("c", "d")]


def test_a_locked_database_is_a_sink_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    db = tmp_path / "g.duckdb"
    script = (f"import duckdb, sys; c = duckdb.connect({str(db)!r}); print('ok', flush=True); "
              "sys.stdin.read()")
    holder = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "ok"
        with pytest.raises(SinkError, match="cannot open graph database"):
            GraphSink(db)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=10)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_graph_of_schema_version_1_is_brought_up_to_date_when_opened(tmp_path: Path) -> None:
    """Version 1 kept the server's RFC 3339 text in recorded_at and had no entity_names."""
    path = tmp_path / "g.duckdb"
    con = duckdb.connect(str(path))
    con.execute("""
        CREATE TABLE schema_info (version INTEGER NOT NULL);
        INSERT INTO schema_info VALUES (1);
        CREATE TABLE redirects (from_id VARCHAR NOT NULL, to_id VARCHAR NOT NULL,
            merged_into VARCHAR NOT NULL, sequence BIGINT NOT NULL, recorded_at VARCHAR);
        INSERT INTO redirects VALUES ('a', 'b', 'b', 3, '2026-01-02T03:04:05.123456Z');
        CREATE TABLE feed_anchor (feed VARCHAR NOT NULL, sequence BIGINT NOT NULL,
            entity_id VARCHAR NOT NULL, recorded_at VARCHAR NOT NULL);
        INSERT INTO feed_anchor VALUES ('identity', 3, 'a', '2026-01-02T03:04:05.123456Z');
    """)
    con.close()
    with pytest.raises(SinkError, match="older ingest"):
        GraphSink(path, read_only=True)  # a reader is told to sync it, and changes nothing
    when = datetime(2026, 1, 2, 3, 4, 5, 123456, tzinfo=UTC)
    with GraphSink(path) as sink:
        assert sink.query("SELECT version FROM schema_info") == [(2,)]
        assert sink.query("SELECT typeof(recorded_at), recorded_at FROM redirects") == [
            ("TIMESTAMP WITH TIME ZONE", when)]
        assert sink.feed_anchor() == (3, "a", when)
        assert sink.query("SELECT count(*) FROM entity_names") == [(0,)]
    with GraphSink(path, read_only=True) as reader:
        assert reader.query("SELECT from_id, to_id FROM redirects") == [("a", "b")]
