"""Reading authority files: JSON Lines or CSV (`id,name,type,aliases`, aliases split on `|`).

Parsing is separate from importing so that the CLI (a file on disk) and the ImportAuthority RPC
(a stream of byte chunks) share it. Each record carries its line number, so a refusal can say
where the bad record is. Lines are decoded one at a time: a line that is not UTF-8, or longer
than the cap, refuses the record that holds it, not the rest of the file.
"""

from __future__ import annotations

import bz2
import codecs
import csv
import gzip
import json
import lzma
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from io import BufferedIOBase, BufferedReader
from typing import TYPE_CHECKING

from identity_server.errors import InvalidArgument

if TYPE_CHECKING:
    from _csv import Reader as CsvReader

REQUIRED_COLUMNS = ("id", "name", "type")
_UTF16_BOMS = (codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)
MAX_LINE_BYTES = 16 * 1024 * 1024  # a record's line, as ingest caps a paper's


@dataclass(frozen=True, slots=True)
class AuthorityRecord:
    line: int
    entity_id: str
    name: str
    entity_type: str
    aliases: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RecordError:
    line: int
    message: str


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A line refused before it is parsed: not UTF-8, or longer than the cap. `text` is what a
    CSV reader reads in its place (U+FFFD for bad bytes, nothing for a line too long), so that
    it keeps its place; the record the line belongs to is refused with `message`."""

    text: str
    message: str


@dataclass(frozen=True, slots=True)
class TooLong:
    """A line longer than the cap, not kept: only its size and the cap."""

    size: int
    cap: int


Line = str | Unreadable


def split_lines(chunks: Iterable[bytes],
                max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[bytes | TooLong]:
    """The lines (without their newline) of bytes given in chunks of any size, which may split
    lines and characters. A line longer than `max_line_bytes` is never held whole (a file
    without newlines must not fill the memory): TooLong stands for it."""
    pieces: list[bytes] = []  # the line so far
    held = 0  # its length; over the cap: the bytes of a line being skipped
    for data in chunks:
        start = 0
        while (end := data.find(b"\n", start)) >= 0:
            held += end - start
            if held > max_line_bytes:
                yield TooLong(held, max_line_bytes)
            else:
                pieces.append(data[start:end])
                yield b"".join(pieces)
            pieces, held, start = [], 0, end + 1
        held += len(data) - start
        if held > max_line_bytes:
            pieces = []
        else:
            pieces.append(data[start:])
    if held > max_line_bytes:
        yield TooLong(held, max_line_bytes)
    elif held:
        yield b"".join(pieces)


UTF16_REFUSAL = ("the authority file is UTF-16 (it starts with a UTF-16 byte-order mark); "
                 "save it as UTF-8")


def starts_utf16(data: bytes) -> bool:
    """Whether a file's first bytes are a UTF-16 byte-order mark (the file is refused whole)."""
    return data.startswith(_UTF16_BOMS)


def decode_lines(raw_lines: Iterable[bytes | TooLong]) -> Iterator[Line]:
    """Each line as text (a UTF-8 byte-order mark before the first dropped), or Unreadable.

    A UTF-16 file is refused whole (every line of it would be refused, for one reason)."""
    for number, raw in enumerate(raw_lines, start=1):
        if isinstance(raw, TooLong):
            yield Unreadable("", f"line is {raw.size} bytes long, more than the cap of "
                                 f"{raw.cap} bytes")
            continue
        if number == 1:
            if starts_utf16(raw):
                raise InvalidArgument(UTF16_REFUSAL)
            raw = raw.removeprefix(codecs.BOM_UTF8)
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as e:
            yield Unreadable(raw.decode("utf-8", "replace"),
                             f"not valid UTF-8 ({e.reason} at byte {e.start + 1} of the line)")


def _text(line: Line) -> str:
    return line.text if isinstance(line, Unreadable) else line


def detect_format(first_line: str) -> str:
    """`jsonl` when the first non-blank line is a JSON object, else `csv`."""
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def parse_authority(
    lines: Iterable[Line], fmt: str | None = None
) -> Iterator[AuthorityRecord | RecordError]:
    """Records and per-record errors, in file order. `lines` keep their line endings or not."""
    it = iter(lines)
    head: list[Line] = []
    for line in it:
        head.append(line)
        if _text(line).strip():
            break
    if not head or not _text(head[-1]).strip():
        # Nothing readable to tell the format by: the lines that could not be read (over the
        # cap, not UTF-8) are still each a record refused, not a file found empty.
        for number, line in enumerate(head, start=1):
            if isinstance(line, Unreadable):
                yield RecordError(number, line.message)
        return
    first = _text(head[-1])  # the first line that is not blank
    fmt = fmt or detect_format(first)
    body = _chain(head, it)
    if fmt == "jsonl":
        yield from _parse_jsonl(body)
    elif fmt == "csv":
        yield from _parse_csv(body, _delimiter(first))
    else:
        raise ValueError(f"unknown authority format {fmt!r}; use jsonl or csv")


def _chain(head: list[Line], rest: Iterator[Line]) -> Iterator[Line]:
    yield from head
    yield from rest


def _parse_jsonl(lines: Iterable[Line]) -> Iterator[AuthorityRecord | RecordError]:
    for number, line in enumerate(lines, start=1):
        if isinstance(line, Unreadable):
            yield RecordError(number, line.message)
            continue
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as e:
            yield RecordError(number, f"not valid JSON: {e.msg} at column {e.colno}")
            continue
        except RecursionError:
            yield RecordError(number, "JSON nested too deeply to be read")
            continue
        if not isinstance(obj, dict):
            yield RecordError(number, "a record must be a JSON object")
            continue
        aliases = obj.get("aliases")
        yield _record(number, obj, [] if aliases is None else aliases)  # null: none, as absent


def _parse_csv(lines: Iterable[Line], delimiter: str) -> Iterator[AuthorityRecord | RecordError]:
    unreadable: dict[int, str] = {}  # line number -> why, for the lines read so far
    reader = csv.reader(_strip_newlines(lines, unreadable), delimiter=delimiter)
    rows = _csv_rows(reader)
    header = next((row for row in rows if row != []), None)  # blank lines before it skipped
    if header is None:
        return
    if isinstance(header, RecordError):
        yield RecordError(header.line, f"the CSV header cannot be read: {header.message}")
        return
    if unreadable:
        number, message = next(iter(unreadable.items()))
        yield RecordError(number, f"the CSV header cannot be read: {message}")
        return
    columns = [h.strip().lower() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        yield RecordError(reader.line_num,
                          f"CSV header lacks column(s) {', '.join(missing)}; expected "
                          "id,name,type,aliases (or separated by ';' or tabs)")
        return
    twice = [c for c in (*REQUIRED_COLUMNS, "aliases") if columns.count(c) > 1]
    if twice:  # which of the two would a record mean?
        yield RecordError(reader.line_num,
                          f"CSV header names column(s) {', '.join(twice)} more than once")
        return
    end = reader.line_num  # the line the last row ended on
    for row in rows:
        # A record is named by its first line: one with a quoted line break spans several, and
        # one whose quote is left open runs on to where a quote closes it, or to the end.
        number, end = end + 1, reader.line_num
        if unreadable:  # the row ends here and may span lines (quoted newlines): any bad one
            first = min(unreadable)
            message = unreadable[first]
            unreadable.clear()
            yield RecordError(first, message)
            continue
        if isinstance(row, RecordError):
            yield row
            continue
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(columns):
            yield RecordError(number, f"{len(row)} fields, but the header has {len(columns)}")
            continue
        obj = dict(zip(columns, row + [""] * (len(columns) - len(row))))
        raw_aliases = obj.get("aliases", "")
        aliases = [a for a in raw_aliases.split("|")] if raw_aliases else []
        yield _record(number, obj, aliases)


def _delimiter(header: str) -> str:
    """"," as CSV has it, or ";" or a tab when only that split of the header names the columns
    (a spreadsheet's export where the decimal mark is a comma, a TSV file)."""
    for delimiter in (",", ";", "\t"):
        names = {name.strip().strip('"').lower() for name in header.split(delimiter)}
        if names.issuperset(REQUIRED_COLUMNS):
            return delimiter
    return ","


def _csv_rows(reader: CsvReader) -> Iterator[list[str] | RecordError]:
    """The reader's rows; a row the reader cannot read (a field over its size limit) is a
    RecordError, and reading goes on with the next line."""
    while True:
        try:
            yield next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            yield RecordError(reader.line_num, f"not valid CSV: {e}")


def _strip_newlines(lines: Iterable[Line], unreadable: dict[int, str]) -> Iterator[str]:
    """Lines ending in a newline, as the CSV reader wants them; the numbers of those that were
    unreadable (not UTF-8, too long) go into `unreadable`."""
    for number, line in enumerate(lines, start=1):
        if isinstance(line, Unreadable):
            unreadable[number] = line.message
        text = _text(line)
        yield text if text.endswith("\n") else text + "\n"


def _record(number: int, obj: Mapping[str, object], aliases: object) -> AuthorityRecord | RecordError:
    if type(obj.get("id")) is int:  # a JSON integer id (`"id": 42`) names one thing: "42"
        obj = {**obj, "id": str(obj["id"])}
    for field in REQUIRED_COLUMNS:
        if field not in obj:
            return RecordError(number, f"missing field {field!r}")
        if not isinstance(obj[field], str):
            also = " or an integer" if field == "id" else ""
            return RecordError(number, f"field {field!r} must be a string{also}")
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        return RecordError(number, "field 'aliases' must be a list of strings")
    return AuthorityRecord(
        line=number,
        entity_id=str(obj["id"]),
        name=str(obj["name"]),
        entity_type=str(obj["type"]),
        aliases=tuple(aliases),
    )


READ_CHUNK = 1 << 16  # bytes read at a time
# What reading an input on may raise: an unreadable file, compressed data corrupt or cut short.
READ_ERRORS = (OSError, EOFError, lzma.LZMAError)
_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz"}


def broke_off(kind: str, lines: int, error: BaseException) -> str:
    """Why reading an input of `kind` ("" for none, see `unpacked`) stopped after `lines`
    whole lines, for a message."""
    what = f"the {kind} data is corrupt or cut short" if kind else "cannot be read on"
    return f"{what} after line {lines} ({error})"


@contextmanager
def unpacked(raw: BufferedReader) -> Iterator[tuple[BufferedIOBase, str]]:
    """raw's bytes, through its decompressor when its first bytes say gzip, bzip2 or xz, and
    which of them ("" for none). The first bytes are peeked at, not read, so a pipe works too.
    (ingest.read.open_input does the same for papers: the packages share no code.)"""
    kind = next((kind for magic, kind in _MAGIC.items()
                 if raw.peek(len(magic))[:len(magic)] == magic), "")
    # Each closes only itself when given a file object; `raw` is closed by the caller.
    if kind == "gzip":
        with gzip.GzipFile(fileobj=raw, mode="rb") as unpacked:
            yield unpacked, kind
    elif kind == "bzip2":
        with bz2.BZ2File(raw) as unpacked_bz2:
            yield unpacked_bz2, kind
    elif kind == "xz":
        with lzma.LZMAFile(raw) as unpacked_xz:
            yield unpacked_xz, kind
    else:
        yield raw, kind
