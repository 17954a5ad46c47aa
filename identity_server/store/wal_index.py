"""The header of a SQLite WAL database's wal-index, read from memory: a commit marker for free.

Every commit of any connection, in any process, rewrites the wal-index header: two copies of a
48-byte record at the start of the database's `-shm` file (https://www.sqlite.org/walformat.html,
"The WAL-Index Header"; `PRAGMA data_version` is derived from the same bytes). Mapped read-only,
those 96 bytes tell whether anything was committed since they were last read, with no statement,
no system call and no hand-over of the GIL: a server asks before every lock-free read. A read
that lands while a writer rewrites the header may see the two copies differ; that only looks like
a commit (the caller then looks properly), and a commit finished before the read always shows.

The file is opened once per process, whatever the number of stores on the database, and its
descriptors stay open until the last of them has closed every connection. POSIX record locks
belong to the process, and closing *any* descriptor of a file drops all of the process's locks on
it, SQLite's own included: without its lock on the `-shm` file, the next process to open the
database takes itself for the file's only user and resets it under this process's mappings (a
bus error). (A connection to the database opened outside any store and still open when the last
store closes is not covered: the process's stores are.)
"""

from __future__ import annotations

import logging
import mmap
import os
import sqlite3
import sys
import threading

logger = logging.getLogger(__name__)

HEADER_BYTES = 96  # two copies of the 48-byte WalIndexHdr
_COPY_BYTES = HEADER_BYTES // 2
_CHANGE_COUNTER = slice(8, 12)  # iChange: "incremented each transaction" that commits frames
_OPEN: dict[tuple[int, int], WalIndexHeader] = {}  # by (device, inode) of the -shm file
_OPEN_LOCK = threading.Lock()


class WalIndexHeader:
    """The mapped header of one database's wal-index; `read()` returns its bytes now. Shared by
    every store of this process on the database (`open` hands out the one mapping, `close`
    gives it back; the last `close` unmaps)."""

    def __init__(self, fd: int, view: mmap.mmap, file_id: tuple[int, int]) -> None:
        self._fd = fd
        self._view: mmap.mmap | None = view
        self._file_id = file_id
        self._users = 1

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
            found = os.stat(path)  # checked before a descriptor exists
        except (OSError, sqlite3.Error) as e:
            _not_mapped(database, e)
            return None
        if found.st_size < HEADER_BYTES:
            return None
        file_id = (found.st_dev, found.st_ino)
        with _OPEN_LOCK:
            shared = _OPEN.get(file_id)
            if shared is not None:
                shared._users += 1
                return shared
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as e:
                _not_mapped(database, e)
                return None
            try:
                view = mmap.mmap(fd, HEADER_BYTES, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as e:
                # The descriptor stays open (see the module's docstring): a few bytes for the
                # life of the process, against every lock the process holds on the file.
                _not_mapped(database, e)
                return None
            header = _OPEN[file_id] = cls(fd, view, file_id)
            return header

    def read(self) -> bytes:
        view = self._view
        if view is None:
            raise ValueError("the wal-index header is closed")
        return view[:HEADER_BYTES]

    def close(self) -> None:
        """Give the mapping back; the last user unmaps and closes the file. Only once the
        caller's connections to the database are closed (see the module's docstring)."""
        with _OPEN_LOCK:
            self._users -= 1
            if self._users > 0 or self._view is None:
                return
            del _OPEN[self._file_id]
            view, self._view = self._view, None
        view.close()
        os.close(self._fd)


def _not_mapped(database: str, error: Exception) -> None:
    logger.info("cannot map the wal-index of %s; commits are watched with a statement",
                database, exc_info=error)


def own_commit_marker(before: bytes, after: bytes, wrote: bool) -> bytes | None:
    """The header `after`, when it shows that the only commit since `before` was the caller's
    own: `before` read while holding the write lock (no commit can come between it and the
    caller's), `after` once the caller committed, `wrote` whether its transaction changed any
    row (then its commit wrote frames and moved the change counter by exactly one; else by
    none). None when the counter moved otherwise, or a copy was caught mid-rewrite: another
    process committed too, or may have, and the caller must look.

    The counter is a 32-bit machine-order integer at offset 8 of each copy (walformat.html;
    the wal-index is never shared between machines)."""
    if before[:_COPY_BYTES] != before[_COPY_BYTES:] or after[:_COPY_BYTES] != after[_COPY_BYTES:]:
        return None
    counter_before = int.from_bytes(before[_CHANGE_COUNTER], sys.byteorder)
    counter_after = int.from_bytes(after[_CHANGE_COUNTER], sys.byteorder)
    return after if counter_after == (counter_before + wrote) & 0xFFFF_FFFF else None


__all__ = ["HEADER_BYTES", "WalIndexHeader", "own_commit_marker"]
