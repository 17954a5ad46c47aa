"""The fast path of validation gives exactly what the per-item path gives, or declines.

``parse_line`` first tries one pass of plain checks over the whole paper and falls back to per-item
pydantic validation when anything is off. These tests hold the two to the same output: the fast
path must decline every paper with a reject (so reasons come from one place) and, for every paper it
takes, build the same checked paper (same ids, hashes, spans, readings) as the per-item path.
"""

from __future__ import annotations

import copy
import hashlib
import json
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from ingest.models import Limits, PaperEnvelope, limits_in_force
from ingest.read import RawLine
from ingest.testing import synthetic_papers
from ingest.validate import (
    _CANONICAL,
    CheckedPaper,
    _fast_paper,
    _read_fast,
    canonical_json,
    check_paper,
    parse_line,
    relationship_id,
)
from ingest.vocabulary import default_vocabulary

VOCABULARY = default_vocabulary()
HASH = "f" * 64


def paper(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "paper_id": "p1",
        "mentions": [
            {"id": "m1", "text": "BERT", "type": "method", "span": [0, 4]},
            {"id": "m2", "text": "SQuAD", "type": "dataset"},
            {"id": "m3", "text": "GLUE", "type": "dataset", "span": {"start": 9, "end": 13}},
        ],
        "relationships": [
            {"subject": "m1", "predicate": "evaluated on", "object": "m2", "confidence": 0.9,
             "evidence": {"span": {"start": 5, "end": 30}, "quote": "BERT on SQuAD"}},
            {"subject": "m3", "predicate": "is used by", "object": "m1"},
        ],
    }
    base.update(overrides)
    return base


def both(obj: dict[str, Any], limits: Limits | None = None) -> tuple[Any, Any]:
    """(fast path result or None, per-item path result) for one parsed line; the per-item result
    is None when the line is rejected whole (the envelope is bad)."""
    limits = limits or Limits()
    fast = _fast_paper(obj, "in.jsonl:1", HASH, VOCABULARY, limits)
    with limits_in_force(limits):
        try:
            envelope = PaperEnvelope.model_validate(obj)
        except ValidationError:
            return fast, None
        slow = check_paper(envelope, "in.jsonl:1", HASH, vocabulary=VOCABULARY, limits=limits)
    return fast, slow


def with_rel(**fields: Any) -> dict[str, Any]:
    rel = {"subject": "m1", "predicate": "uses", "object": "m2", **fields}
    return paper(relationships=[rel])


def with_mention(**fields: Any) -> dict[str, Any]:
    mention = {"id": "m9", "text": "T5", "type": "method", **fields}
    return paper(mentions=[*paper()["mentions"], mention])


CLEAN = [
    paper(),
    paper(revision="v2", extra={"ignored": [1, 2]}),
    paper(mentions=[], relationships=[]),
    with_rel(confidence=1),
    with_rel(confidence=0),
    with_rel(confidence=-0.0),
    with_rel(confidence=1e-05),
    with_rel(confidence=0.30000000000000004),
    with_rel(confidence=None, evidence=None),
    with_rel(evidence={}),
    with_rel(evidence={"span": None, "quote": None, "note": "x"}),
    with_rel(evidence={"quote": 'q"uo\\te\n\t\x00\x7f\u2028 é € 😀 </script>'}),
    with_rel(evidence={"span": [0, 0]}),
    with_rel(evidence={"span": [2**63 - 1, 2**63 - 1]}),  # the largest a BIGINT column holds
    with_rel(predicate="Is_Used-By"),
    with_rel(predicate="something new", subject="m2", object="m1"),
    with_rel(subject="m1 ", object="m1") | {"mentions": [
        {"id": "m1", "text": "A", "type": "t"}, {"id": "m1 ", "text": "B", "type": "t"}]},
    with_mention(span={"start": 1, "end": 2, "extra": True}),
    with_mention(text="x" * 512, id="i" * 512, type="t" * 128),
    with_mention(text="  padded  ", unknown=None),
]


@pytest.mark.parametrize("obj", CLEAN, ids=range(len(CLEAN)))
def test_clean_papers_take_the_fast_path_with_identical_results(obj: dict[str, Any]) -> None:
    fast, slow = both(obj)
    assert slow.rejects == ()
    assert fast == slow


def test_relationship_ids_are_the_documented_digest() -> None:
    fast, _ = both(paper())
    key = json.dumps(["m1", "evaluated on", "m2", 0.9, [5, 30], "BERT on SQuAD"],
                     ensure_ascii=False, separators=(",", ":"))
    assert fast.relationships[0].relationship_id == relationship_id("p1", HASH, HASH, key)


def test_an_explicit_confidence_of_one_has_the_id_of_an_absent_one() -> None:
    """Both are stored as 1.0: one relationship, one id, on either path."""
    absent, _ = both(with_rel())
    for explicit in (with_rel(confidence=1.0), with_rel(confidence=1)):
        fast, slow = both(explicit)
        assert fast == slow
        assert fast.relationships[0].relationship_id == absent.relationships[0].relationship_id


DECLINED = [
    with_rel(subject="m9"),
    with_rel(object="m1"),
    with_rel(confidence=True),
    with_rel(confidence="0.9"),
    with_rel(confidence=1.5),
    with_rel(confidence=2),
    with_rel(confidence=10**400),
    with_rel(confidence=float("nan")),
    with_rel(confidence=float("inf")),
    with_rel(predicate=7),
    with_rel(predicate="p" * 257),
    paper(relationships=[{"subject": "m1", "object": "m2"}]),  # no predicate at all
    with_rel(evidence=[]),
    with_rel(evidence={"quote": 7}),
    with_rel(evidence={"quote": "q" * 65537}),
    with_rel(evidence={"quote": "€" * 21846}),
    with_rel(evidence={"span": [3, 2]}),
    with_rel(evidence={"span": [1, 2, 3]}),
    with_rel(evidence={"span": [1.0, 2]}),
    with_rel(evidence={"span": [True, 2]}),
    with_rel(evidence={"span": {"start": 1}}),
    with_rel(evidence={"span": "1-2"}),
    with_rel(evidence={"span": [0, 2**63]}),  # past BIGINT: rejected, not a failed write
    with_mention(span=[2**70, 2**71]),
    paper(relationships=[*paper()["relationships"], paper()["relationships"][0]]),
    paper(relationships=[7]),
    with_mention(text=""),
    with_mention(text="\x1c"),
    with_mention(text="\u3000"),
    with_mention(id=" "),
    with_mention(id="m1"),
    with_mention(text="x" * 513),
    with_mention(type="t" * 129),
    with_mention(id="i" * 513),
    with_mention(span=[-1, 2]),
    with_mention(span=[]),
    with_mention(span={"start": 1, "end": "2"}),
    with_mention(text=None),
    paper(mentions=[["m1"]]),
    paper(revision=" "),
    paper(paper_id="p" * 513),
]


@pytest.mark.parametrize("obj", DECLINED, ids=range(len(DECLINED)))
def test_papers_with_a_reject_are_declined(obj: dict[str, Any]) -> None:
    fast, slow = both(obj)
    assert slow is None or slow.rejects != ()
    assert fast is None


def test_a_blank_type_is_taken_by_both_paths_alike() -> None:
    fast, slow = both(with_mention(type=" "))
    assert slow.rejects == () and fast == slow


@pytest.mark.parametrize("predicate", ["", "  ", None])
def test_a_blank_or_null_predicate_is_taken_by_both_paths_alike(predicate: str | None) -> None:
    fast, slow = both(with_rel(predicate=predicate))
    assert slow.rejects == () and fast == slow
    assert slow.relationships[0].predicate == "related_to"


def test_a_null_type_is_read_as_blank_by_both_paths_and_a_missing_one_refused() -> None:
    fast, slow = both(with_mention(type=None))
    assert slow.rejects == () and fast == slow
    assert slow.mentions[-1].entity_type == ""
    missing = with_mention()
    del missing["mentions"][-1]["type"]
    fast, slow = both(missing)
    assert fast is None
    assert [r.reason for r in slow.rejects] == ["mentions[3].type: required field is missing"]


def test_caps_are_declined_past_them_and_taken_at_them() -> None:
    fast, slow = both(paper(), Limits(max_mentions=2))
    assert fast is None and slow.rejects != ()
    fast, slow = both(paper(), Limits(max_relationships=1))
    assert fast is None and slow.rejects != ()
    at_the_caps = Limits(max_mention_chars=5, max_id_chars=2, max_predicate_chars=12,
                         max_quote_bytes=13, max_mentions=3, max_relationships=2)
    fast, slow = both(paper(), at_the_caps)
    assert slow.rejects == () and fast == slow


def test_lone_surrogates_go_item_by_item_and_hash_as_before() -> None:
    obj = with_rel(evidence={"quote": "a\ud800b"})
    data = json.dumps(obj).encode()
    result = parse_line(RawLine("in.jsonl", 1, data, len(data), data[:1024]),
                        vocabulary=VOCABULARY, limits=Limits())
    assert isinstance(result, CheckedPaper)
    assert result.relationships == ()  # a lone surrogate cannot be stored: the item is rejected
    (reject,) = result.rejects
    assert "lone surrogate" in reject.reason
    canonical = canonical_json(obj).encode("utf-8", errors="surrogatepass")
    assert result.content_hash == hashlib.sha256(b"paper\x1f" + canonical + b"\x1f").hexdigest()


_ODD: list[Any] = [
    None, True, False, 0, 1, 2, -1, 0.5, 1.0, -0.0, 1.5, 10**30, "", " ", "\x1c", "\u3000",
    "x" * 600, "m1", "m2", "uses", "is used by", [], [1], [1, 2], [2, 1], [-1, 3], [1, 2, 3],
    [True, 2], [1.0, 2], {"start": 1, "end": 2}, {"start": 2, "end": 1}, {"start": 1}, {},
    'q"uo\\te\n\x00😀', 1e-05, float("nan"), "q" * 70000, "€" * 17000, "Is_Used-By",
]


def _mutate(rng: random.Random, value: Any) -> Any:
    roll = rng.random()
    if isinstance(value, dict) and value and roll < 0.5:
        key = rng.choice(list(value))
        pick = rng.random()
        if pick < 0.15:
            del value[key]
        elif pick < 0.25:
            value[f"extra{rng.randint(0, 3)}"] = copy.deepcopy(rng.choice(_ODD))
        elif pick < 0.6:
            value[key] = copy.deepcopy(rng.choice(_ODD))
        else:
            value[key] = _mutate(rng, value[key])
        return value
    if isinstance(value, list) and value and roll < 0.5:
        i = rng.randrange(len(value))
        pick = rng.random()
        if pick < 0.2:
            del value[i]
        elif pick < 0.4:
            value.insert(i, copy.deepcopy(value[rng.randrange(len(value))]))
        elif pick < 0.5:
            value[i] = copy.deepcopy(rng.choice(_ODD))
        else:
            value[i] = _mutate(rng, value[i])
        return value
    if roll < 0.1:
        return copy.deepcopy(rng.choice(_ODD))
    return value


def test_randomly_damaged_papers_agree() -> None:
    """Seeded damage to generated papers: the fast path takes exactly the papers without a
    reject, and gives the same result for them."""
    rng = random.Random(20240611)
    base = list(synthetic_papers(30, mentions_per_paper=6, relationships_per_paper=5, seed=1))
    limits = [Limits(), Limits(max_mentions=5, max_relationships=4, max_mention_chars=20,
                               max_quote_bytes=30000, max_id_chars=10, max_predicate_chars=8)]
    taken = declined = 0
    for _ in range(1500):
        obj = copy.deepcopy(rng.choice(base))
        for _ in range(rng.choice([0, 1, 1, 2, 3])):
            obj = _mutate(rng, obj)
        if not isinstance(obj, dict):
            continue
        for limit in limits:
            fast, slow = both(obj, limit)
            if slow is None or slow.rejects:
                assert fast is None
                declined += 1
            else:
                assert fast == slow
                taken += 1
    assert taken > 500 and declined > 500


# -- reading: orjson where it reads and writes as the stdlib does ------------------------------

_JSON_SCALARS = (
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=()))  # any code point, lone surrogates too
)
_JSON = st.recursive(
    _JSON_SCALARS,
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(st.characters(blacklist_categories=()), max_size=4), inner,
                      max_size=4),
    max_leaves=20,
)


def _stdlib(data: bytes) -> tuple[Any, bytes]:
    obj = json.loads(data.decode("utf-8").removeprefix("\ufeff"))
    return obj, _CANONICAL(obj).encode("utf-8", errors="surrogatepass")


@settings(max_examples=400, deadline=None)
@given(obj=st.dictionaries(st.text(max_size=6), _JSON, max_size=5), ascii_only=st.booleans(),
       spaced=st.booleans(), bom=st.booleans())
def test_a_line_orjson_takes_reads_and_hashes_as_the_stdlib_would(
        obj: dict[str, Any], ascii_only: bool, spaced: bool, bom: bool) -> None:
    """The content hash of every paper stored so far came from ``json``: a line read by orjson
    must give the same object and the same canonical bytes, or be left to ``json``."""
    text = json.dumps(obj, ensure_ascii=ascii_only,
                      separators=(", ", ": ") if spaced else (",", ":"))
    data = ("\ufeff" if bom else "").encode() + text.encode("utf-8", errors="surrogatepass")
    fast = _read_fast(data)
    if fast is None:
        return
    expected_obj, expected_bytes = _stdlib(data)
    got_obj, got_bytes, plain = fast
    assert plain and got_bytes == expected_bytes
    assert _CANONICAL(got_obj) == _CANONICAL(expected_obj)  # types too: 1 is not 1.0


@pytest.mark.parametrize("text", [
    '{"n": 18446744073709551616}',  # beyond 64 bits: orjson reads a float
    '{"n": -9223372036854775809}',
    '{"c": 1e-05}', '{"c": 5.083e-05}', '{"c": 1e-7}',  # written otherwise by orjson
    '{"c": NaN}', '{"c": 1e400}',  # read by json only
    '{"q": "a\\ud800b"}',  # a lone surrogate
    '{"d": ' + "[" * 300 + "]" * 300 + "}",  # nested past orjson's writer
    "[1, 2]", '"text"',  # not an object: json's path names what it is
])
def test_lines_orjson_would_read_or_write_otherwise_are_left_to_json(text: str) -> None:
    assert _read_fast(text.encode("utf-8")) is None


def test_the_usual_line_is_read_by_orjson() -> None:
    for obj in synthetic_papers(20, mentions_per_paper=6, relationships_per_paper=5, seed=3):
        data = json.dumps(obj).encode()
        fast = _read_fast(data)
        assert fast is not None and fast[1] == _stdlib(data)[1]
