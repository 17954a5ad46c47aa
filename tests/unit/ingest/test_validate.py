"""Validation is per item: each kind of bad input is rejected with a reason, the rest is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest

from ingest.models import Limits
from ingest.read import RawLine
from ingest.validate import CheckedPaper, LineReject, drop_refused_mentions, parse_line
from ingest.vocabulary import default_vocabulary


def paper(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "paper_id": "p1",
        "mentions": [
            {"id": "m1", "text": "BERT", "type": "method", "span": [0, 4]},
            {"id": "m2", "text": "SQuAD", "type": "dataset"},
        ],
        "relationships": [
            {"subject": "m1", "predicate": "evaluated on", "object": "m2", "confidence": 0.9,
             "evidence": {"span": {"start": 5, "end": 30}, "quote": "BERT on SQuAD"}},
        ],
    }
    base.update(overrides)
    return base


def parse(obj: Any, limits: Limits | None = None, *, raw: bytes | None = None) -> Any:
    data = raw if raw is not None else json.dumps(obj).encode()
    line = RawLine("in.jsonl", 7, data, len(data), data[:1024])
    return parse_line(line, vocabulary=default_vocabulary(), limits=limits or Limits())


def test_good_paper() -> None:
    p = parse(paper())
    assert isinstance(p, CheckedPaper)
    assert p.rejects == ()
    assert p.position == "in.jsonl:7"
    assert [m.mention_id for m in p.mentions] == ["m1", "m2"]
    (r,) = p.relationships
    assert (r.predicate, r.raw_predicate, r.confidence) == ("evaluated_on", "evaluated on", 0.9)
    assert r.evidence_span is not None and r.evidence_span.end == 30
    assert p.revision == p.content_hash  # no revision given


def test_absent_confidence_is_one_and_revision_is_kept() -> None:
    rel = {"subject": "m1", "predicate": "uses", "object": "m2"}
    p = parse(paper(revision="v3", relationships=[rel]))
    assert p.relationships[0].confidence == 1.0
    assert p.revision == "v3"


def test_inverse_phrasing_swaps_subject_and_object() -> None:
    rel = {"subject": "m2", "predicate": "is used by", "object": "m1"}
    (r,) = parse(paper(relationships=[rel])).relationships
    assert (r.subject_mention_id, r.predicate, r.object_mention_id, r.inverted) == (
        "m1", "uses", "m2", True)


def test_unknown_predicate_becomes_related_to_with_raw_kept() -> None:
    rel = {"subject": "m1", "predicate": "is reminiscent of", "object": "m2"}
    (r,) = parse(paper(relationships=[rel])).relationships
    assert (r.predicate, r.raw_predicate) == ("related_to", "is reminiscent of")


@pytest.mark.parametrize(("given", "raw"), [("  ", "  "), ("", ""), (None, "")])
def test_a_blank_or_null_predicate_is_unknown_so_related_to(given: str | None, raw: str) -> None:
    """SPEC section 6 rejects self-loops, dangling ids, bad confidences and oversized fields,
    and reads an unknown predicate as the weak `related_to`: a blank one is unknown too (null
    reads as blank), so the edge is kept; a missing one is still refused."""
    rel = {"subject": "m1", "predicate": given, "object": "m2"}
    p = parse(paper(relationships=[rel]))
    assert p.rejects == ()
    (r,) = p.relationships
    assert (r.predicate, r.raw_predicate, r.inverted) == ("related_to", raw, False)


def test_content_hash_ignores_formatting_but_not_content() -> None:
    a = parse(paper())
    b = parse(None, raw=json.dumps(paper(), indent=None, separators=(", ", ":  ")).encode())
    c = parse(paper(revision="v2"))
    assert a.content_hash == b.content_hash != c.content_hash
    assert a.relationships[0].relationship_id == b.relationships[0].relationship_id
    assert a.relationships[0].relationship_id != c.relationships[0].relationship_id


BAD_RELATIONSHIPS = [
    ({"subject": "m1", "predicate": "uses", "object": "m9"}, "'m9' is not a mention id"),
    ({"subject": "m1", "predicate": "uses", "object": "m1"}, "self-loop"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": "0.9"},
     "confidence: Input should be a valid number (got str)"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": float("nan")},
     "finite"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": float("inf")},
     "finite"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": 1.5},
     "between 0 and 1"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": -0.1},
     "between 0 and 1"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": True},
     "valid number"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": 2}, "got 2"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "confidence": 10**400},
     "between 0 and 1, got a 401-digit number"),
    ({"subject": "m1", "object": "m2"}, "predicate: required field is missing"),
    ({"subject": "m1", "predicate": 7, "object": "m2"}, "predicate: Input should be a valid string"),
    ({"subject": 1, "predicate": "uses", "object": "m2"},
     "subject: '1' is not a mention id of this paper"),
    ({"subject": 1.5, "predicate": "uses", "object": "m2"},
     "subject: must be a string or an integer (got the fraction 1.5)"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "evidence": "quote"},
     "evidence"),
    ({"subject": "m1", "predicate": "uses", "object": "m2", "evidence": {"span": [9, 3]}},
     "before its start"),
    ({"subject": "m1", "predicate": "uses", "object": "m2",
      "evidence": {"quote": "x" * (64 * 1024 + 1)}}, "more than the cap of 65536"),
    ("not an object", "must be a JSON object, got string"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_RELATIONSHIPS)
def test_bad_relationship_is_rejected_alone(bad: Any, reason: str) -> None:
    good = paper()["relationships"][0]
    p = parse(paper(relationships=[good, bad]))
    assert isinstance(p, CheckedPaper)
    assert len(p.relationships) == 1 and p.relationships[0].index == 0
    (reject,) = p.rejects
    assert reject.item == "relationships[1]"
    assert reason in reject.reason
    assert reject.reason.startswith("relationships[1]")


BAD_MENTIONS = [
    ({"id": "m3", "type": "method"}, "text: required field is missing"),
    ({"id": "m3", "text": "  ", "type": "method"}, "text is empty"),
    ({"id": "m3", "text": "X"}, "type: required field is missing"),
    ({"id": "m3", "text": 42, "type": "method"}, "valid string (got int)"),
    ({"id": 3.5, "text": "X", "type": "method"}, "id: must be a string or an integer"),
    ({"id": "m3", "text": "x" * 513, "type": "method"}, "513 characters long"),
    ({"text": "X", "type": "method"}, "id: required field is missing"),
    ({"id": "m3", "text": "X", "type": "method", "span": [1]}, "span"),
    ({"id": "m3", "text": "X", "type": "method", "span": [-1, 2]}, "must be non-negative"),
    ({"id": "m1", "text": "Again", "type": "method"}, "duplicate mention id 'm1'"),
    (["m3"], "must be a JSON object, got array"),
]


@pytest.mark.parametrize(("bad", "reason"), BAD_MENTIONS)
def test_bad_mention_is_rejected_alone(bad: Any, reason: str) -> None:
    p = parse(paper(mentions=[*paper()["mentions"], bad]))
    assert isinstance(p, CheckedPaper)
    assert [m.mention_id for m in p.mentions] == ["m1", "m2"]
    assert len(p.relationships) == 1
    (reject,) = p.rejects
    assert reject.item == "mentions[2]"
    assert reason in reject.reason


def test_relationship_on_a_rejected_mention_is_rejected_with_its_reason() -> None:
    mentions = [*paper()["mentions"], {"id": "m3", "text": "", "type": "method"}]
    rels = [*paper()["relationships"], {"subject": "m3", "predicate": "uses", "object": "m1"}]
    p = parse(paper(mentions=mentions, relationships=rels))
    assert len(p.relationships) == 1
    assert [r.item for r in p.rejects] == ["mentions[2]", "relationships[1]"]
    assert "mention 'm3' was rejected (mentions[2])" in p.rejects[1].reason


def test_a_blank_type_is_kept_for_the_server_to_read_as_other() -> None:
    """SPEC section 2 reads an empty type as the wildcard `other`; section 6 rejects a missing
    one, not a blank one: the mention and its relationships are kept."""
    mentions = [*paper()["mentions"], {"id": "m3", "text": "Transformer", "type": "  "}]
    rels = [*paper()["relationships"], {"subject": "m3", "predicate": "uses", "object": "m1"}]
    p = parse(paper(mentions=mentions, relationships=rels))
    assert isinstance(p, CheckedPaper) and p.rejects == ()
    assert [(m.mention_id, m.entity_type) for m in p.mentions][-1] == ("m3", "  ")
    assert len(p.relationships) == 2
    missing = parse(paper(mentions=[*paper()["mentions"], {"id": "m3", "text": "X"}]))
    assert [r.reason for r in missing.rejects] == ["mentions[2].type: required field is missing"]


def test_a_null_type_is_read_as_blank() -> None:
    """Extractors write null for a mention they could not label: the mention and its
    relationships are kept, the type blank (the server's `other`); a type of another JSON type
    is still refused."""
    mentions = [*paper()["mentions"], {"id": "m3", "text": "Transformer", "type": None}]
    rels = [*paper()["relationships"], {"subject": "m3", "predicate": "uses", "object": "m1"}]
    p = parse(paper(mentions=mentions, relationships=rels))
    assert isinstance(p, CheckedPaper) and p.rejects == ()
    assert [(m.mention_id, m.entity_type) for m in p.mentions][-1] == ("m3", "")
    assert len(p.relationships) == 2
    numbered = parse(paper(mentions=[*paper()["mentions"], {"id": "m3", "text": "X", "type": 7}]))
    assert [r.reason for r in numbered.rejects] == [
        "mentions[2].type: Input should be a valid string (got int)"]


def test_integer_ids_and_revisions_are_read_as_their_decimal_text() -> None:
    """Extractors often number their mentions; "1" and 1 name the same mention."""
    raw = json.dumps({
        "paper_id": 1234, "revision": 2,
        "mentions": [{"id": 1, "text": "BERT", "type": "method"},
                     {"id": "2", "text": "SQuAD", "type": "dataset"},
                     {"id": 3, "text": " ", "type": "method"},
                     {"id": "1", "text": "Again", "type": "method"}],
        "relationships": [{"subject": 1, "predicate": "evaluated on", "object": 2},
                          {"subject": "1", "predicate": "uses", "object": 3},
                          {"subject": True, "predicate": "uses", "object": 2}]}).encode()
    p = parse(None, raw=raw)
    assert isinstance(p, CheckedPaper)
    assert (p.paper_id, p.revision) == ("1234", "2")
    assert [m.mention_id for m in p.mentions] == ["1", "2"]
    assert [(r.subject_mention_id, r.object_mention_id) for r in p.relationships] == [("1", "2")]
    assert [r.reason for r in p.rejects] == [
        "mentions[2].text: text is empty",
        "mentions[3]: duplicate mention id '1' (first at mentions[0])",
        "relationships[1].object: mention '3' was rejected (mentions[2])",
        "relationships[2].subject: must be a string or an integer (got a boolean)",
    ]


def test_duplicate_relationship_is_rejected() -> None:
    rel = paper()["relationships"][0]
    p = parse(paper(relationships=[rel, rel]))
    assert len(p.relationships) == 1
    assert "duplicate of relationships[0]" in p.rejects[0].reason


@pytest.mark.parametrize(("first", "second"), [({}, {"confidence": 1.0}),
                                                ({"confidence": 1}, {}),
                                                ({"confidence": 0.0}, {"confidence": -0.0})])
def test_relationships_stored_alike_are_duplicates(first: dict[str, Any],
                                                   second: dict[str, Any]) -> None:
    """An absent confidence is stored as 1.0 (and -0.0 as a zero): the same row twice."""
    rel = {"subject": "m1", "predicate": "uses", "object": "m2"}
    p = parse(paper(relationships=[rel | first, rel | second]))
    assert [r.index for r in p.relationships] == [0]
    assert [r.reason for r in p.rejects] == ["relationships[1]: duplicate of relationships[0]"]


def test_relationships_written_differently_are_kept_apart() -> None:
    """A predicate is kept as written (`raw_predicate`), so two spellings are two claims."""
    rel = {"subject": "m1", "predicate": "uses", "object": "m2"}
    p = parse(paper(relationships=[rel, rel | {"predicate": "Uses"},
                                   rel | {"confidence": 0.99}]))
    assert [r.index for r in p.relationships] == [0, 1, 2]
    assert p.rejects == ()


@pytest.mark.parametrize(("raw", "reason"), [
    (b'{"paper_id": "p1", "mentions": [', "line is not valid JSON: Expecting value at column 33"),
    (b'{"paper_id": "p1', "line is not valid JSON: Unterminated string starting at column 14"),
])
def test_a_line_that_is_not_json_says_where_it_breaks(raw: bytes, reason: str) -> None:
    p = parse(None, raw=raw)
    assert isinstance(p, LineReject)
    assert p.reason == reason


def test_caps_on_counts() -> None:
    limits = Limits(max_mentions=1, max_relationships=0)
    p = parse(paper(), limits)
    assert [m.mention_id for m in p.mentions] == ["m1"]
    assert {r.item for r in p.rejects} == {"mentions[1]", "relationships[0]"}


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b'{"paper_id": "p1", "mentions": [', "not valid JSON"),
        (b"\xff\xfe{}", "not valid UTF-8"),
        (b"[1, 2]", "must be a JSON object, got array"),
        (b'{"mentions": [], "relationships": []}', "paper.paper_id: required field is missing"),
        (b'{"paper_id": 7.0, "mentions": [], "relationships": []}',
         "paper.paper_id: must be a string or an integer (got the fraction 7.0)"),
        (b'{"paper_id": true, "mentions": [], "relationships": []}',
         "paper.paper_id: must be a string or an integer (got a boolean)"),
        (b'{"paper_id": "p", "mentions": {}, "relationships": []}',
         "paper.mentions: Input should be a valid list (got dict)"),
        (b'{"paper_id": "p", "mentions": []}', "paper.relationships: required field"),
        (b'{"paper_id": "p", "revision": [2], "mentions": [], "relationships": []}',
         "paper.revision: must be a string or an integer (got an array)"),
    ],
)
def test_bad_lines_are_rejected_whole(raw: bytes, reason: str) -> None:
    result = parse(None, raw=raw)
    assert isinstance(result, LineReject)
    assert result.position == "in.jsonl:7"
    assert reason in result.reason


def test_oversized_line() -> None:
    line = RawLine("in.jsonl", 3, None, 20_000_000, b'{"paper_id": "big"')
    result = parse_line(line, vocabulary=default_vocabulary(), limits=Limits())
    assert isinstance(result, LineReject)
    assert "20000000 bytes" in result.reason and "16777216" in result.reason
    assert result.raw.startswith('{"paper_id"')


def test_refused_mentions_take_their_relationships_with_them() -> None:
    p = parse(paper())
    dropped = drop_refused_mentions(p, {1: "INVALID_ARGUMENT: empty"})
    assert [m.mention_id for m in dropped.mentions] == ["m1"]
    assert dropped.relationships == ()
    assert [r.item for r in dropped.rejects] == ["mentions[1]", "relationships[0]"]
    assert "identity server refused the mention: INVALID_ARGUMENT: empty" in dropped.rejects[0].reason


def test_configured_caps_are_applied() -> None:
    p = parse(paper(), Limits(max_mention_chars=4, max_predicate_chars=5))
    assert [m.mention_id for m in p.mentions] == ["m1"]  # "SQuAD" is 5 characters
    assert "more than the cap of 4" in p.rejects[0].reason
    assert any("predicate is 12 characters long" in r.reason for r in p.rejects)
    # The caps hold only for that call.
    assert parse(paper()).rejects == ()


def test_lone_surrogates_reject_their_item_or_line_and_stay_storable() -> None:
    """JSON can spell "\\ud800"; no UTF-8 store holds it, so it costs only its own item."""
    item = parse(None, raw=b'{"paper_id": "p1", "mentions": [{"id": "m1", "text": "Ada\\ud800", '
                          b'"type": "person"}, {"id": "m2", "text": "Bob", "type": "person"}], '
                          b'"relationships": []}')
    assert isinstance(item, CheckedPaper)
    assert [m.mention_id for m in item.mentions] == ["m2"]
    (reject,) = item.rejects
    assert "lone surrogate" in reject.reason and reject.item == "mentions[0]"
    reject.raw.encode("utf-8")  # storable: the surrogate is escaped

    line = parse(None, raw=b'{"paper_id": "p\\ud800", "mentions": [], "relationships": []}')
    assert isinstance(line, LineReject)
    assert "paper_id" in line.reason and "lone surrogate" in line.reason
    assert line.paper_id is None
    line.raw.encode("utf-8")


def test_an_integer_longer_than_python_converts_costs_only_its_item() -> None:
    """An integer literal of more digits than Python turns into an int (4,300 by default, a
    guard against quadratic conversion) is valid JSON: the item holding it is refused with
    what was wrong, an unknown key holding one is ignored, and the rest of the paper is read."""
    huge = "1" + "0" * 5000
    good = json.dumps(paper()["relationships"][0])
    line = json.dumps(paper(relationships=["@BAD@", "@GOOD@"], mentions=[
        *paper()["mentions"], {"id": "m3", "text": "X", "type": "method", "span": "@SPAN@"},
        {"id": "@ID@", "text": "Y", "type": "method"}]))
    line = (line.replace('"@BAD@"', '{"subject": "m1", "predicate": "uses", "object": "m2", '
                                    f'"confidence": {huge}}}')
            .replace('"@GOOD@"', good).replace('"@SPAN@"', f"[0, -{huge}]")
            .replace('"@ID@"', huge)
            .replace('"paper_id"', f'"extra": {huge}, "paper_id"'))
    p = parse(None, raw=line.encode())
    assert isinstance(p, CheckedPaper)
    assert [m.mention_id for m in p.mentions] == ["m1", "m2"]
    assert [r.index for r in p.relationships] == [1]
    reasons = {r.item: r.reason for r in p.rejects}
    assert "between 0 and 1, got a 5001-digit number" in reasons["relationships[0]"]
    assert "valid integer (got a 5001-digit integer)" in reasons["mentions[2]"]
    assert "5001 characters long" in reasons["mentions[3]"]
    again = parse(None, raw=line.replace(huge, huge + "0", 1).encode())
    assert isinstance(again, CheckedPaper) and again.content_hash != p.content_hash


@pytest.mark.parametrize("paper_id", ["W\x1b[31m1", "W\x00", "p\u200b1", "p\t1"])
def test_a_paper_id_with_a_control_character_is_a_line_reject(paper_id: str) -> None:
    """The server refuses such a context id for the whole batch: a reject naming it instead."""
    p = parse(paper(paper_id=paper_id))
    assert isinstance(p, LineReject)
    assert "paper.paper_id: has control character U+" in p.reason


def test_a_paper_id_with_other_unicode_stays_good() -> None:
    assert isinstance(parse(paper(paper_id="Pàper 1 · α")), CheckedPaper)
