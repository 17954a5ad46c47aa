"""The identity model: entities, their names, statuses and match kinds. No I/O, no ORM."""

from __future__ import annotations

import dataclasses
import enum
import itertools
import threading
from collections.abc import Collection, Iterator, Sequence
from dataclasses import InitVar, dataclass, field
from typing import Any, NamedTuple, overload

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


RETIRED = "retired"  # a stored name's kind once the authority stopped listing it


@dataclass(frozen=True, slots=True)
class NameRow:
    """One stored name of an entity: its kind (a NameKind value or RETIRED), its position among
    the names of that kind, and where it came from."""

    display: str
    kind: str
    position: int
    source: str


class Mention(NamedTuple):
    """A mention checked and normalised: its display form, its type (of the vocabulary), the
    type as given, and the display form's key (worked out once: every look and write needs it)."""

    display: str
    entity_type: str
    raw_type: str
    key: str


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
# From this many names on, an entity answers "which of its names is this display form?" from
# tables built on first use: a much-mentioned entity gathers a surface form for every spelling
# that converged on it, and a scan of thousands of names on each repeat mention of it would cost
# more than the rest of the lookup together.
DISPLAY_TABLE_FROM = 64


class _NameTables:
    """Lookups over a much-mentioned entity's names, shared by its successive versions.

    A version that takes one more surface form (`Entity.with_name`) adds it to these tables in
    place and shares them, so a new spelling costs the same at 100 spellings as at 20,000 (a copy
    per version made it cost in proportion). A surface form's position is above every earlier
    one's, so each version sees what it holds by position: the tables' entries that are not
    surface forms, or whose position is at most the version's last (`Entity._top`).
    `top` is the newest version's: only that version builds a missing table into them or adds to
    them (under `lock`, so a table a reader built from an older version is never kept); another
    version taking a name starts tables of its own.
    """

    __slots__ = ("by_display", "by_folded", "lock", "top")

    def __init__(self, top: int) -> None:
        self.by_display: dict[str, tuple[Name, ...]] | None = None  # display form -> names
        self.by_folded: dict[str, list[Name]] | None = None  # casefolded form -> names, in order
        self.lock = threading.Lock()
        self.top = top


class _Extras:
    """What one version of an Entity keeps beyond its fields: its name tables, its name keys
    and the names it grew from. Few versions ever need any (a much-mentioned entity, a version
    made by `with_name`), so they share one slot, set on first need: at millions of entities,
    two empty slots each would be a noticeable share of the index."""

    __slots__ = ("grown_from", "keys", "tables")

    def __init__(self) -> None:
        # Tables over the names when there are many (DISPLAY_TABLE_FROM), shared along versions
        # made by `with_name`; a version made by dataclasses.replace builds its own.
        self.tables: _NameTables | None = None
        self.keys: frozenset[str] | None = None
        # The names of the version `with_name` made this one from (`names` is those plus one),
        # so the index re-files one name without comparing thousands; let go by `grew_from`.
        self.grown_from: tuple[Name, ...] | None = None


class _Visible(Sequence["Name"]):
    """The part of a shared casefolded-form list that one version of the entity holds: a
    prefix, since later versions' surface forms come last (no copy of thousands of names)."""

    __slots__ = ("_end", "_names")

    def __init__(self, names: list[Name], end: int) -> None:
        self._names = names
        self._end = end

    def __len__(self) -> int:
        return self._end

    @overload
    def __getitem__(self, i: int) -> Name: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Name]: ...
    def __getitem__(self, i: int | slice) -> Name | Sequence[Name]:
        if isinstance(i, slice):
            return self._names[: self._end][i]
        if not -self._end <= i < self._end:
            raise IndexError(i)
        return self._names[i if i >= 0 else self._end + i]

    def __iter__(self) -> Iterator[Name]:
        return itertools.islice(self._names, self._end)


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
    _extras: _Extras | None = field(default=None, init=False, repr=False, compare=False)
    ordered: InitVar[bool] = False  # `names` is in matched_name order already: no sort

    def __post_init__(self, ordered: bool) -> None:
        if not ordered and (len(self.names) > 1 or not isinstance(self.names, tuple)):
            in_order = tuple(sorted(self.names, key=_name_order))
            object.__setattr__(self, "names", in_order)

    @staticmethod
    def loaded(entity_id: str, entity_type: str, status: Status, ordinal: int,
               placeholder: bool, redirect_to: str | None, names: tuple[Name, ...]) -> Entity:
        """`Entity(...)` for start-up, which builds a million of them: the same entity, its
        fields set through the slots' own setters, about twice as fast as the frozen
        dataclass's `__init__` (names in any order, sorted as there)."""
        if len(names) > 1:
            names = tuple(sorted(names, key=_name_order))
        entity = _new_entity(Entity)
        _set_id(entity, entity_id)
        _set_type(entity, entity_type)
        _set_status(entity, status)
        _set_ordinal(entity, ordinal)
        _set_placeholder(entity, placeholder)
        _set_redirect(entity, redirect_to)
        _set_names(entity, names)
        _set_extras(entity, None)
        return entity

    def with_name(self, name: Name) -> Entity:
        """This entity with one more name. A surface form recorded after the others goes last
        as it is, and shares this version's tables (adding itself to them): a much-mentioned
        entity (thousands of spellings) takes a new one without a pass over its names."""
        names = self.names
        top = self._top()
        if name.kind is not NameKind.SURFACE or name.position <= top:
            return dataclasses.replace(self, names=names + (name,))
        updated = Entity(self.entity_id, self.entity_type, self.status, self.ordinal,
                         self.placeholder, self.redirect_to, names + (name,), ordered=True)
        extras = _Extras()
        extras.grown_from = names
        object.__setattr__(updated, "_extras", extras)
        mine = self._extras
        if mine is None:
            return updated
        keys = mine.keys
        if keys is not None:
            extras.keys = keys if name.key in keys else keys | {name.key}
        tables = mine.tables
        if tables is not None:
            with tables.lock:
                if tables.top == top:  # this is the newest version: the tables go on with it
                    by_display = tables.by_display
                    if by_display is not None:
                        by_display[name.display] = by_display.get(name.display, ()) + (name,)
                    by_folded = tables.by_folded
                    if by_folded is not None:
                        by_folded.setdefault(name.folded, []).append(name)
                    tables.top = name.position
                    extras.tables = tables
        return updated

    def grew_from(self, names: tuple[Name, ...]) -> bool:
        """Whether this version is `names` plus one surface form, made by `with_name` (known
        without comparing the names). Asked once, by the index as it files this version."""
        extras = self._extras
        if extras is None or extras.grown_from is None:
            return False
        grown, extras.grown_from = extras.grown_from, None  # not kept: the index holds each version
        if extras.keys is None and extras.tables is None:
            object.__setattr__(self, "_extras", None)  # nothing else in it: free the slot's object
        return grown is names

    def _top(self) -> int:
        """The position of its last surface form (-1: none): what of the shared tables it sees."""
        names = self.names
        return names[-1].position if names and names[-1].kind is NameKind.SURFACE else -1

    def next_position(self) -> int:
        """One past the highest position of its names. Each kind's names are in position order
        and surface forms come last, so that is among the name and aliases (few) and the last
        surface form: no pass over thousands of surface forms."""
        names = self.names
        start = self.surface_start()
        tops = [n.position for n in names[:start]]
        if start < len(names):
            tops.append(names[-1].position)
        return max(tops, default=0) + 1

    def surface_start(self) -> int:
        """Where the surface forms begin in `names` (they come last, after the few name and
        aliases): its surface forms are `names[surface_start():]`."""
        for i, n in enumerate(self.names):
            if n.kind is NameKind.SURFACE:
                return i
        return len(self.names)

    def name_keys(self) -> Collection[str]:
        """The keys of its names, each once."""
        names = self.names
        if len(names) < DISPLAY_TABLE_FROM:
            return {n.key for n in names}
        extras = self._own_extras()
        keys = extras.keys
        if keys is None:
            keys = frozenset(n.key for n in names)
            extras.keys = keys
        return keys

    def with_display(self, display: str) -> list[Name]:
        """The names whose display form is `display`, in `names` order (at most one in a
        stored entity: displays are unique per entity)."""
        names = self.names
        if len(names) < DISPLAY_TABLE_FROM:
            return [n for n in names if n.display == display]
        found = self._display_table().get(display, ())
        top = self._top()
        return [n for n in found if n.kind is not NameKind.SURFACE or n.position <= top]

    def has_display(self, display: str) -> bool:
        return bool(self.with_display(display))

    def with_folded(self, folded: str) -> Sequence[Name]:
        """The names whose casefolded form is `folded` (rule 2), in `names` order."""
        names = self.names
        if len(names) < DISPLAY_TABLE_FROM:
            return [n for n in names if n.folded == folded]
        tables = self._name_tables()
        table = tables.by_folded
        if table is None:
            table = {}
            for n in names:
                table.setdefault(n.folded, []).append(n)
            self._keep(tables, "by_folded", table)
        found = table.get(folded)
        if not found:
            return ()
        # Those of later versions come last, by position: this version's are a prefix.
        top = self._top()
        end = len(found)
        while end and found[end - 1].kind is NameKind.SURFACE and found[end - 1].position > top:
            end -= 1
        return _Visible(found, end)

    def _display_table(self) -> dict[str, tuple[Name, ...]]:
        tables = self._name_tables()
        table = tables.by_display
        if table is None:
            names = self.names
            table = {n.display: (n,) for n in names}
            if len(table) < len(names):  # a display form twice: keep every name, in order
                table = {}
                for n in names:
                    table[n.display] = table.get(n.display, ()) + (n,)
            self._keep(tables, "by_display", table)
        return table

    def _keep(self, tables: _NameTables, which: str, table: dict[str, Any]) -> None:
        """Keep a table this version built, if it is still the newest version to share them
        (one built from an older version's names would lack a newer one's)."""
        with tables.lock:
            if tables.top == self._top() and getattr(tables, which) is None:
                setattr(tables, which, table)

    def _name_tables(self) -> _NameTables:
        extras = self._own_extras()
        tables = extras.tables
        if tables is None:
            tables = _NameTables(self._top())
            extras.tables = tables  # a racing one's is as good
        return tables

    def _own_extras(self) -> _Extras:
        """This version's extras, made on first need (two threads racing may each make one and
        one set is kept: what it misses is a cache, made again when next asked)."""
        extras = self._extras
        if extras is None:
            extras = _Extras()
            object.__setattr__(self, "_extras", extras)
        return extras

    @property
    def name(self) -> str:
        for n in self.names:
            if n.kind is NameKind.NAME:
                return n.display
        return ""


def _name_order(n: Name) -> tuple[int, int]:
    return (_KIND_ORDER[n.kind], n.position)


_new_entity = object.__new__
# The setters of Entity's slots, for `Entity.loaded` (which sets every field: see the test).
(_set_id, _set_type, _set_status, _set_ordinal, _set_placeholder, _set_redirect, _set_names,
 _set_extras) = (
    getattr(Entity, f.name).__set__ for f in dataclasses.fields(Entity))


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


_WHITE_SPACE_CHARS = "".join(sorted(WHITE_SPACE))


def _trim(s: str) -> str:
    """s without leading or trailing White_Space (str.strip() alone also strips U+001C..U+001F)."""
    return s.strip(_WHITE_SPACE_CHARS)
