"""The header of a SQLite WAL database's wal-index, read from memory: a commit marker for free.

Every commit of any connection, in any process, rewrites the wal-index header: two copies of a
48-byte record at the start of the database's `-shm` file (https://www.sqlite.org/walformat.html,
"The WAL-Index Header"; `PRAGMA data_version` is derived from the same bytes). Mapped read-only,
those 96 bytes tell whether anything was committed since they were last read, with no statement,
no system call and no hand-over of the GIL: a server asks before every lock-free read. A read
that lands while a writer rewrites the header may see the two copies differ; that only looks like
a commit (the caller then looks properly), and a commit finished before the read always shows.

The file is opened once and its descriptors stay open until every connection of this process to
the database is closed. POSIX record locks belong to the process, and closing *any* descriptor
of a file drops all of the process's locks on it, SQLite's own included: without its lock on the
`-shm` file, the next process to open the database takes itself for the file's only user and
resets it under this process's mappings (a bus error).
"""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3

logger = logging.getLogger(__name__)

HEADER_BYTES = 96  # two copies of the 48-byte WalIndexHdr


class WalIndexHeader:
    """The mapped header of one database's wal-index; `read()` returns its bytes now."""

    def __init__(self, fd: int, view: mmap.mmap) -> None:
        self._fd = fd
        self._view: mmap.mmap | None = view

    @classmethod
    def open(cls, database: str, watch: sqlite3.Connection) -> WalIndexHeader | None:
        """Map the header of `database`'s wal-index, or None when it cannot be (not in WAL mode,
        no `-shm` file, too short). `watch` is a connection of this process that stays open
        as long as the mapping is used: its first read opens the wal-index, and while it is
        open, no other process may reset the file."""
        path = f"{database}-shm"
        try:
            (mode,) = watch.execute("PRAGMA journal_mode").fetchone()
            if str(mode).lower() != "wal":
                return None
            watch.execute("PRAGMA data_version").fetchone()  # a read: opens the wal-index
            if os.stat(path).st_size < HEADER_BYTES:  # checked before a descriptor exists
                return None
            fd = os.open(path, os.O_RDONLY)
        except (OSError, sqlite3.Error):
            logger.info("cannot map the wal-index of %s; commits are watched with a statement",
                        database, exc_info=True)
            return None
        try:
            return cls(fd, mmap.mmap(fd, HEADER_BYTES, access=mmap.ACCESS_READ))
        except (OSError, ValueError):
            # The descriptor stays open (see the module's docstring): a few bytes for the life
            # of the process, against every lock the process holds on the file.
            logger.info("cannot map the wal-index of %s; commits are watched with a statement",
                        database, exc_info=True)
            return None

    def read(self) -> bytes:
        view = self._view
        if view is None:
            raise ValueError("the wal-index header is closed")
        return view[:HEADER_BYTES]

    def close(self) -> None:
        """Unmap and close the file; only once no connection of this process has the database
        open (see the module's docstring)."""
        view, self._view = self._view, None
        if view is not None:
            view.close()
            os.close(self._fd)


__all__ = ["HEADER_BYTES", "WalIndexHeader"]
