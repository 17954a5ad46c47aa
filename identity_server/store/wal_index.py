"""Whether anything was committed to a SQLite WAL database, told without calling SQLite.

Every read asks the store whether another connection committed since the index last caught up
(`PRAGMA data_version`). The answer is almost always "no", but the call releases the GIL and must
win it back from every handler thread: under 16 callers that costs a read a quarter of its
throughput. SQLite keeps a WAL database's commit state in its wal-index header, at the start of
the `-shm` file that every connection, in every process, maps: each commit rewrites the header
(its change counter goes up; its last frame or salts move). That layout is fixed, because
processes linked with different SQLite versions share one wal-index
(https://www.sqlite.org/walformat.html). Mapping the header read-only and comparing its bytes
with those seen at the last `data_version` look tells "nothing committed since" with a memory
read; any difference, a torn read included, only sends the caller to SQLite for the answer.
"""

from __future__ import annotations

import mmap
import os
import struct

HEADER_BYTES = 96  # the 48-byte WalIndexHdr, twice: a writer updates the second copy first
_WALINDEX_VERSION = 3007000
_IS_INIT_OFFSET = 12


class WalIndexHeader:
    """The wal-index header of one SQLite database, mapped read-only."""

    def __init__(self, mapped: mmap.mmap) -> None:
        self._map = mapped

    @classmethod
    def open(cls, database: str) -> WalIndexHeader | None:
        """The header of database's `-shm` file, or None when there is none to map (no file,
        too short, or not an initialised wal-index: the caller keeps asking SQLite). Call it
        while a connection of this process has the database open in WAL mode: SQLite then
        never truncates or replaces the file (its other connections hold it shared)."""
        try:
            fd = os.open(os.path.realpath(database) + "-shm", os.O_RDONLY)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size < HEADER_BYTES:
                return None
            mapped = mmap.mmap(fd, HEADER_BYTES, mmap.MAP_SHARED, mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
        header = cls(mapped)
        # A writer may be between the two copies: look again before giving up.
        if any(header.initialised() for _ in range(3)):
            return header
        header.close()
        return None

    def read(self) -> bytes:
        """Both copies of the header as they are now (a copy of the bytes; no SQLite call)."""
        return self._map[:HEADER_BYTES]

    def initialised(self) -> bool:
        """Whether the mapping looks like a wal-index SQLite has set up: its version word, its
        init flag, and two equal copies (SQLite's own readers make the same checks)."""
        data = self.read()
        half = HEADER_BYTES // 2
        (version,) = struct.unpack_from("=I", data, 0)
        return (version == _WALINDEX_VERSION and data[_IS_INIT_OFFSET] == 1
                and data[:half] == data[half:])

    def close(self) -> None:
        self._map.close()
