"""The closed predicate vocabulary: raw predicate text -> one label (and maybe a swap).

Extraction pipelines phrase the same relation many ways ("uses", "makes use of", "is used by").
A graph is only queryable if those land on one label, so every predicate is read into a closed set
of labels: a label itself, a synonym of it, or an inverse phrasing (subject and object swapped).
Anything else becomes the weak fallback label (``related_to``) and the raw text is kept by the
caller, so nothing the extractor said is lost.

The vocabulary is configurable from a JSON or TOML file::

    labels = ["uses", "trains"]              # added to the defaults (or replacing them, below)
    replace_defaults = false                 # true: start from an empty vocabulary
    fallback = "related_to"
    [synonyms]                               # phrase -> label
    "relies on" = "uses"
    [inverses]                               # phrase -> label, subject and object swapped
    "is relied on by" = "uses"
"""

from __future__ import annotations

import json
import logging
import re
import tomllib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

FALLBACK_LABEL = "related_to"

DEFAULT_LABELS: tuple[str, ...] = (
    "uses",
    "evaluated_on",
    "trained_on",
    "improves_on",
    "compared_with",
    "extends",
    "introduces",
    "part_of",
    "causes",
    "treats",
    "measured_by",
    "applied_to",
    "authored_by",
    "affiliated_with",
    "funded_by",
    "located_in",
    "related_to",
)

DEFAULT_SYNONYMS: dict[str, str] = {
    "use": "uses",
    "used": "uses",
    "makes use of": "uses",
    "make use of": "uses",
    "utilizes": "uses",
    "utilises": "uses",
    "employs": "uses",
    "relies on": "uses",
    "based on": "uses",
    "builds on": "extends",
    "built on": "extends",
    "extension of": "extends",
    "evaluated on": "evaluated_on",
    "tested on": "evaluated_on",
    "benchmarked on": "evaluated_on",
    "assessed on": "evaluated_on",
    "evaluates on": "evaluated_on",
    "trained on": "trained_on",
    "pretrained on": "trained_on",
    "pre-trained on": "trained_on",
    "learned from": "trained_on",
    "outperforms": "improves_on",
    "improves upon": "improves_on",
    "improves over": "improves_on",
    "beats": "improves_on",
    "surpasses": "improves_on",
    "compared to": "compared_with",
    "compares with": "compared_with",
    "versus": "compared_with",
    "proposes": "introduces",
    "presents": "introduces",
    "component of": "part_of",
    "subset of": "part_of",
    "belongs to": "part_of",
    "leads to": "causes",
    "results in": "causes",
    "induces": "causes",
    "cures": "treats",
    "is a treatment for": "treats",
    "alleviates": "treats",
    "measured with": "measured_by",
    "evaluated with": "measured_by",
    "scored by": "measured_by",
    "applied on": "applied_to",
    "used for": "applied_to",
    "addresses": "applied_to",
    "solves": "applied_to",
    "written by": "authored_by",
    "works at": "affiliated_with",
    "member of": "affiliated_with",
    "employed by": "affiliated_with",
    "affiliated to": "affiliated_with",
    "supported by": "funded_by",
    "sponsored by": "funded_by",
    "based in": "located_in",
    "situated in": "located_in",
    "related": "related_to",
    "associated with": "related_to",
}

DEFAULT_INVERSES: dict[str, str] = {
    "is used by": "uses",
    "used by": "uses",
    "is employed by": "uses",
    "is utilized by": "uses",
    "is extended by": "extends",
    "is evaluation set for": "evaluated_on",
    "is outperformed by": "improves_on",
    "outperformed by": "improves_on",
    "is improved on by": "improves_on",
    "introduced by": "introduces",
    "is introduced in": "introduces",
    "proposed by": "introduces",
    "has part": "part_of",
    "contains": "part_of",
    "includes": "part_of",
    "caused by": "causes",
    "is caused by": "causes",
    "treated by": "treats",
    "is treated by": "treats",
    "treated with": "treats",
    "measures": "measured_by",
    "wrote": "authored_by",
    "authored": "authored_by",
    "author of": "authored_by",
    "is author of": "authored_by",
    "has member": "affiliated_with",
    "funds": "funded_by",
    "funded": "funded_by",
    "sponsors": "funded_by",
    "hosts": "located_in",
    "location of": "located_in",
}

_MAX_CACHED_READINGS = 10_000
_SEPARATORS = re.compile(r"[\s_\-]+")


def normalize_phrase(text: str) -> str:
    """Folds compatibility forms (NFKC: full-width "ｕｓｅｓ" is "uses"), case, underscores,
    hyphens and spacing, so "Evaluated_On" and "evaluated on" meet."""
    return _SEPARATORS.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


@dataclass(frozen=True, slots=True)
class PredicateReading:
    """How one raw predicate was read."""

    label: str
    inverted: bool
    known: bool


class VocabularyError(ValueError):
    """The vocabulary configuration is inconsistent (e.g. a synonym of an unknown label)."""


@dataclass(frozen=True)
class Vocabulary:
    """A closed set of labels with synonym and inverse tables (keys already normalised)."""

    labels: frozenset[str]
    synonyms: Mapping[str, str] = field(default_factory=dict)
    inverses: Mapping[str, str] = field(default_factory=dict)
    fallback: str = FALLBACK_LABEL
    # Readings of raw predicates seen so far (a batch repeats a few phrasings many times).
    _readings: dict[str, PredicateReading] = field(
        default_factory=dict, init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        """Every phrase reads one way: a vocabulary where one would read two ways (or as
        nothing) is refused, saying which, instead of one reading silently winning."""
        if "" in self.labels:
            raise VocabularyError("a label is empty")
        if self.fallback not in self.labels:
            raise VocabularyError(f"fallback label {self.fallback!r} is not among the labels")
        for table_name, table in (("synonyms", self.synonyms), ("inverses", self.inverses)):
            for phrase, label in table.items():
                if not phrase:
                    raise VocabularyError(f"{table_name}: a phrase is empty")
                if label not in self.labels:
                    raise VocabularyError(
                        f"{table_name}: {phrase!r} maps to {label!r}, which is not a label"
                    )
                as_label = phrase.replace(" ", "_")
                if as_label in self.labels and (label != as_label or table_name == "inverses"):
                    raise VocabularyError(
                        f"{table_name}: {phrase!r} is a label itself, so it cannot also read "
                        f"as {'the inverse of ' if table_name == 'inverses' else ''}{label!r}")
        for phrase in self.synonyms.keys() & self.inverses.keys():
            raise VocabularyError(
                f"{phrase!r} is both a synonym of {self.synonyms[phrase]!r} and an inverse of "
                f"{self.inverses[phrase]!r}")

    def read(self, raw: str) -> PredicateReading:
        """Reads a raw predicate; unknown text becomes the fallback (the caller keeps the raw)."""
        reading = self._readings.get(raw)
        if reading is None:
            reading = self._read(raw)
            if len(self._readings) < _MAX_CACHED_READINGS:
                self._readings[raw] = reading
        return reading

    def _read(self, raw: str) -> PredicateReading:
        phrase = normalize_phrase(raw)
        as_label = phrase.replace(" ", "_")
        if as_label in self.labels:
            return PredicateReading(as_label, inverted=False, known=True)
        if phrase in self.synonyms:
            return PredicateReading(self.synonyms[phrase], inverted=False, known=True)
        if phrase in self.inverses:
            return PredicateReading(self.inverses[phrase], inverted=True, known=True)
        return PredicateReading(self.fallback, inverted=False, known=False)

    @classmethod
    def build(
        cls,
        labels: tuple[str, ...] | list[str] | frozenset[str],
        synonyms: Mapping[str, str] | None = None,
        inverses: Mapping[str, str] | None = None,
        fallback: str = FALLBACK_LABEL,
    ) -> Vocabulary:
        """Builds a vocabulary, normalising labels and phrases."""
        norm_labels = frozenset(normalize_phrase(label).replace(" ", "_") for label in labels)

        def norm_table(table: Mapping[str, str] | None) -> dict[str, str]:
            out: dict[str, str] = {}
            for phrase, label in (table or {}).items():
                key, value = normalize_phrase(phrase), normalize_phrase(label).replace(" ", "_")
                if out.get(key, value) != value:  # "relies-on" and "relies on" meet
                    raise VocabularyError(
                        f"{phrase!r} reads as {key!r}, which already maps to {out[key]!r}, "
                        f"not {value!r}")
                out[key] = value
            return out

        return cls(
            labels=norm_labels,
            synonyms=norm_table(synonyms),
            inverses=norm_table(inverses),
            fallback=normalize_phrase(fallback).replace(" ", "_"),
        )


def default_vocabulary() -> Vocabulary:
    """The default vocabulary, fit for scientific papers."""
    return Vocabulary.build(DEFAULT_LABELS, DEFAULT_SYNONYMS, DEFAULT_INVERSES)


def _string_table(data: dict[str, Any], key: str, path: Path) -> dict[str, str]:
    table = data.get(key, {})
    if not isinstance(table, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in table.items()
    ):
        raise VocabularyError(f"{path}: {key!r} must be a table of phrase -> label strings")
    return table


def load_vocabulary(path: Path) -> Vocabulary:
    """Reads a vocabulary file (.toml or .json); by default it extends the built-in vocabulary."""
    try:
        text = path.read_text(encoding="utf-8")
        data: Any = tomllib.loads(text) if path.suffix == ".toml" else json.loads(text)
    except (OSError, ValueError) as e:
        raise VocabularyError(f"cannot read vocabulary file {path}: {e}") from e
    if not isinstance(data, dict):
        raise VocabularyError(f"{path}: the top level must be a table/object")
    unknown = set(data) - {"labels", "synonyms", "inverses", "fallback", "replace_defaults"}
    if unknown:
        raise VocabularyError(f"{path}: unknown keys {sorted(unknown)}")
    labels = data.get("labels", [])
    if not isinstance(labels, list) or not all(isinstance(x, str) for x in labels):
        raise VocabularyError(f"{path}: 'labels' must be a list of strings")
    synonyms = _string_table(data, "synonyms", path)
    inverses = _string_table(data, "inverses", path)
    fallback = data.get("fallback", FALLBACK_LABEL)
    if not isinstance(fallback, str):
        raise VocabularyError(f"{path}: 'fallback' must be a string")
    replace = data.get("replace_defaults", False)
    if not isinstance(replace, bool):
        raise VocabularyError(f"{path}: 'replace_defaults' must be true or false")
    if replace:
        return Vocabulary.build(labels, synonyms, inverses, fallback)
    # The file's own phrases win over the built-in ones, in either table.
    own = {normalize_phrase(p) for p in (*synonyms, *inverses)}
    return Vocabulary.build(
        [*DEFAULT_LABELS, *labels],
        {**_without(DEFAULT_SYNONYMS, own), **synonyms},
        {**_without(DEFAULT_INVERSES, own), **inverses},
        fallback,
    )


def _without(table: Mapping[str, str], phrases: set[str]) -> dict[str, str]:
    return {p: label for p, label in table.items() if normalize_phrase(p) not in phrases}
