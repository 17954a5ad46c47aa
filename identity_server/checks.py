"""Limits and checks on what callers send: ids, types, text the store keeps."""

from __future__ import annotations

from identity_server.errors import InvalidArgument

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


def checked_id(value: str, what: str = "id") -> str:
    """An entity, record or context id as given; one longer than any can be is refused without
    echoing it whole (a message that size would not fit in the reply's metadata)."""
    if len(value) > MAX_ID_LENGTH:
        raise InvalidArgument(f"{what} is {len(value)} characters long; the limit is "
                              f"{MAX_ID_LENGTH} ({value[:40]!r}...)")
    return value


def checked_entity_id(value: str) -> str:
    """An entity id a caller named: `checked_id`, and never empty (no entity has that id)."""
    if not value:
        raise InvalidArgument("entity id is empty")
    return checked_id(value)
