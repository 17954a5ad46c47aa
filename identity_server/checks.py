"""Limits and checks on what callers send: ids, types, text the store keeps."""

from __future__ import annotations

import unicodedata

from identity_server.errors import InvalidArgument
from identity_server.normalize import is_dropped

MAX_ID_LENGTH = 512  # entity ids and context (paper) ids
MAX_TYPE_LENGTH = 128  # a mention's type as given (kept with the evidence)
MAX_ACTOR_LENGTH = 512
MAX_REASON_LENGTH = 4096


def check_type_length(raw: str) -> None:
    """A type as given is kept (with the evidence), so it is capped: a mention's and a record's."""
    if len(raw) > MAX_TYPE_LENGTH:
        raise InvalidArgument(f"type is {len(raw)} characters long; the limit is "
                              f"{MAX_TYPE_LENGTH}")


def is_unicode(text: str) -> bool:
    """Whether text is Unicode a UTF-8 store can hold: no lone surrogate (which JSON, or an
    in-process caller, can give)."""
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def has_dropped_characters(text: str) -> bool:
    """Whether text has a character `display_form` drops: Cc or Cf that is not White_Space."""
    return not text.isprintable() and any(is_dropped(c) for c in text)


def checked_id(value: str, what: str = "id", meaning: str = "") -> str:
    """An entity, record or context id as given; one longer than any can be is refused without
    echoing it whole (a message that size would not fit in the reply's metadata). An id is an
    identifier, not text: a control or format character (Cc, Cf) in one is a caller's bug that
    would be stored and echoed as is, and a lone surrogate cannot be stored at all, so both are
    refused, naming the character and where it is (`meaning` says what such an id names)."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{what} is {len(value)} characters long; the limit is "
                              f"{MAX_ID_LENGTH} ({value[:40]!r}...)")
    if value.isprintable():  # no Cc, Cf or Cs: the common case, without a pass per character
        return value
    for i, c in enumerate(value):
        category = unicodedata.category(c)
        if category == "Cs":
            raise InvalidArgument(f"{what} contains a lone surrogate (U+{ord(c):04X} at "
                                  f"position {i}): not valid Unicode")
        if category in ("Cc", "Cf"):
            kind = "control" if category == "Cc" else "format"
            article = "an" if what[:1] in "aeiou" else "a"
            also = f" ({meaning})" if meaning else ""
            raise InvalidArgument(f"{what}: {kind} character U+{ord(c):04X} at position {i}; "
                                  f"{article} {what} is an identifier{also}")
    return value


def checked_entity_id(value: str) -> str:
    """An entity id a caller named: `checked_id`, and never empty (no entity has that id)."""
    if not value:
        raise InvalidArgument("entity id is empty")
    return checked_id(value, "entity id")
