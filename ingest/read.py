"""Streams lines out of JSON Lines files and directories, each with its file:line position.

Lines are read as bytes, one at a time, so memory stays flat however large the batch. A line longer
than the cap is never held whole: only a short prefix is kept (for the rejects table) and the rest
is skipped in chunks.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

JSONL_SUFFIXES = (".jsonl", ".ndjson")
PREFIX_BYTES = 1024
_SKIP_CHUNK = 1 << 20


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

    @property
    def position(self) -> str:
        return f"{self.source}:{self.line_no}"


def expand_paths(paths: Iterable[str | Path]) -> list[Path]:
    """Files as given, directories as their JSON Lines files in sorted order (recursively)."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found = sorted(
                p for p in path.rglob("*")
                if p.is_file() and p.suffix.lower() in JSONL_SUFFIXES  # PAPERS.JSONL too
            )
            if not found:
                logger.warning("directory %s holds no *.jsonl or *.ndjson files", path)
            files.extend(found)
        elif path.is_file():
            files.append(path)
        else:
            raise InputError(f"input path {path} does not exist or is not a file or directory")
    return files


def read_lines(path: Path, *, max_line_bytes: int) -> Iterator[RawLine]:
    """Yields the non-blank lines of one file; a line over ``max_line_bytes`` has ``data`` None."""
    source = str(path)
    with path.open("rb") as f:
        line_no = 0
        while True:
            chunk = f.readline(max_line_bytes + 1)
            if not chunk:
                return
            line_no += 1
            complete = chunk.endswith(b"\n")
            body = chunk.rstrip(b"\r\n")
            if complete or len(chunk) <= max_line_bytes:
                if body.strip():
                    yield RawLine(source, line_no, body, len(body), body[:PREFIX_BYTES])
                continue
            # Over the cap: skip to the end of the line without keeping it.
            size = len(chunk)
            while not complete:
                rest = f.readline(_SKIP_CHUNK)
                if not rest:
                    break
                size += len(rest)
                complete = rest.endswith(b"\n")
            logger.debug("%s:%d: line of %d bytes exceeds the cap", source, line_no, size)
            yield RawLine(source, line_no, None, size, chunk[:PREFIX_BYTES])


def read_inputs(paths: Iterable[str | Path], *, max_line_bytes: int) -> Iterator[RawLine]:
    """Yields every non-blank line of every input, in file order then line order."""
    for path in expand_paths(paths):
        yield from read_lines(path, max_line_bytes=max_line_bytes)
