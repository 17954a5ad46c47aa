"""The in-memory name index: exact, casefolded, key and typo-neighbourhood lookups.

Typo candidates come from a deletion neighbourhood (the SymSpell idea at distance 1): every
anchor key (the key of an entity's name or alias, 4+ characters) is filed under itself and under
each string made by deleting one of its characters. Two keys within one insertion, deletion,
substitution or adjacent swap share at least one such variant, so a lookup probes len(key) + 1
variants and never scans the names: its cost depends on the key's length, not the entity count.
The variants live in `typo_table.DeletionVariantTable`, packed at start-up (`load`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.typo_table import DeletionVariantTable, deletion_variants

MIN_TYPO_KEY = 4  # SPEC: keys shorter than 4 characters get no typo candidates at all

# The tables map a string to one value or, rarely, to several: a plain str for the common single
# value saves a set per entry, which halves the index's memory and build time.
MultiMap = dict[str, "str | set[str]"]


def _values(table: MultiMap, k: str) -> tuple[str, ...] | set[str]:
    found = table.get(k)
    if found is None:
        return ()
    return (found,) if isinstance(found, str) else found


def _add(table: MultiMap, k: str, value: str) -> None:
    found = table.get(k)
    if found is None:
        table[k] = value
    elif isinstance(found, str):
        if found != value:
            table[k] = {found, value}
    else:
        found.add(value)


def _remove(table: MultiMap, k: str, value: str) -> None:
    found = table.get(k)
    if found is None:
        return
    if isinstance(found, str):
        if found == value:
            del table[k]
        return
    found.discard(value)
    if len(found) == 1:
        table[k] = next(iter(found))


class NameIndex:
    """Every entity and its names, indexed for the four rules. Not thread-safe by itself."""

    def __init__(self) -> None:
        self._entities: dict[str, Entity] = {}
        self._by_display: MultiMap = {}
        self._by_fold: MultiMap = {}
        self._by_key: MultiMap = {}
        self._anchor_ids: MultiMap = {}  # anchor key -> entity ids whose name or alias has it
        self._variants = DeletionVariantTable()  # deletion variant -> anchor keys
        self._max_ordinal = 0
        self._bulk_loading = False  # load() files typo variants once, at the end

    # -- reading -------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._entities)

    def get(self, entity_id: str) -> Entity | None:
        return self._entities.get(entity_id)

    def entities(self) -> Iterator[Entity]:
        return iter(self._entities.values())

    @property
    def max_ordinal(self) -> int:
        return self._max_ordinal

    def live(self, entity_id: str) -> Entity | None:
        """The entity at the end of entity_id's redirect chain (itself when not merged)."""
        entity = self._entities.get(entity_id)
        hops = 0
        while entity is not None and entity.redirect_to is not None and hops < 10_000:
            entity = self._entities.get(entity.redirect_to)
            hops += 1
        return entity

    def with_display(self, display: str) -> Collection[str]:
        return _values(self._by_display, display)

    def with_fold(self, folded: str) -> Collection[str]:
        return _values(self._by_fold, folded)

    def with_key(self, k: str) -> Collection[str]:
        return _values(self._by_key, k)

    def typo_neighbours(self, k: str) -> Iterator[tuple[str, Collection[str]]]:
        """(anchor key, entity ids) for anchor keys sharing a deletion variant with k.

        A superset of the keys one edit away: the caller verifies each with `one_edit_apart`.
        """
        if len(k) < MIN_TYPO_KEY:
            return
        anchor_ids = self._anchor_ids
        for anchor in self._variants.anchors_near(k):
            if anchor != k:
                ids = _values(anchor_ids, anchor)
                if ids:  # an anchor no entity holds any more is a stale packed entry
                    yield anchor, ids

    # -- writing -------------------------------------------------------------------------------

    def put(self, entity: Entity) -> None:
        """Add or replace an entity; only the names that changed are re-indexed."""
        eid = entity.entity_id
        old = self._entities.get(eid)
        self._entities[eid] = entity
        after = entity.names if entity.status is not Status.MERGED else ()
        if old is None:
            self._index_new(eid, after)  # the start-up path: nothing to compare
        else:
            before = old.names if old.status is not Status.MERGED else ()
            self._reindex(eid, before, after)
        self._max_ordinal = max(self._max_ordinal, entity.ordinal)

    def put_many(self, entities: Iterable[Entity]) -> None:
        for entity in entities:
            self.put(entity)

    def load(self, entities: Iterable[Entity]) -> None:
        """Bulk-add entities to an empty index (start-up): the typo table is packed once at the
        end, which is faster and several times smaller than filing anchors one by one."""
        if self._entities:
            raise ValueError("load() fills an empty index; use put() to change one")
        self._bulk_loading = True
        try:
            self.put_many(entities)
        finally:
            self._bulk_loading = False
        self._variants.rebuild(self._anchor_ids.keys())

    def discard(self, entity_id: str) -> None:
        old = self._entities.pop(entity_id, None)
        if old is not None and old.status is not Status.MERGED:
            self._reindex(entity_id, old.names, ())

    def _reindex(self, eid: str, before: tuple[Name, ...], after: tuple[Name, ...]) -> None:
        """Move eid's entries from the names `before` to the names `after`.

        Compared as sets of values per table, so a value that two names share (a name and an
        alias with one key) stays indexed while either remains.
        """
        if before == after:
            return
        for table, attr in ((self._by_display, "display"), (self._by_fold, "folded"),
                            (self._by_key, "key")):
            old = {getattr(n, attr) for n in before}
            new = {getattr(n, attr) for n in after}
            for value in old - new:
                _remove(table, value, eid)
            for value in new - old:
                _add(table, value, eid)
        old_anchors = {n.key for n in before if _is_anchor(n)}
        new_anchors = {n.key for n in after if _is_anchor(n)}
        for k in old_anchors - new_anchors:
            _remove(self._anchor_ids, k, eid)
            if k not in self._anchor_ids:
                self._variants.remove(k)
        for k in new_anchors - old_anchors:
            if k not in self._anchor_ids:
                self._variants.add(k)
            _add(self._anchor_ids, k, eid)

    def _index_new(self, eid: str, names: tuple[Name, ...]) -> None:
        for n in names:
            _add(self._by_display, n.display, eid)
            _add(self._by_fold, n.folded, eid)
            _add(self._by_key, n.key, eid)
            if _is_anchor(n):
                if n.key not in self._anchor_ids and not self._bulk_loading:
                    self._variants.add(n.key)
                _add(self._anchor_ids, n.key, eid)


def _is_anchor(n: Name) -> bool:
    """Typo anchors: names and aliases (never surface forms) with keys of 4+ characters."""
    return n.kind is not NameKind.SURFACE and len(n.key) >= MIN_TYPO_KEY


__all__ = ["MIN_TYPO_KEY", "NameIndex", "deletion_variants"]
