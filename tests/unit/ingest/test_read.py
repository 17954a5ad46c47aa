"""Reading JSON Lines: positions, blank lines, directories, lines over the cap, compression."""

from __future__ import annotations

import bz2
import gzip
import lzma
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


LINES = b'{"a": 1}\n\n{"b": 2}\r\n' + b"z" * 50 + b'\n{"c": 3}'
COMPRESSORS = {"gzip": gzip.compress, "bzip2": bz2.compress, "xz": lzma.compress}


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_compressed_files_read_as_their_text(tmp_path: Path, kind: str) -> None:
    """Known by their first bytes: the same lines, positions and cap as the plain file."""
    plain, packed = tmp_path / "a.jsonl", tmp_path / "b.jsonl"  # the name says nothing
    plain.write_bytes(LINES)
    packed.write_bytes(COMPRESSORS[kind](LINES))

    def seen(path: Path) -> list[tuple[int, bytes | None, int]]:
        return [(x.line_no, x.data, x.size) for x in read_inputs([path], max_line_bytes=20)]

    assert seen(packed) == seen(plain) == [(1, b'{"a": 1}', 8), (3, b'{"b": 2}', 8),
                                           (4, None, 51), (5, b'{"c": 3}', 8)]


def test_directories_take_compressed_json_lines_files(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl.gz").write_bytes(gzip.compress(b"1\n"))
    (tmp_path / "b.NDJSON.XZ").write_bytes(lzma.compress(b"2\n"))
    (tmp_path / "c.jsonl.bz2").write_bytes(bz2.compress(b"3\n"))
    (tmp_path / "d.txt.gz").write_bytes(gzip.compress(b"ignored\n"))
    (tmp_path / "e.gz").write_bytes(gzip.compress(b"ignored\n"))
    assert [x.data for x in read_inputs([tmp_path], max_line_bytes=10)] == [b"1", b"2", b"3"]


@pytest.mark.parametrize("kind", sorted(COMPRESSORS))
def test_compressed_data_cut_short_keeps_the_lines_before_and_rejects_the_rest(
        tmp_path: Path, kind: str) -> None:
    body = b"".join(b'{"n": %d, "pad": "%s"}\n' % (i, b"x" * (i % 7)) for i in range(2000))
    packed = COMPRESSORS[kind](body)
    f = tmp_path / "a.jsonl.gz"
    f.write_bytes(packed[: len(packed) * 2 // 3])
    lines = list(read_inputs([f], max_line_bytes=100))
    *read, last = lines
    assert read or kind == "bzip2"  # bzip2 gives nothing before its block (900 kB) is whole
    assert [x.data for x in read] == body.splitlines()[: len(read)]
    assert last.data is None and last.line_no == len(read) + 1
    assert f"{kind} data is corrupt or cut short" in last.unreadable
