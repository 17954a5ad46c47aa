"""Reading authority files: JSON Lines or CSV (`id,name,type,aliases`, aliases split on `|`).

Parsing is separate from importing so that the CLI (a file on disk) and the ImportAuthority RPC
(a stream of byte chunks) share it. Each record carries its line number, so a refusal can say
where the bad record is.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

REQUIRED_COLUMNS = ("id", "name", "type")


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


def detect_format(first_line: str) -> str:
    """`jsonl` when the first non-blank line is a JSON object, else `csv`."""
    return "jsonl" if first_line.lstrip().startswith("{") else "csv"


def parse_authority(
    lines: Iterable[str], fmt: str | None = None
) -> Iterator[AuthorityRecord | RecordError]:
    """Records and per-record errors, in file order. `lines` keep their line endings or not."""
    it = iter(lines)
    head: list[str] = []
    for line in it:
        head.append(line)
        if line.strip():
            break
    if not head or not head[-1].strip():
        return
    fmt = fmt or detect_format(head[-1])
    body = _chain(head, it)
    if fmt == "jsonl":
        yield from _parse_jsonl(body)
    elif fmt == "csv":
        yield from _parse_csv(body)
    else:
        raise ValueError(f"unknown authority format {fmt!r}; use jsonl or csv")


def _chain(head: list[str], rest: Iterator[str]) -> Iterator[str]:
    yield from head
    yield from rest


def _parse_jsonl(lines: Iterable[str]) -> Iterator[AuthorityRecord | RecordError]:
    for number, line in enumerate(lines, start=1):
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
        yield _record(number, obj, obj.get("aliases", []))


def _parse_csv(lines: Iterable[str]) -> Iterator[AuthorityRecord | RecordError]:
    reader = csv.reader(_strip_newlines(lines))
    header = next(reader, None)
    if header is None:
        return
    columns = [h.strip().lower() for h in header]
    missing = [c for c in REQUIRED_COLUMNS if c not in columns]
    if missing:
        yield RecordError(1, f"CSV header lacks column(s) {', '.join(missing)}; "
                             "expected id,name,type,aliases")
        return
    for row in reader:
        number = reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        if len(row) > len(columns):
            yield RecordError(number, f"{len(row)} fields, but the header has {len(columns)}")
            continue
        obj = dict(zip(columns, row + [""] * (len(columns) - len(row))))
        raw_aliases = obj.get("aliases", "")
        aliases = [a for a in raw_aliases.split("|")] if raw_aliases else []
        yield _record(number, obj, aliases)


def _strip_newlines(lines: Iterable[str]) -> Iterator[str]:
    for line in lines:
        yield line if line.endswith("\n") else line + "\n"


def _record(number: int, obj: Mapping[str, object], aliases: object) -> AuthorityRecord | RecordError:
    for field in REQUIRED_COLUMNS:
        if field not in obj:
            return RecordError(number, f"missing field {field!r}")
        if not isinstance(obj[field], str):
            return RecordError(number, f"field {field!r} must be a string")
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        return RecordError(number, "field 'aliases' must be a list of strings")
    return AuthorityRecord(
        line=number,
        entity_id=str(obj["id"]),
        name=str(obj["name"]),
        entity_type=str(obj["type"]),
        aliases=tuple(aliases),
    )
