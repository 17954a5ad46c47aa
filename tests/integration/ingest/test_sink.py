"""The DuckDB sink on its own: redirect chains across syncs, and the sync position."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.client import ChangeEvent, Link
from ingest.sink import GraphSink, SinkError


def merged(seq: int, source: str, target: str) -> ChangeEvent:
    return ChangeEvent(seq, "merged", source, target, "{}", "2026-01-01T00:00:00Z")


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
