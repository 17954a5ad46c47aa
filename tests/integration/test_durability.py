"""IDENTITY_SQLITE_SYNCHRONOUS: `full` makes every SQLite commit an fsync (an acknowledged write
survives a power loss), `normal` (the default) survives the server's crash only."""

from __future__ import annotations

from pathlib import Path

import pytest

from identity_server.server import build_service
from identity_server.settings import Settings


@pytest.mark.parametrize(("level", "pragma"), [("normal", 1), ("full", 2)])
def test_the_sqlite_synchronous_level_is_the_setting(tmp_path: Path, level: str,
                                                     pragma: int) -> None:
    service = build_service(Settings(db_url=f"sqlite:///{tmp_path / 'd.sqlite'}",
                                     sqlite_synchronous=level))  # type: ignore[arg-type]
    try:
        service.resolve("Durable Thing", "tool")  # the writer's connection, as every write
        with service.store.engine.connect() as conn:
            assert conn.exec_driver_sql("PRAGMA synchronous").scalar() == pragma
        with service.store.write() as tx:
            assert tx.conn.exec_driver_sql("PRAGMA synchronous").scalar() == pragma
    finally:
        service.close()


def test_an_unknown_level_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("IDENTITY_SQLITE_SYNCHRONOUS", "extra")
    with pytest.raises(ValueError, match="sqlite_synchronous"):
        Settings()
