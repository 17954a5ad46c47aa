"""Splits the input into buckets by paper id, for the distributed job (ingest.distributed).

The driver reads the input once, as the single-process job reads it (``read_inputs``), and appends
each line to its bucket's staging file with the line's own position (file and line number), so a
task reads its bucket as ``run_job`` would read the files: the same lines, in input order, rejected
with the same reasons at the same positions. A line's bucket is a stable hash (BLAKE2b, never
Python's salted ``hash``) of its paper id, so every revision of a paper, in any run, lands in the
same bucket, and is applied there in input order. A line with no paper id to read (not JSON, no
``paper_id``) goes by its position instead: it holds no paper that another line could revise.

A staging file is a run's private scratch: a sequence of records (a fixed header, then the
source name, the line's bytes, and for a line not kept whole its prefix and why), written once by
the driver and read once by the task.
"""

from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import orjson

from ingest.models import Limits
from ingest.read import PREFIX_BYTES, RawLine, read_inputs
from ingest.validate import parse_line
from ingest.vocabulary import Vocabulary

# line number, size, then the byte lengths of: source, data (-1: not kept), prefix, unreadable
_HEADER = struct.Struct("<QQIqII")
_BOM = b"\xef\xbb\xbf"


def bucket_of(key: str, buckets: int) -> int:
    """The bucket of a paper id (or of a line without one): the same in every process and run."""
    digest = hashlib.blake2b(key.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % buckets


def line_key(raw: RawLine, *, vocabulary: Vocabulary, limits: Limits) -> str:
    """What decides the line's bucket: its paper id as the job reads it, else its position.

    The usual line is read by orjson and its ``paper_id`` taken as the job takes it (an integer
    as its decimal text); any other line is parsed as the job parses it, so the two readings
    cannot disagree about a paper's id."""
    if raw.data is not None:
        try:
            obj = orjson.loads(raw.data.removeprefix(_BOM))
        except orjson.JSONDecodeError:
            obj = None
        if type(obj) is dict:
            paper_id = obj.get("paper_id")
            if type(paper_id) is str:
                return paper_id
            if type(paper_id) is int:
                return str(paper_id)
    paper_id = parse_line(raw, vocabulary=vocabulary, limits=limits).paper_id
    if paper_id is not None:
        return paper_id
    # Made absolute (as the rejects' ids are), so a rerun from another directory agrees.
    path, _, line = raw.position.rpartition(":")
    return f"\0line {os.path.abspath(path)}:{line}"


def staging_path(directory: Path, bucket: int) -> Path:
    return directory / f"bucket-{bucket:04d}.lines"


def stage(files: Sequence[Path], directory: Path, buckets: int, *, vocabulary: Vocabulary,
          limits: Limits, progress: Callable[[int], object] | None = None) -> list[int]:
    """Writes every line of ``files`` to its bucket's staging file in ``directory`` (one file
    per bucket, empty ones too); returns the number of lines of each bucket."""
    directory.mkdir(parents=True, exist_ok=True)
    out = _Buffered([staging_path(directory, b) for b in range(buckets)])
    counts = [0] * buckets
    done = 0
    for raw in read_inputs(files, max_line_bytes=limits.max_line_bytes):
        b = bucket_of(line_key(raw, vocabulary=vocabulary, limits=limits), buckets)
        out.add(b, _record(raw))
        counts[b] += 1
        done += 1
        if progress is not None and done % 1024 == 0:
            progress(1024)
    out.flush_all()
    if progress is not None and done % 1024:
        progress(done % 1024)
    return counts


class _Buffered:
    """Appends to many files without holding them all open (more buckets than the process may
    open files): each file's records gather in memory and are appended a block at a time, and
    all of them once the memory held reaches a cap."""

    _FILE_BYTES = 1 << 20
    _TOTAL_BYTES = 64 << 20

    def __init__(self, paths: list[Path]) -> None:
        self._paths = paths
        self._buffers = [bytearray() for _ in paths]
        self._held = 0
        for path in paths:
            path.write_bytes(b"")

    def add(self, i: int, record: bytes) -> None:
        self._buffers[i] += record
        self._held += len(record)
        if len(self._buffers[i]) >= self._FILE_BYTES:
            self._flush(i)
        elif self._held >= self._TOTAL_BYTES:
            self.flush_all()

    def flush_all(self) -> None:
        for i in range(len(self._paths)):
            self._flush(i)

    def _flush(self, i: int) -> None:
        if self._buffers[i]:
            with self._paths[i].open("ab") as f:
                f.write(self._buffers[i])
            self._held -= len(self._buffers[i])
            self._buffers[i] = bytearray()


def _record(raw: RawLine) -> bytes:
    source = raw.source.encode("utf-8", "surrogatepass")
    unreadable = raw.unreadable.encode("utf-8")
    # A line kept whole has its prefix in its data; only a line over the cap needs it apart.
    prefix = raw.prefix if raw.data is None else b""
    data = raw.data or b""
    header = _HEADER.pack(raw.line_no, raw.size, len(source),
                          -1 if raw.data is None else len(data), len(prefix), len(unreadable))
    return b"".join((header, source, data, prefix, unreadable))


def read_staged(path: Path, *, base_dir: str | None = None) -> Iterator[RawLine]:
    """The lines of one staging file, in the order they were staged.

    ``base_dir``: the driver's working directory. A worker in another directory (on another
    machine) reads a relative input path as relative to it, so positions and the rejects' ids
    stay those the driver's own directory gives."""
    here = os.getcwd()
    with path.open("rb", buffering=1 << 20) as f:
        while header := f.read(_HEADER.size):
            if len(header) < _HEADER.size:
                raise ValueError(f"staging file {path} is cut short")
            line_no, size, n_source, n_data, n_prefix, n_unreadable = _HEADER.unpack(header)
            source = f.read(n_source).decode("utf-8", "surrogatepass")
            data = f.read(n_data) if n_data >= 0 else None
            prefix = f.read(n_prefix) if data is None else data[:PREFIX_BYTES]
            unreadable = f.read(n_unreadable).decode("utf-8")
            if base_dir is not None and base_dir != here and not os.path.isabs(source):
                source = os.path.join(base_dir, source)
            yield RawLine(source, line_no, data, size, prefix, unreadable)
