"""The in-memory name index: lookups by key (rules 1 to 3) and by typo neighbourhood (rule 4).

Typo candidates come from a deletion neighbourhood (the SymSpell idea at distance 1): every
anchor key (the key of an entity's name or alias, 4+ characters) is filed under itself and under
each string made by deleting one of its characters. Two keys within one insertion, deletion,
substitution or adjacent swap share at least one such variant, so a lookup probes len(key) + 1
variants and never scans the names: its cost depends on the key's length, not the entity count.
The variants live in `typo_table.DeletionVariantTable`, packed at start-up (`load`) and again,
in the background, once enough anchors have been filed since (`begin_typo_pack`).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Mapping

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.multimap import MultiMap, add, remove, values
from identity_server.normalize import key, one_edit_apart
from identity_server.typo_table import DeletionVariantTable, OverlayPack, variant_hashes

MIN_TYPO_KEY = 4  # SPEC: keys shorter than 4 characters get no typo candidates at all
# A typo pack is due when the overlay holds this share of the packed anchors (and the service's
# floor): an overlay anchor costs ~10x a packed one, a pack costs a pass over the packed array.
_PACK_SHARE = 64


class NameIndex:
    """Every entity and its names, indexed for the four rules. Not thread-safe by itself.

    One table serves rules 1 to 3: names with equal display forms, or equal casefolded forms,
    have equal keys, so the entities holding a key are a superset of those matching at any of the
    three rules, and the rules pick the names that match from each candidate's own names. One
    table instead of three saves a third of the index's memory at no cost in lookups (the key
    bucket of a mention is almost always the handful of entities it is about).
    """

    def __init__(self) -> None:
        self._entities: dict[str, Entity] = {}
        self._by_key: MultiMap = {}  # key of any name, alias or surface form -> entity ids
        self._variants = DeletionVariantTable()  # deletion variant -> anchor keys
        self._max_ordinal = 0
        self._bulk_anchors: list[str] | None = None  # load() packs the typo table once, at the end
        # Keys of live placeholders' names -> how many: a changed entity sharing none of them
        # cannot be a new candidate of any placeholder's pair at rules 1-3 (one lookup to tell).
        self._placeholder_keys: dict[str, int] = {}
        # The typo table's hashes of the deletion variants of live placeholders' pair keys (4+
        # characters) -> placeholder ids: an entity whose anchors share none cannot be a new
        # candidate of a pair at rule 4 (a hash shared by two strings only adds a placeholder to
        # check). Hashes, not strings: a new entity's key was hashed by the lookup that missed.
        self._placeholder_variants: dict[int, str | set[str]] = {}
        # Placeholders merged away, by id: their pair's display form. A pair's placeholder stays
        # the pair's when merged (its resolves follow the redirect), so its pair is still filed
        # above and in the table below, and candidates that appear later are linked to the
        # entity it redirects to.
        self._merged_pairs: dict[str, str] = {}
        self._merged_pair_ids: MultiMap = {}  # the key of such a pair -> the placeholders' ids

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

    def placeholders_near(self, entity: Entity, *, by_typo: bool = True) -> list[Entity]:
        """Placeholders (other than entity; live ones, and merged ones whose pair is known)
        whose pair entity may now be a candidate of: one of entity's names shares a key with
        one of theirs or with their pair's (rules 1 to 3), or, by_typo, one of its anchors
        shares a deletion variant with the pair's key (rule 4). A superset; nothing to look up
        when there are no placeholders."""
        held = self._placeholder_keys
        if not held:
            return []
        found: dict[str, Entity] = {}
        merged = self._merged_pair_ids
        for k in [k for k in entity.name_keys() if k in held]:
            self._collect_placeholders(values(self._by_key, k), entity.entity_id, found)
            if merged:
                self._collect_placeholders(values(merged, k), entity.entity_id, found)
        near = self._placeholder_variants
        if by_typo and near:
            for k in anchor_keys(entity.names):
                for variant in variant_hashes(k):
                    if variant in near:
                        self._collect_placeholders(values(near, variant), entity.entity_id, found)
        return list(found.values())

    def _collect_placeholders(self, ids: Collection[str], besides: str,
                              found: dict[str, Entity]) -> None:
        for pid in ids:
            p = self._entities.get(pid)
            if (p is not None and p.placeholder and pid != besides
                    and (p.status is not Status.MERGED or pid in self._merged_pairs)):
                found[pid] = p

    def pair_display(self, placeholder: Entity) -> str:
        """The display form of a placeholder's (display form, type) pair: its name, or, merged
        away, the name it had."""
        if placeholder.status is Status.MERGED:
            return self._merged_pairs.get(placeholder.entity_id, "")
        return placeholder.name

    def note_merged_placeholders(self, pairs: Mapping[str, str]) -> None:
        """Learn the pairs (placeholder id -> display form, from the store) of placeholders
        that were merged away where this index did not see them live: at start-up, or by
        another process."""
        for eid, display in pairs.items():
            entity = self._unpaired(eid)
            if entity is not None:
                self._merged_pairs[eid] = display
                self._file_placeholder(entity, 1)

    def merged_placeholders_unpaired(self, ids: Iterable[str]) -> list[str]:
        """Those of ids that are merged placeholders whose pair this index does not know."""
        return [eid for eid in ids if self._unpaired(eid) is not None]

    def _unpaired(self, eid: str) -> Entity | None:
        """eid's entity when it is a placeholder merged away whose pair this index lacks."""
        e = self._entities.get(eid)
        if (e is not None and e.placeholder and e.status is Status.MERGED
                and eid not in self._merged_pairs):
            return e
        return None

    def with_key(self, k: str) -> Collection[str]:
        """Ids of the live entities with a name, alias or surface form whose key is k."""
        return values(self._by_key, k)

    def typo_neighbours(self, k: str) -> Iterator[tuple[str, Collection[str]]]:
        """(anchor key, entity ids) for anchor keys sharing a deletion variant with k.

        Supersets both ways: the caller verifies each key with `one_edit_apart`, and each entity
        for a name or alias (not a surface form) with that key, since an anchor key stays filed
        after its last name or alias is gone.
        """
        if len(k) < MIN_TYPO_KEY:
            return
        by_key = self._by_key
        for anchor in self._variants.anchors_near(k):
            if anchor != k:
                ids = values(by_key, anchor)
                if ids:
                    yield anchor, ids

    # -- writing -------------------------------------------------------------------------------

    def put(self, entity: Entity) -> None:
        """Add or replace an entity; only the names that changed are re-indexed."""
        eid = entity.entity_id
        old = self._entities.get(eid)
        self._entities[eid] = entity
        if entity.placeholder or (old is not None and old.placeholder):
            self._file_placeholder(old, -1)
            if (old is not None and old.placeholder and old.status is not Status.MERGED
                    and entity.status is Status.MERGED and old.name):
                self._merged_pairs[eid] = old.name  # merged away: still its pair's
            self._file_placeholder(entity, 1)
        live = entity.status is not Status.MERGED
        after = entity.names if live else ()
        if old is None:
            self._index_new(eid, after)  # the start-up path: nothing to compare
        else:
            was_live = old.status is not Status.MERGED
            before = old.names if was_live else ()
            grown = live and was_live and entity.grew_from(before)
            self._reindex(eid, before, after, grown=grown)
        self._max_ordinal = max(self._max_ordinal, entity.ordinal)

    def put_many(self, entities: Iterable[Entity]) -> None:
        for entity in entities:
            self.put(entity)

    def load(self, entities: Iterable[Entity]) -> None:
        """Bulk-add entities to an empty index (start-up): the typo table is packed once at the
        end, which is faster and several times smaller than filing anchors one by one."""
        if self._entities:
            raise ValueError("load() fills an empty index; use put() to change one")
        anchors: list[str] = []
        self._bulk_anchors = anchors
        try:
            self.put_many(entities)
        finally:
            self._bulk_anchors = None
        self._variants.rebuild(anchors)

    def typo_anchors(self) -> tuple[int, int]:
        """Typo anchors filed (packed, waiting in the overlay for the next pack)."""
        return self._variants.packed_anchors, self._variants.overlay_anchors

    def typo_pack_due(self, at_least: int) -> bool:
        """Whether enough anchors filed since start-up wait in the typo overlay to pack them."""
        table = self._variants
        return table.overlay_anchors >= max(at_least, table.packed_anchors // _PACK_SHARE, 1)

    def begin_typo_pack(self) -> OverlayPack:
        """Set the typo overlay aside for a pack (the caller excludes writers; quick), then
        `build_typo_pack` without the lock, then `install_typo_pack`."""
        return self._variants.begin_pack()

    @staticmethod
    def build_typo_pack(pack: OverlayPack) -> None:
        """The slow part of a pack, shard by shard: safe beside readers and writers."""
        DeletionVariantTable.build(pack)

    def install_typo_pack(self, pack: OverlayPack) -> bool:
        """Finish a built pack (the caller excludes writers; quick); False when it came too
        late. Free the set-aside overlay afterwards, off the lock: `pack.release()`."""
        return self._variants.install(pack)

    def abandon_typo_pack(self, pack: OverlayPack) -> None:
        """Put a failed pack's anchors back in the overlay (the caller excludes writers)."""
        self._variants.abandon(pack)

    def discard(self, entity_id: str) -> None:
        old = self._entities.pop(entity_id, None)
        self._file_placeholder(old, -1)
        self._merged_pairs.pop(entity_id, None)
        if old is not None and old.status is not Status.MERGED:
            self._reindex(entity_id, old.names, ())

    def _file_placeholder(self, entity: Entity | None, step: int) -> None:
        """Count a placeholder's keys in (step 1) or out (step -1), and file or unfile the
        deletion variants of its pair's key: a live one's names, a merged one's pair (when
        known; a merged entity has no names of its own)."""
        if entity is None or not entity.placeholder:
            return
        file = add if step > 0 else remove
        if entity.status is Status.MERGED:
            display = self._merged_pairs.get(entity.entity_id)
            if display is None:
                return
            pair_key = key(display)
            keys: Collection[str] = (pair_key,)
            file(self._merged_pair_ids, pair_key, entity.entity_id)
        else:
            keys = {n.key for n in entity.names}
            pair = next((n for n in entity.names if n.kind is NameKind.NAME), None)
            pair_key = pair.key if pair is not None else ""
        held = self._placeholder_keys
        for k in keys:
            count = held.get(k, 0) + step
            if count > 0:
                held[k] = count
            else:
                held.pop(k, None)
        if len(pair_key) < MIN_TYPO_KEY:
            return
        for variant in set(variant_hashes(pair_key)):  # equal variants have equal hashes
            file(self._placeholder_variants, variant, entity.entity_id)

    def _reindex(self, eid: str, before: tuple[Name, ...], after: tuple[Name, ...], *,
                 grown: bool = False) -> None:
        """Move eid's entries from the names `before` to the names `after`; `grown`: after is
        before plus one name (a new spelling), known without comparing them.

        Compared as sets of keys, so a key that two names share (a name and an alias differing
        in case) stays indexed while either remains.
        """
        if grown and self._bulk_anchors is None:
            added = after[-1]  # one name more (a new spelling): no pass over the others
            add(self._by_key, added.key, eid)
            self._file_anchors(eid, (added,))
            return
        if before == after:
            return
        old = {n.key for n in before}
        new = {n.key for n in after}
        for k in old - new:
            remove(self._by_key, k, eid)
        for k in new - old:
            add(self._by_key, k, eid)
        self._file_anchors(eid, after)

    def _index_new(self, eid: str, names: tuple[Name, ...]) -> None:
        for n in names:
            add(self._by_key, n.key, eid)
        self._file_anchors(eid, names)

    def _holds_anchor(self, eid: str, k: str) -> bool:
        return any(n.key == k and _is_anchor(n) for n in self._entities[eid].names)

    def _file_anchors(self, eid: str, names: tuple[Name, ...]) -> None:
        """File eid's anchor keys (its names are already in the key table)."""
        collecting = self._bulk_anchors
        if collecting is not None:
            # load(): collected now, packed once at the end. Each key once: a key that another
            # entity already holds is collected only if none of those holds it as an anchor
            # (rare, and no table of every key seen is needed: it would be large at 10M).
            for k in {n.key for n in names if _is_anchor(n)}:
                ids = self._by_key[k]
                if isinstance(ids, str) or not any(
                    other != eid and self._holds_anchor(other, k) for other in ids
                ):
                    collecting.append(k)
            return
        for k in anchor_keys(names):
            if not self._variants.holds(k):
                self._variants.add(k)


class NameChanges:
    """The name keys and typo anchors of entities that changed, as they were and as they are:
    what tells whether a decision made before the changes still holds.

    Deciding a mention of key k reads only entities with a name, alias or surface form of key k
    (rules 1 to 3) and, at rule 4, entities with an anchor one edit from k (`typo_neighbours`
    yields more, but the rule verifies each anchor and each entity's names). An entity that
    changed is one of those before or after the change only if one of its versions has such a
    key; when none has, the decision is the same."""

    __slots__ = ("_anchors", "_keys", "_near")

    def __init__(self) -> None:
        self._keys: set[str] = set()
        self._anchors: set[str] = set()
        # The anchors by the hashes of their deletion variants: two keys one edit apart share
        # one (the typo table's own test), so a key meets only the anchors worth verifying.
        self._near: dict[int, str | set[str]] = {}

    def add(self, before: Entity | None, after: Entity | None) -> None:
        """One entity's change: its version before (None: new) and after (None: gone)."""
        for entity in (before, after):
            if entity is not None:
                self._keys.update(entity.name_keys())
        if before is not None and after is not None and _same_to_rule_4(before, after):
            return  # a surface form added: rule 4 reads the entity as it did
        for entity in (before, after):
            if entity is not None:
                for a in anchor_keys(entity.names):
                    if a not in self._anchors:
                        self._anchors.add(a)
                        for h in variant_hashes(a):
                            add(self._near, h, a)

    def may_change(self, k: str) -> bool:
        """Whether a decision for key k may read one of the changed entities."""
        if k in self._keys:
            return True
        near = self._near
        if not near or len(k) < MIN_TYPO_KEY:
            return False
        return any(one_edit_apart(k, a)
                   for h in variant_hashes(k) if h in near for a in values(near, h))


def _same_to_rule_4(before: Entity, after: Entity) -> bool:
    """Whether rule 4 sees the two versions alike: the same name and aliases (its anchors and
    matched names), type, status and place (surface forms, which it never reads, aside)."""
    return (before.entity_type == after.entity_type and before.status is after.status
            and before.redirect_to == after.redirect_to
            and before.placeholder == after.placeholder
            and tuple(before.names[:before.surface_start()])
            == tuple(after.names[:after.surface_start()]))


def anchor_keys(names: tuple[Name, ...]) -> set[str]:
    """The keys of the anchors among names in matched_name order (surface forms, which are
    never anchors, come last: a much-mentioned entity's thousands are not looked at)."""
    found = set()
    for n in names:
        if n.kind is NameKind.SURFACE:
            break
        if _is_anchor(n):
            found.add(n.key)
    return found


def _is_anchor(n: Name) -> bool:
    """Typo anchors: names and aliases (never surface forms) with keys of 4+ characters."""
    return n.kind is not NameKind.SURFACE and len(n.key) >= MIN_TYPO_KEY


__all__ = ["MIN_TYPO_KEY", "NameChanges", "NameIndex", "anchor_keys"]
