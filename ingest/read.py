"""Streams lines out of JSON Lines files and directories, each with its file:line position.

Lines are read as bytes, one at a time, so memory stays flat however large the batch. A line longer
than the cap is never held whole: only a short prefix is kept (for the rejects table) and the rest
is skipped in chunks. Files compressed with gzip, bzip2 or xz are read through the decompressor
(known by their first bytes, whatever their names); where the compressed data turns out corrupt
or cut short, the lines before it are read and the rest of the file is one rejected line.
"""

from __future__ import annotations

import bz2
import gzip
import logging
import lzma
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

logger = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".ndjson")
COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz")
PREFIX_BYTES = 1024
_SKIP_CHUNK = 1 << 20
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}
# What a decompressor raises on corrupt or truncated data (gzip.BadGzipFile is an OSError).
CORRUPT = (OSError, EOFError, lzma.LZMAError)


class InputError(Exception):
    """An input path cannot be read at all (missing, not a file or directory)."""


@dataclass(frozen=True, slots=True)
class RawLine:
    """One non-blank input line. ``data`` is None when the line exceeded the cap."""

    source: str
    line_no: int
    data: bytes | None
    size: int
    prefix: bytes
    unreadable: str = ""  # why the file could not be read on from this line (data is None)

    @property
    def position(self) -> str:
        return f"{self.source}:{self.line_no}"


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, directories as their JSON Lines files in sorted order (recursively);
    `-` is standard input. A pipe (`<(zcat papers.gz)`) or a terminal is read as a file, once."""
    files: list[Path] = []
    for raw in paths:
        path = Path("/dev/stdin") if str(raw) == "-" else Path(raw)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.is_file() and is_input_name(p))
            if not found:
                logger.warning("directory %s holds no *.jsonl or *.ndjson files "
                               "(nor such files compressed: .gz, .bz2, .xz)", path)
            files.extend(found)
        elif path.is_file() or path.is_fifo() or path.is_char_device():
            files.append(path)
        elif path.exists():
            raise InputError(f"input path {path} is not a file, a pipe or a directory")
        else:
            raise InputError(f"input path {path} does not exist")
    return files


def is_input_name(path: Path) -> bool:
    """A JSON Lines file by its name (PAPERS.JSONL too), compressed or not."""
    suffixes = [s.lower() for s in path.suffixes[-2:]]
    if suffixes and suffixes[-1] in COMPRESSED_SUFFIXES:
        suffixes.pop()
    return bool(suffixes) and suffixes[-1] in JSONL_SUFFIXES


@contextmanager
def open_input(path: Path) -> Iterator[tuple[BinaryIO, str]]:
    """The file's bytes, decompressed when its first bytes say gzip, bzip2 or xz, and which of
    them ("" for none). The file is opened once and its first bytes peeked at, not read, so a
    pipe works too."""
    with path.open("rb") as raw:
        kind = next((kind for magic, kind in _MAGIC.items()
                     if raw.peek(len(magic))[:len(magic)] == magic), "")
        if not kind:
            yield raw, kind
            return
        # Each closes only itself when given a file object; `raw` is closed above.
        if kind == "gzip":
            with gzip.GzipFile(fileobj=raw, mode="rb") as unpacked:
                yield cast(BinaryIO, unpacked), kind
        elif kind == "bzip2":
            with bz2.BZ2File(raw) as unpacked_bz2:
                yield cast(BinaryIO, unpacked_bz2), kind
        else:
            with lzma.LZMAFile(raw) as unpacked_xz:
                yield cast(BinaryIO, unpacked_xz), kind


def read_lines(path: Path, *, max_line_bytes: int) -> Iterator[RawLine]:
    """Yields the non-blank lines of one file; a line over ``max_line_bytes`` has ``data`` None,
    and so does the line where compressed data turned out corrupt or cut short (``unreadable``
    says why; nothing after it is read)."""
    source = source_name(path)
    line_no = 0
    with open_input(path) as (f, kind):
        while True:
            try:
                chunk, size, over_cap = _next_line(f, max_line_bytes)
            except CORRUPT as e:
                if not kind:
                    raise  # a plain file that cannot be read: not a rejected line
                reason = f"{kind} data is corrupt or cut short from here on ({e})"
                logger.error("%s:%d: %s", source, line_no + 1, reason)
                yield RawLine(source, line_no + 1, None, 0, b"", unreadable=reason)
                return
            if not chunk:
                return
            line_no += 1
            if not over_cap:
                body = chunk.rstrip(b"\r\n")
                if body.strip():
                    yield RawLine(source, line_no, body, len(body), body[:PREFIX_BYTES])
                continue
            logger.debug("%s:%d: line of %d bytes exceeds the cap", source, line_no, size)
            yield RawLine(source, line_no, None, size, chunk[:PREFIX_BYTES])


def source_name(path: Path) -> str:
    """The path as text any UTF-8 store can hold, for positions: the bytes of a file name that
    is not UTF-8 (a Latin-1 archive, say) are written as \\xNN, as `ls -b` shows them, which
    keeps two such names apart."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def _next_line(f: BinaryIO, max_line_bytes: int) -> tuple[bytes, int, bool]:
    """The next line (b"" at the end), its size, and whether it is over the cap: then only its
    first ``max_line_bytes + 1`` bytes are returned, the rest skipped without being kept."""
    chunk = f.readline(max_line_bytes + 1)
    complete = chunk.endswith(b"\n")
    if complete or len(chunk) <= max_line_bytes:
        return chunk, len(chunk), False
    size = len(chunk)
    while not complete:
        rest = f.readline(_SKIP_CHUNK)
        if not rest:
            break
        size += len(rest)
        complete = rest.endswith(b"\n")
    return chunk, size, True


def read_inputs(paths: Iterable[str | Path], *, max_line_bytes: int) -> Iterator[RawLine]:
    """Yields every non-blank line of every input, in file order then line order."""
    for path in expand_paths(paths):
        yield from read_lines(path, max_line_bytes=max_line_bytes)
