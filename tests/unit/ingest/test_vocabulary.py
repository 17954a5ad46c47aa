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
