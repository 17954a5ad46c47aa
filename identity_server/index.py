"""The in-memory name index: exact, casefolded, key and typo-neighbourhood lookups.

Typo candidates come from a deletion neighbourhood (the SymSpell idea at distance 1): every
anchor key (the key of an entity's name or alias, 4+ characters) is filed under itself and under
each string made by deleting one of its characters. Two keys within one insertion, deletion,
substitution or adjacent swap share at least one such variant, so a lookup probes len(key) + 1
variants and never scans the names: its cost depends on the key's length, not the entity count.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from identity_server.domain import Entity, NameKind, Status
from identity_server.normalize import key as key_of

MIN_TYPO_KEY = 4  # SPEC: keys shorter than 4 characters get no typo candidates at all


def deletion_variants(k: str) -> set[str]:
    """The key itself and every string one deletion away from it."""
    return {k} | {k[:i] + k[i + 1 :] for i in range(len(k))}


class NameIndex:
    """Every live entity and its names, indexed for the four rules. Not thread-safe by itself."""

    def __init__(self) -> None:
        self._entities: dict[str, Entity] = {}
        self._by_display: dict[str, set[str]] = {}
        self._by_fold: dict[str, set[str]] = {}
        self._by_key: dict[str, set[str]] = {}
        self._anchor_ids: dict[str, set[str]] = {}
        self._variants: dict[str, set[str]] = {}
        self._max_ordinal = 0

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
        seen = 0
        while entity is not None and entity.redirect_to is not None and seen < 10_000:
            entity = self._entities.get(entity.redirect_to)
            seen += 1
        return entity

    def with_display(self, display: str) -> set[str]:
        return self._by_display.get(display, _EMPTY)

    def with_fold(self, folded: str) -> set[str]:
        return self._by_fold.get(folded, _EMPTY)

    def with_key(self, k: str) -> set[str]:
        return self._by_key.get(k, _EMPTY)

    def typo_neighbours(self, k: str) -> Iterator[tuple[str, set[str]]]:
        """(anchor key, entity ids) for anchor keys sharing a deletion variant with k.

        A superset of the keys one edit away: the caller verifies each with `one_edit_apart`.
        """
        if len(k) < MIN_TYPO_KEY:
            return
        seen: set[str] = set()
        for variant in deletion_variants(k):
            for anchor in self._variants.get(variant, _EMPTY):
                if anchor not in seen and anchor != k:
                    seen.add(anchor)
                    yield anchor, self._anchor_ids[anchor]

    # -- writing -------------------------------------------------------------------------------

    def put(self, entity: Entity) -> None:
        """Add or replace an entity (with all its names)."""
        old = self._entities.get(entity.entity_id)
        if old is not None:
            self._unindex(old)
        self._entities[entity.entity_id] = entity
        self._index(entity)
        if entity.ordinal > self._max_ordinal:
            self._max_ordinal = entity.ordinal

    def put_many(self, entities: Iterable[Entity]) -> None:
        for entity in entities:
            self.put(entity)

    def discard(self, entity_id: str) -> None:
        old = self._entities.pop(entity_id, None)
        if old is not None:
            self._unindex(old)

    def _index(self, entity: Entity) -> None:
        if entity.status is Status.MERGED:
            return
        eid = entity.entity_id
        for n in entity.names:
            _add(self._by_display, n.display, eid)
            _add(self._by_fold, n.folded, eid)
            _add(self._by_key, n.key, eid)
            if n.kind is not NameKind.SURFACE and len(n.key) >= MIN_TYPO_KEY:
                ids = self._anchor_ids.get(n.key)
                if ids is None:
                    ids = self._anchor_ids[n.key] = set()
                    for variant in deletion_variants(n.key):
                        _add(self._variants, variant, n.key)
                ids.add(eid)

    def _unindex(self, entity: Entity) -> None:
        eid = entity.entity_id
        for n in entity.names:
            _remove(self._by_display, n.display, eid)
            _remove(self._by_fold, n.folded, eid)
            _remove(self._by_key, n.key, eid)
            ids = self._anchor_ids.get(n.key)
            if ids is not None and eid in ids:
                ids.discard(eid)
                if not ids:
                    del self._anchor_ids[n.key]
                    for variant in deletion_variants(n.key):
                        _remove(self._variants, variant, n.key)


_EMPTY: set[str] = set()


def _add(table: dict[str, set[str]], k: str, value: str) -> None:
    bucket = table.get(k)
    if bucket is None:
        table[k] = {value}
    else:
        bucket.add(value)


def _remove(table: dict[str, set[str]], k: str, value: str) -> None:
    bucket = table.get(k)
    if bucket is not None:
        bucket.discard(value)
        if not bucket:
            del table[k]


__all__ = ["NameIndex", "deletion_variants", "key_of", "MIN_TYPO_KEY"]
