"""Pydantic models of one input line (SPEC section 6), strict: wrong JSON types are rejected.

A confidence given as the string "0.9" or mentions given as an object are errors of the producer,
and coercing them would hide the bug, so every model is strict; the one reading is an integer id
or revision, taken as its decimal text (`integer_as_text`). Caps stay configurable: validate
inside ``with limits_in_force(limits):`` (a context variable, cheaper than pydantic's validation
context on hot paths).
"""

from __future__ import annotations

import logging
import math
import unicodedata
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Annotated, Any, NamedTuple, Self

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Limits:
    """Size caps on input (all configurable through settings)."""

    max_line_bytes: int = 16 * 1024 * 1024
    max_mention_chars: int = 512
    max_quote_bytes: int = 64 * 1024
    max_id_chars: int = 512
    max_predicate_chars: int = 256
    max_mentions: int = 5000
    max_relationships: int = 20000


DEFAULT_LIMITS = Limits()
_LIMITS: ContextVar[Limits] = ContextVar("ingest_limits", default=DEFAULT_LIMITS)


@contextmanager
def limits_in_force(limits: Limits) -> Iterator[None]:
    """Makes ``limits`` the caps the models check, for the block."""
    token = _LIMITS.set(limits)
    try:
        yield
    finally:
        _LIMITS.reset(token)


def _limits() -> Limits:
    return _LIMITS.get()


_STRICT = ConfigDict(strict=True, extra="ignore", frozen=True)


class LongInteger(float):
    """An integer literal of more digits than Python turns into an int (4,300 by default,
    `sys.get_int_max_str_digits`, a guard against quadratic conversion). It is valid JSON, so
    it must cost only the item holding it: read as an infinity (no field takes one) that keeps
    its text, so a check can say what was written and hashes see the digits."""

    text: str

    def __new__(cls, text: str) -> Self:
        self = super().__new__(cls, "-inf" if text.startswith("-") else "inf")
        self.text = text
        return self

    @property
    def digits(self) -> int:
        return len(self.text) - self.text.startswith("-")


SpanList = Annotated[list[int], Field(min_length=2, max_length=2)]


class SpanObject(BaseModel):
    """A span written as an object: ``{"start": 10, "end": 14}``."""

    model_config = _STRICT
    start: int
    end: int


class SpanError(ValueError):
    """A span whose end is before its start."""


class Span(NamedTuple):
    """Character offsets ``[start, end)`` in the paper's text (both checked non-negative).

    A named tuple (not a dataclass): one is built per span of every paper, so it must be cheap.
    """

    start: int
    end: int


MAX_OFFSET = 2**63 - 1  # spans are stored as BIGINT


def to_span(value: list[int] | SpanObject | None) -> Span | None:
    """Accepts ``[start, end]`` or ``{"start", "end"}``; checks sign, size and order."""
    if value is None:
        return None
    start, end = (value.start, value.end) if isinstance(value, SpanObject) else value
    if start < 0 or end < 0:
        raise SpanError(f"span offsets must be non-negative, got [{start}, {end}]")
    if start > MAX_OFFSET or end > MAX_OFFSET:
        raise SpanError(f"span offsets must be at most {MAX_OFFSET}, got [{start}, {end}]")
    if end < start:
        raise SpanError(f"span end {end} is before its start {start}")
    return Span(start, end)


def first_surrogate(text: str) -> str | None:
    """The first lone surrogate in text, if any: JSON can spell one (`"\\ud800"`), but no UTF-8
    store can hold it."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return text[e.start]
    return None


def check_unicode(value: str) -> str:
    surrogate = first_surrogate(value)
    if surrogate is not None:
        raise ValueError(
            f"contains a lone surrogate (\\u{ord(surrogate):04x}), which is not valid Unicode"
        )
    return value


def integer_as_text(value: Any) -> Any:
    """A JSON integer given for an id or a revision, as its decimal text: extractors often
    number their mentions (`"id": 3`, `"subject": 3`), and an integer names one thing only, so
    reading it as "3" hides nothing. Anything else is returned as it is."""
    return str(value) if type(value) is int else value


def _id_text(value: Any) -> Any:
    """integer_as_text, and a clear error for what is neither text nor an integer (booleans and
    fractions included). None passes, for an optional field's other branch to judge."""
    value = integer_as_text(value)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, LongInteger):
        return value.text  # an integer too: as its text, which the length cap then judges
    if isinstance(value, bool):
        got = "a boolean"
    elif isinstance(value, float):
        got = f"the fraction {value!r}"
    elif isinstance(value, dict):
        got = "an object"
    else:
        got = "an array" if isinstance(value, list) else type(value).__name__
    raise ValueError(f"must be a string or an integer (got {got})")


IdText = Annotated[str, BeforeValidator(_id_text)]


def _blank_if_null(value: Any) -> Any:
    """null reads as blank: extractors write it for a mention they could not label or a link
    they could not name, and losing the item (and the relationships on it) would cost more
    than the wildcard (`other`, `related_to`) does."""
    return "" if value is None else value


# A field that must be present, where null reads as blank.
BlankIfNull = Annotated[str, BeforeValidator(_blank_if_null)]


def _check_id(value: str) -> str:
    check_unicode(value)
    if not value.strip():
        raise ValueError("must not be empty")
    cap = _limits().max_id_chars
    if len(value) > cap:
        raise ValueError(f"is {len(value)} characters long, more than the cap of {cap}")
    return value


class MentionIn(BaseModel):
    """One mention: ``{"id", "text", "type", "span"?}``."""

    model_config = _STRICT
    id: IdText
    text: str
    type: BlankIfNull
    span: SpanList | SpanObject | None = None

    @field_validator("id")
    @classmethod
    def _id(cls, value: str) -> str:
        return _check_id(value)

    @field_validator("text")
    @classmethod
    def _text(cls, value: str) -> str:
        check_unicode(value)
        if not value.strip():
            raise ValueError("text is empty")
        cap = _limits().max_mention_chars
        if len(value) > cap:
            raise ValueError(f"text is {len(value)} characters long, more than the cap of {cap}")
        return value

    @field_validator("type")
    @classmethod
    def _type(cls, value: str) -> str:
        """A blank type is kept: the identity server reads it as the wildcard `other` (SPEC
        section 2), so the mention is not lost."""
        check_unicode(value)
        if len(value) > 128:
            raise ValueError(f"type is {len(value)} characters long, more than the cap of 128")
        return value


class EvidenceIn(BaseModel):
    """Where a relationship was stated: ``{"span"?, "quote"?}``."""

    model_config = _STRICT
    span: SpanList | SpanObject | None = None
    quote: str | None = None

    @field_validator("quote")
    @classmethod
    def _quote(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_unicode(value)
        cap = _limits().max_quote_bytes
        size = len(value.encode("utf-8", errors="surrogatepass"))
        if size > cap:
            raise ValueError(f"quote is {size} bytes long, more than the cap of {cap}")
        return value


class RelationshipIn(BaseModel):
    """One relationship between two mention ids of the same paper."""

    model_config = _STRICT
    subject: IdText
    predicate: BlankIfNull
    object: IdText
    confidence: float | None = None
    evidence: EvidenceIn | None = None

    @field_validator("subject", "object")
    @classmethod
    def _ids(cls, value: str) -> str:
        return _check_id(value)

    @field_validator("predicate")
    @classmethod
    def _predicate(cls, value: str) -> str:
        """A blank predicate is kept: it is unknown to the vocabulary, so it reads as the weak
        fallback (`related_to`, SPEC section 6) with its raw text, and the edge the extractor
        found between the two mentions is not lost."""
        check_unicode(value)
        cap = _limits().max_predicate_chars
        if len(value) > cap:
            raise ValueError(f"predicate is {len(value)} characters long, more than cap {cap}")
        return value

    @field_validator("confidence", mode="before")
    @classmethod
    def _confidence_in_range(cls, value: Any) -> Any:
        """An integer beyond any float (1 followed by 400 zeros) is out of range, not 'not a
        number' as the float check would say."""
        if type(value) is int and not 0 <= value <= 1:
            shown = value if abs(value) < 10**12 else f"a {len(str(abs(value)))}-digit number"
            raise ValueError(f"confidence must be between 0 and 1, got {shown}")
        if isinstance(value, LongInteger):  # pydantic reports ValueError, not TypeError
            raise ValueError(  # noqa: TRY004
                f"confidence must be between 0 and 1, got a {value.digits}-digit number")
        return value

    @field_validator("confidence")
    @classmethod
    def _confidence(cls, value: float | None) -> float | None:
        if value is None:
            return None
        if not math.isfinite(value):
            raise ValueError(f"confidence must be a finite number, got {value}")
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"confidence must be between 0 and 1, got {value}")
        return float(value)


class PaperEnvelope(BaseModel):
    """The line's outer shape; items are validated one by one so one bad item costs only itself."""

    model_config = _STRICT
    paper_id: IdText
    revision: IdText | None = None
    mentions: list[Any]
    relationships: list[Any]

    @field_validator("paper_id", "revision")
    @classmethod
    def _unicode(cls, value: str | None) -> str | None:
        return None if value is None else check_unicode(value)

    @field_validator("paper_id")
    @classmethod
    def _paper_id(cls, value: str) -> str:
        value = _check_id(value)
        if not value.isprintable():  # the identity server refuses it as a context id
            for i, c in enumerate(value):
                if unicodedata.category(c) in ("Cc", "Cf"):
                    raise ValueError(f"has control character U+{ord(c):04X} at position {i} "
                                     "(it is the identity server's context id, which takes none)")
        return value

    @field_validator("revision")
    @classmethod
    def _revision(cls, value: str | None) -> str | None:
        return None if value is None else _check_id(value)
