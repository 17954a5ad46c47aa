"""Reading authority files: a bad line refuses its own record, never the rest of the file."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from identity_server.authority import (
    MAX_LINE_BYTES,
    AuthorityRecord,
    RecordError,
    TooLong,
    decode_lines,
    parse_authority,
    split_lines,
)
from identity_server.errors import InvalidArgument


def parsed(data: bytes, fmt: str | None = None) -> list[tuple[int, str]]:
    """(line, id) for each record and (line, "error: ...") for each refusal, in file order."""
    out = []
    for item in parse_authority(decode_lines(data.split(b"\n")), fmt):
        if isinstance(item, RecordError):
            out.append((item.line, f"error: {item.message}"))
        else:
            assert isinstance(item, AuthorityRecord)
            out.append((item.line, item.entity_id))
    return out


def test_a_jsonl_line_that_is_not_utf8_refuses_that_record_only() -> None:
    data = (b'{"id": "A", "name": "Ada", "type": "person"}\n'
            b'{"id": "B", "name": "Caf\xe9", "type": "other"}\n'
            b'{"id": "C", "name": "Caf\xc3\xa9", "type": "other"}\n')
    assert parsed(data) == [
        (1, "A"),
        (2, "error: not valid UTF-8 (invalid continuation byte at byte 25 of the line)"),
        (3, "C"),
    ]


def test_a_csv_record_holding_a_line_that_is_not_utf8_is_refused_with_that_line() -> None:
    data = (b'id,name,type\n'
            b'A,"Two\nlin\xe9s",other\n'  # one record over lines 2-3, line 3 is not UTF-8
            b'B,Bee,other\n'
            b'C,\xff,other\n'
            b'D,Dee,other\n')
    assert parsed(data) == [
        (3, "error: not valid UTF-8 (invalid continuation byte at byte 4 of the line)"),
        (4, "B"),
        (5, "error: not valid UTF-8 (invalid start byte at byte 3 of the line)"),
        (6, "D"),
    ]


def test_a_file_of_nothing_but_unreadable_lines_refuses_each() -> None:
    """It read as an empty file: nothing imported, nothing refused, exit 0."""
    lines: list[bytes | TooLong] = [TooLong(MAX_LINE_BYTES + 1, MAX_LINE_BYTES), b"",
                                    TooLong(MAX_LINE_BYTES * 2, MAX_LINE_BYTES)]
    got = [(e.line, e.message) for e in parse_authority(decode_lines(lines))
           if isinstance(e, RecordError)]
    def too_long(size: int) -> str:
        return f"line is {size} bytes long, more than the cap of {MAX_LINE_BYTES} bytes"

    assert got == [(1, too_long(MAX_LINE_BYTES + 1)), (3, too_long(MAX_LINE_BYTES * 2))]


def test_a_csv_record_over_several_lines_is_named_by_its_first() -> None:
    """It was named by its last: a quote left open named the end of the file, far from it."""
    data = (b'id,name,type\n'
            b'\n'
            b'A,"Two\nlines",other\n'
            b'B,Bee,other\n'
            b'C,"open quote,other\n'
            b'D,Dee,other\n'
            b'E,Eee,other\n')
    got = parsed(data)
    assert [line for line, _ in got] == [3, 5, 6]
    assert got[2][1] == "C"  # its name took in the lines after it, up to the end


def test_a_csv_header_that_cannot_be_read_refuses_the_file_with_its_line() -> None:
    assert parsed(b"id,n\xe4me,type\nA,x,other\n", "csv") == [
        (1, ("error: the CSV header cannot be read: not valid UTF-8 (invalid continuation "
             "byte at byte 5 of the line)"))]


def test_a_csv_field_over_the_readers_limit_refuses_its_row_and_reading_goes_on() -> None:
    data = b"id,name,type\nA," + b"x" * 200_000 + b",other\nB,Bee,other\n"
    [(line, message), rest] = parsed(data)
    assert (line, rest) == (2, (3, "B"))
    assert message.startswith("error: not valid CSV: field larger than field limit")


def test_a_utf8_byte_order_mark_is_dropped_and_a_utf16_file_refused_whole() -> None:
    record = '{"id": "A", "name": "Ada", "type": "person"}\n'
    assert parsed(b"\xef\xbb\xbf" + record.encode()) == [(1, "A")]
    for encoding in ("utf-16", "utf-16-be"):
        data = ("\ufeff" if encoding.endswith("be") else "") + record
        with pytest.raises(InvalidArgument, match="UTF-16"):
            parsed(data.encode(encoding))


def test_a_jsonl_id_may_be_an_integer_read_as_its_text() -> None:
    data = (b'{"id": 42, "name": "Ada", "type": "person"}\n'
            b'{"id": true, "name": "Bee", "type": "person"}\n'
            b'{"id": 4.2, "name": "Cee", "type": "person"}\n'
            b'{"id": "Q1", "name": 7, "type": "person"}\n')
    assert parsed(data) == [
        (1, "42"),
        (2, "error: field 'id' must be a string or an integer"),
        (3, "error: field 'id' must be a string or an integer"),
        (4, "error: field 'name' must be a string"),
    ]


def _reference_lines(data: bytes, cap: int) -> list[bytes | TooLong]:
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    return [line if len(line) <= cap else TooLong(len(line), cap) for line in lines]


@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200).map(lambda b: b.replace(b"\x00", b"\n")),
       cuts=st.lists(st.integers(min_value=0, max_value=200), max_size=8),
       cap=st.integers(min_value=0, max_value=40))
def test_split_lines_gives_the_lines_whatever_the_chunks_and_stands_in_for_long_ones(
        data: bytes, cuts: list[int], cap: int) -> None:
    bounds = [0, *sorted(c for c in cuts if c <= len(data)), len(data)]
    chunks = [data[a:b] for a, b in itertools.pairwise(bounds)]
    assert list(split_lines(chunks, cap)) == _reference_lines(data, cap)


def test_a_line_over_the_cap_refuses_its_record_and_is_never_held_whole() -> None:
    huge = b'{"id": "B", "name": "' + b"x" * (MAX_LINE_BYTES + 10) + b'", "type": "other"}'
    chunks = [b'{"id": "A", "name": "Ada", "type": "person"}\n', *(
        huge[i:i + (1 << 20)] for i in range(0, len(huge), 1 << 20)),
        b'\n{"id": "C", "name": "Cy", "type": "person"}']
    records = list(parse_authority(decode_lines(split_lines(chunks))))
    assert [getattr(r, "entity_id", None) for r in records] == ["A", None, "C"]
    assert records[1] == RecordError(
        2, f"line is {len(huge)} bytes long, more than the cap of {MAX_LINE_BYTES} bytes")


def test_a_csv_separated_by_semicolons_or_tabs_is_read_by_its_header() -> None:
    """A spreadsheet's export where the decimal mark is a comma separates with ';'; a TSV file
    with tabs. Commas inside the names stay theirs."""
    for sep in (b";", b"\t"):
        data = sep.join([b"id", b"name", b"type", b"aliases"]) + b"\n" + sep.join(
            [b"C-1", b"Smith, Jane", b"person", b"J. Smith|Jane Smith"]) + b"\n"
        [record] = parse_authority(decode_lines(data.split(b"\n")), "csv")
        assert record == AuthorityRecord(2, "C-1", "Smith, Jane", "person",
                                         ("J. Smith", "Jane Smith"))
    assert parsed(b"\n\nid;name;type\nA;Ada, B.;person\n\nB;Bo;person\n", "csv") == [
        (4, "A"), (6, "B")]  # blank lines before the header and between rows: numbers hold
    assert parsed(b"id|name|type\nA|x|other\n", "csv") == [
        (1, ("error: CSV header lacks column(s) id, name, type; expected "
             "id,name,type,aliases (or separated by ';' or tabs)"))]


def test_a_csv_header_naming_a_column_twice_is_refused() -> None:
    """Which `name` would a record mean? Before, the last one silently won."""
    assert parsed(b"id,name,type,Name\nQ1,Ada Lovelace,person,Ada King\n", "csv") == [
        (1, "error: CSV header names column(s) name more than once")]
    assert parsed(b"id,name,type,note,note\nQ1,Ada,person,a,b\n", "csv") == [(2, "Q1")]


def test_jsonl_aliases_may_be_absent_or_null_but_not_a_string() -> None:
    data = (b'{"id": "A", "name": "Ada", "type": "person"}\n'
            b'{"id": "B", "name": "Bo", "type": "person", "aliases": null}\n'
            b'{"id": "C", "name": "Cy", "type": "person", "aliases": "C. Y."}\n')
    assert parsed(data) == [
        (1, "A"), (2, "B"), (3, "error: field 'aliases' must be a list of strings")]
