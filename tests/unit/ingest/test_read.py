"""Reading JSON Lines: positions, blank lines, directories, lines over the cap."""

from __future__ import annotations

from pathlib import Path

import pytest

from ingest.read import InputError, expand_paths, read_inputs


def test_positions_skip_blank_lines(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b'{"a": 1}\n\n   \n{"b": 2}\r\n{"c": 3}')
    lines = list(read_inputs([f], max_line_bytes=100))
    assert [(x.line_no, x.data) for x in lines] == [(1, b'{"a": 1}'), (4, b'{"b": 2}'),
                                                     (5, b'{"c": 3}')]
    assert lines[0].position == f"{f}:1"


def test_line_over_the_cap_is_not_kept(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    big = b'{"x": "' + b"y" * 5000 + b'"}'
    f.write_bytes(b'{"a": 1}\n' + big + b'\n{"b": 2}\n')
    lines = list(read_inputs([f], max_line_bytes=1000))
    assert [x.line_no for x in lines] == [1, 2, 3]
    assert lines[1].data is None
    assert lines[1].size == len(big) + 1
    assert len(lines[1].prefix) <= 1024
    assert lines[2].data == b'{"b": 2}'


def test_line_exactly_at_the_cap_is_kept(tmp_path: Path) -> None:
    f = tmp_path / "a.jsonl"
    f.write_bytes(b"x" * 10 + b"\n" + b"y" * 10)
    lines = list(read_inputs([f], max_line_bytes=10))
    assert [x.data for x in lines] == [b"x" * 10, b"y" * 10]


def test_directories_are_read_recursively_in_order(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "b.jsonl").write_text("2\n")
    (tmp_path / "a.jsonl").write_text("1\n")
    (tmp_path / "sub" / "c.ndjson").write_text("3\n")
    (tmp_path / "sub" / "D.JSONL").write_text("4\n")  # the suffix in any case
    (tmp_path / "notes.txt").write_text("ignored\n")
    assert [x.data for x in read_inputs([tmp_path], max_line_bytes=10)] == [
        b"1", b"2", b"4", b"3"]


def test_missing_path_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        expand_paths([tmp_path / "nope.jsonl"])
