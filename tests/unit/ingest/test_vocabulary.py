"""The predicate vocabulary: labels, synonyms, inverse phrasings, fallback, config files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ingest.vocabulary import (
    VocabularyError,
    default_vocabulary,
    load_vocabulary,
    normalize_phrase,
)


@pytest.mark.parametrize(
    ("raw", "label", "inverted", "known"),
    [
        ("uses", "uses", False, True),
        ("Evaluated_On", "evaluated_on", False, True),
        ("evaluated on", "evaluated_on", False, True),
        ("makes use of", "uses", False, True),
        ("  Makes   Use-Of ", "uses", False, True),
        ("ｕｓｅｓ", "uses", False, True),  # full width: NFKC
        ("ｉｓ\u3000ｕｓｅｄ\u00a0ｂｙ", "uses", True, True),
        ("is used by", "uses", True, True),
        ("outperforms", "improves_on", False, True),
        ("is outperformed by", "improves_on", True, True),
        ("wrote", "authored_by", True, True),
        ("inspired by", "related_to", False, False),
        ("zzz", "related_to", False, False),
    ],
)
def test_default_vocabulary_reads_phrasings(raw: str, label: str, inverted: bool,
                                            known: bool) -> None:
    reading = default_vocabulary().read(raw)
    assert (reading.label, reading.inverted, reading.known) == (label, inverted, known)


def test_every_default_phrase_maps_to_a_label() -> None:
    vocab = default_vocabulary()
    for phrase, label in {**vocab.synonyms, **vocab.inverses}.items():
        assert label in vocab.labels, phrase
    assert "related_to" in vocab.labels


def test_normalize_phrase() -> None:
    assert normalize_phrase(" Part_of ") == "part of"
    assert normalize_phrase("PART-OF") == "part of"


def test_toml_file_extends_defaults(tmp_path: Path) -> None:
    path = tmp_path / "vocab.toml"
    path.write_text('labels = ["inhibits"]\n[synonyms]\n"blocks" = "inhibits"\n'
                    '[inverses]\n"is inhibited by" = "inhibits"\n', encoding="utf-8")
    vocab = load_vocabulary(path)
    assert vocab.read("blocks").label == "inhibits"
    assert vocab.read("is inhibited by").inverted
    assert vocab.read("uses").label == "uses"  # defaults kept


def test_json_file_can_replace_defaults(tmp_path: Path) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(json.dumps({"replace_defaults": True, "labels": ["a_b", "other_rel"],
                                "fallback": "other_rel", "synonyms": {"ab": "a_b"}}))
    vocab = load_vocabulary(path)
    assert vocab.read("ab").label == "a_b"
    assert vocab.read("uses").label == "other_rel"
    assert not vocab.read("uses").known


@pytest.mark.parametrize(
    "content",
    [
        '{"synonyms": {"x": "no_such_label"}}',
        '{"labels": "uses"}',
        '{"colour": 1}',
        '{"replace_defaults": true, "labels": ["a"]}',
        "not json",
    ],
)
def test_bad_vocabulary_files_are_refused(tmp_path: Path, content: str) -> None:
    path = tmp_path / "vocab.json"
    path.write_text(content)
    with pytest.raises(VocabularyError):
        load_vocabulary(path)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ('{"labels": [" "]}', "a label is empty"),
        ('{"synonyms": {"  ": "uses"}}', "synonyms: a phrase is empty"),
        ('{"synonyms": {"relies-on": "uses", "relies  on": "extends"}}',
         "'relies  on' reads as 'relies on', which already maps to 'uses', not 'extends'"),
        (('{"labels": ["inhibits"], "synonyms": {"blocks": "inhibits"}, '
          '"inverses": {"Blocks": "inhibits"}}'),
         "'blocks' is both a synonym of 'inhibits' and an inverse of 'inhibits'"),
        ('{"synonyms": {"evaluated_on": "uses"}}',
         "'evaluated on' is a label itself, so it cannot also read as 'uses'"),
        ('{"inverses": {"uses": "uses"}}',
         "'uses' is a label itself, so it cannot also read as the inverse of 'uses'"),
    ],
)
def test_a_vocabulary_where_a_phrase_reads_two_ways_is_refused_saying_which(
        tmp_path: Path, content: str, says: str) -> None:
    """Before, one reading silently won (a label over a synonym, a synonym over an inverse,
    the last of two spellings that meet)."""
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(VocabularyError) as refused:
        load_vocabulary(path)
    assert says in str(refused.value)


def test_a_files_phrase_wins_over_the_built_in_one_in_the_other_table(tmp_path: Path) -> None:
    """ "relies on" is a built-in synonym of uses; a file that calls it an inverse means it."""
    path = tmp_path / "vocab.toml"
    path.write_text('[inverses]\n"relies on" = "uses"\n[synonyms]\n"is used by" = "uses"\n',
                    encoding="utf-8")
    vocab = load_vocabulary(path)
    assert (vocab.read("Relies on").label, vocab.read("Relies on").inverted) == ("uses", True)
    assert (vocab.read("is used by").label, vocab.read("is used by").inverted) == ("uses", False)

