"""The identity store behind a small interface: `open_store(url)` gives a store whose `read()`
and `write()` hand out transactions (`Tx`). What differs by backend lives in its own module."""

from identity_server.store.sql import (
    RETIRED,
    ChangeRecord,
    LinkRow,
    NameRow,
    SqlStore,
    Tx,
    WouldBlock,
    ordered_pair,
)


def open_store(url: str, **options: float) -> SqlStore:
    """The store at `url` (sqlite:///FILE or postgresql+psycopg://...), its tables created."""
    return SqlStore(url, **options)


__all__ = ["RETIRED", "ChangeRecord", "LinkRow", "NameRow", "SqlStore", "Tx", "WouldBlock",
           "open_store", "ordered_pair"]
