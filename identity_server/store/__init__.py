"""The identity store behind a small interface: `open_store(url)` gives a store whose `read()`
and `write()` hand out transactions (`Tx`). What both backends share is in `base`; what differs
lives in `sqlite` and `postgres`."""

from typing import Any

from identity_server.domain import RETIRED, NameRow  # stored names: the domain's own rows
from identity_server.store.base import (
    BeforeLock,
    ChangeRecord,
    LinkRow,
    SqlStore,
    Tx,
    WouldBlock,
    backend_for,
    ordered_pair,
)


def open_store(url: str, **options: Any) -> SqlStore:
    """The store at `url` (sqlite:///FILE or postgresql+psycopg://...), its tables created.
    Options are the backend's keyword arguments (busy_timeout_s; SQLite: checkpoint_every_s,
    synchronous)."""
    return backend_for(url)(url, **options)


__all__ = ["RETIRED", "BeforeLock", "ChangeRecord", "LinkRow", "NameRow", "SqlStore", "Tx", "WouldBlock",
           "open_store", "ordered_pair"]
