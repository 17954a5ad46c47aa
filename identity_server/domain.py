"""The identity model: entities, their names, statuses and match kinds. No I/O, no ORM."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from identity_server.errors import InvalidArgument
from identity_server.normalize import WHITE_SPACE, fold, key_of_folded

OTHER = "other"
PROVISIONAL_PREFIX = "prov_"


class Status(enum.StrEnum):
    CANONICAL = "canonical"
    PROVISIONAL = "provisional"
    MERGED = "merged"


class NameKind(enum.StrEnum):
    """How a display form belongs to an entity. Order matters: it is matched_name's order."""

    NAME = "name"
    ALIAS = "alias"
    SURFACE = "surface"


class MatchKind(enum.StrEnum):
    EXACT = "EXACT"
    CASE = "CASE"
    PUNCTUATION = "PUNCTUATION"
    ALIAS = "ALIAS"
    TYPO = "TYPO"
    AMBIGUOUS = "AMBIGUOUS"
    NEW = "NEW"


class Rule(enum.IntEnum):
    """The rules of SPEC section 2, in the order Resolve tries them."""

    EXACT = 1
    CASE = 2
    PUNCTUATION = 3
    TYPO = 4


class Name:
    """One display form of an entity. `position` orders names of one kind by when recorded.

    The key is computed once here, since every lookup compares keys. A plain class with slots
    rather than a frozen dataclass: start-up builds millions of them, and frozen dataclasses pay
    for every field set. Treat instances as immutable.
    """

    __slots__ = ("display", "key", "kind", "position")

    def __init__(self, display: str, kind: NameKind, position: int) -> None:
        self.display = display
        self.kind = kind
        self.position = position
        self.key = key_of_folded(fold(display))

    @property
    def folded(self) -> str:
        """Computed when asked (only rule 2 asks, of a mention's few same-key candidates):
        keeping it would cost a string per name, a tenth of the index."""
        return fold(self.display)

    def _identity(self) -> tuple[str, NameKind, int]:
        return (self.display, self.kind, self.position)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Name) and self._identity() == other._identity()

    def __hash__(self) -> int:
        return hash(self._identity())

    def __repr__(self) -> str:
        return f"Name({self.display!r}, {self.kind!s}, {self.position})"


_KIND_ORDER = {NameKind.NAME: 0, NameKind.ALIAS: 1, NameKind.SURFACE: 2}
# From this many names on, an entity answers "which of its names is this display form?" from a
# table built on first use (per version of the entity): a much-mentioned entity gathers a
# surface form for every spelling that converged on it, and a scan of thousands of names on each
# repeat mention of it would cost more than the rest of the lookup together.
DISPLAY_TABLE_FROM = 64


@dataclass(frozen=True, slots=True)
class Entity:
    """An entity as the matching index sees it. Merged entities have no names.

    `names` is kept in matched_name order: the name, then aliases, then surface forms, each in
    the order recorded.
    """

    entity_id: str
    entity_type: str
    status: Status
    ordinal: int
    placeholder: bool = False
    redirect_to: str | None = None
    names: tuple[Name, ...] = field(default=())
    # display form -> its names, built on first use when the entity has many names (never
    # copied by dataclasses.replace: a new version of the entity builds its own).
    _by_display: dict[str, tuple[Name, ...]] | None = field(
        default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.names) > 1 or not isinstance(self.names, tuple):
            ordered = tuple(sorted(self.names, key=lambda n: (_KIND_ORDER[n.kind], n.position)))
            object.__setattr__(self, "names", ordered)

    def with_display(self, display: str) -> list[Name]:
        """The names whose display form is `display`, in `names` order (at most one in a
        stored entity: displays are unique per entity)."""
        names = self.names
        if len(names) < DISPLAY_TABLE_FROM:
            return [n for n in names if n.display == display]
        return list(self._display_table().get(display, ()))

    def has_display(self, display: str) -> bool:
        names = self.names
        if len(names) < DISPLAY_TABLE_FROM:
            return any(n.display == display for n in names)
        return display in self._display_table()

    def _display_table(self) -> dict[str, tuple[Name, ...]]:
        table = self._by_display
        if table is None:
            names = self.names
            table = {n.display: (n,) for n in names}
            if len(table) < len(names):  # a display form twice: keep every name, in order
                table = {}
                for n in names:
                    table[n.display] = table.get(n.display, ()) + (n,)
            object.__setattr__(self, "_by_display", table)  # racing builders build the same
        return table

    @property
    def name(self) -> str:
        for n in self.names:
            if n.kind is NameKind.NAME:
                return n.display
        return ""


def is_provisional_id(entity_id: str) -> bool:
    return entity_id.startswith(PROVISIONAL_PREFIX)


def provisional_id(ordinal: int) -> str:
    """Opaque to readers (they read `status`), stable, and recognisably provisional."""
    return f"{PROVISIONAL_PREFIX}{ordinal:08d}"


def compatible(entity: Entity, mention_type: str) -> bool:
    """SPEC: equal types or either is `other`; a placeholder only with exactly its own type."""
    if entity.placeholder:
        return entity.entity_type == mention_type
    return entity.entity_type == mention_type or OTHER in (entity.entity_type, mention_type)


def types_compatible(a: str, b: str) -> bool:
    return a == b or OTHER in (a, b)


@dataclass(frozen=True, slots=True)
class TypeVocabulary:
    """The closed vocabulary of entity types; `strict` refuses unknown mention types."""

    types: frozenset[str]
    strict: bool = False

    @classmethod
    def of(cls, types: tuple[str, ...] | list[str], *, strict: bool = False) -> TypeVocabulary:
        folded = frozenset(_trim(t).casefold() for t in types)
        return cls(types=folded | {OTHER}, strict=strict)

    def for_mention(self, raw: str) -> str:
        """Trimmed and casefolded; empty or unknown reads as `other` unless strict."""
        t = _trim(raw).casefold()
        if t in self.types:
            return t
        if self.strict and t:  # strict refuses unknown types; an empty one still reads as other
            raise InvalidArgument(
                f"unknown entity type {raw!r}; known types: {', '.join(sorted(self.types))}"
            )
        return OTHER

    def for_authority(self, raw: str) -> str:
        """Authority records are always strict; `other` must be written out."""
        t = _trim(raw).casefold()
        if t not in self.types:
            shown = repr(raw) if raw else "empty"
            raise InvalidArgument(
                f"type {shown} is not one of: {', '.join(sorted(self.types))}"
            )
        return t


def _trim(s: str) -> str:
    start, end = 0, len(s)
    while start < end and s[start] in WHITE_SPACE:
        start += 1
    while end > start and s[end - 1] in WHITE_SPACE:
        end -= 1
    return s[start:end]
