"""SQLite stores keep their rows in their primary keys' order (WITHOUT ROWID tables), and stores
made before that layout, with a rowid table and a separate key index per table, keep working."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import MetaData, create_engine

from identity_server.server import build_service
from identity_server.settings import Settings
from identity_server.store import schema
from tests.unit.test_resolve_model import run_against_the_model

CLUSTERED = ("entities", "names", "placeholders", "links", "evidence")


def _table_sql(path: Path) -> dict[str, str]:
    with sqlite3.connect(path) as conn:
        return dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'table'"))


def _rowid_store(path: Path) -> None:
    """A store with the layout made before: every table a rowid table."""
    before = MetaData()
    for table in schema.metadata.sorted_tables:
        table.to_metadata(before).dialect_options["sqlite"]["with_rowid"] = True
    engine = create_engine(f"sqlite:///{path}")
    before.create_all(engine)
    engine.dispose()


def test_a_new_store_keeps_rows_in_key_order(tmp_path: Path) -> None:
    """One b-tree per row written instead of a table and an index: a first-seen spelling's
    write and a batch's evidence touch half the b-trees (measured: docs/decisions.md,
    "Rows kept in key order")."""
    path = tmp_path / "identity.sqlite"
    build_service(Settings(db_url=f"sqlite:///{path}")).close()
    tables = _table_sql(path)
    for name in CLUSTERED:
        assert "WITHOUT ROWID" in tables[name], name
    assert "WITHOUT ROWID" not in tables["batch_replies"]  # replies are large: kept apart


@pytest.mark.parametrize("seed", [0, 2, 3])
def test_a_store_made_before_works_as_before(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "identity.sqlite"
    _rowid_store(path)
    for name in CLUSTERED:
        assert "WITHOUT ROWID" not in _table_sql(path)[name], name
    run_against_the_model(f"sqlite:///{path}", seed)
    assert "WITHOUT ROWID" not in _table_sql(path)["names"]  # left as it was
