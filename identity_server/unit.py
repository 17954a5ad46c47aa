"""One write transaction's work: changes to the store, the index and the change feed together.

A Unit is handed to use-case code by `IdentityService._write`, which holds the store's write lock,
has already caught the index up with the feed, and commits (or rolls back and reloads) afterwards.
Every mutation goes through a method here so that the database rows, the in-memory index and the
feed event are always produced by the same step.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from identity_server import lifecycle
from identity_server.domain import (
    PROVISIONAL_PREFIX,
    RETIRED,
    Entity,
    Mention,
    Name,
    NameKind,
    NameRow,
    Status,
    provisional_id,
)
from identity_server.errors import FailedPrecondition
from identity_server.index import NameChanges, NameIndex
from identity_server.lifecycle import (
    AUTHORITY,
    AUTHORITY_LISTED,
    CURATOR,
    ResolveWrites,
)
from identity_server.store import ChangeRecord, Tx

# Change-feed kinds (SPEC section 3).
CREATED = "created"
SURFACE_FORM_ADDED = "surface_form_added"
ALIAS_ADDED = "alias_added"
TYPE_UPGRADED = "type_upgraded"
PROMOTED = "promoted"
MERGED = "merged"
LINK_ADDED = "link_added"
LINK_SETTLED = "link_settled"
IMPORTED = "imported"

OPEN, DISTINCT, SAME, MOVED = "open", "distinct", "same", "moved"


class Unit:
    """The store transaction, the index and the changes made so far in this transaction."""

    def __init__(self, tx: Tx, index: NameIndex, seq: int, *, caught_up_from: int | None = None,
                 caught_up: dict[str, Entity | None] | None = None) -> None:
        self.tx = tx
        self.index = index
        self.seq = seq
        # The feed position the index held before this transaction caught it up, and the
        # versions the catch-up replaced: with the unit's own changes, what changed since a
        # decision made at that position (see name_changes).
        self.caught_up_from = seq if caught_up_from is None else caught_up_from
        self._replaced: dict[str, Entity | None] = dict(caught_up or {})
        self._unread: set[str] = set(self._replaced)
        self._changes = NameChanges()
        self.now = time.time()
        self.changes: list[ChangeRecord] = []
        self.touched: set[str] = set()
        # Touched since the service last linked placeholders to new candidates (after each
        # resolve, so a candidate that is best only between two mentions of a batch counts),
        # each with its version from before (None: new), whose names may have put it among a
        # placeholder pair's candidates that its present names no longer do (a merged source).
        self.touched_since_linking: dict[str, Entity | None] = {}
        # Touched otherwise than by a surface form alone (which is never a typo anchor): given a
        # name, an alias, a type or a status, so possibly a placeholder pair's rule-4 candidate.
        self.reanchored: set[str] = set()
        self._evidence: dict[tuple[str, str, str, str], int] = {}
        self._new_entities: list[Entity] = []
        self._new_names: list[tuple[str, NameRow]] = []

    # -- bookkeeping ---------------------------------------------------------------------------

    def emit(self, kind: str, entity_id: str, other_id: str = "", **detail: Any) -> int:
        self.seq += 1
        self.changes.append(ChangeRecord(self.seq, kind, entity_id, other_id, detail, self.now))
        return self.seq

    def name_changes(self, since: int) -> NameChanges | None:
        """The names of every entity changed since feed position `since`, by other processes
        (the catch-up) or by this unit, as they were then and as they are; None when the
        versions of then are not known (the index moved past `since` before this transaction)."""
        if since != self.caught_up_from:
            return None
        for eid in self._unread:
            self._changes.add(self._replaced[eid], self.index.get(eid))
        self._unread.clear()
        return self._changes

    def put(self, entity: Entity, *, surface_form_only: bool = False) -> None:
        eid = entity.entity_id
        if eid not in self.touched_since_linking:
            self.touched_since_linking[eid] = self.index.get(eid)
        if eid not in self._replaced:
            self._replaced[eid] = self.index.get(eid)
        self._unread.add(eid)
        self.index.put(entity)
        self.touched.add(eid)
        if not surface_form_only:
            self.reanchored.add(eid)

    def add_evidence(self, entity_id: str, context_id: str, surface: str, raw_type: str) -> None:
        """Buffered: written in one statement by `flush` (before commit or a count)."""
        k = (entity_id, context_id, surface, raw_type)
        self._evidence[k] = self._evidence.get(k, 0) + 1

    def flush(self) -> None:
        """Write the buffered rows: new entities, names, evidence, then the change feed.

        Resolving only appends rows, so they are written in one statement per table; every
        method that reads or updates stored entities or names flushes first.
        """
        self.tx.insert_entities(self._new_entities, now=self.now)
        self._new_entities = []
        self.tx.put_names_of(self._new_names)
        self._new_names = []
        self.tx.add_evidence(self._evidence)
        self._evidence = {}
        self.tx.append_changes(self.changes)
        self.changes = []

    # -- resolving -------------------------------------------------------------------------------

    def apply_resolve(self, plan: ResolveWrites, m: Mention,
                      context_id: str) -> tuple[Entity, tuple[str, ...]]:
        """Make the writes `lifecycle.plan_resolve` planned for mention m: the entity it
        resolves to, and the candidates that entity is linked to."""
        entity = plan.entity
        if entity is None:
            entity = self.create_provisional(m.display, m.entity_type,
                                             placeholder=plan.placeholder)
            if plan.placeholder:
                self.tx.insert_placeholder(m.display, m.entity_type, entity.entity_id)
        if plan.surface_form:
            entity = self.add_name(entity, m.display, NameKind.SURFACE)
        if plan.type_upgrade:
            entity = self.upgrade_type(entity, m.entity_type)
        linked = (tuple(c for c in plan.link_to if self.link(entity.entity_id, c))
                  if plan.link_to else ())
        if plan.evidence:
            self.add_evidence(entity.entity_id, context_id, m.display, m.raw_type)
        return entity, linked

    # -- entities and names --------------------------------------------------------------------

    def create_provisional(self, display: str, entity_type: str, *, placeholder: bool) -> Entity:
        ordinal = self.index.max_ordinal + 1
        entity = Entity(
            entity_id=provisional_id(ordinal),
            entity_type=entity_type,
            status=Status.PROVISIONAL,
            ordinal=ordinal,
            placeholder=placeholder,
            names=(Name(display, NameKind.NAME, 0),),
        )
        self._new_entities.append(entity)
        self._new_names.append((entity.entity_id, NameRow(display, NameKind.NAME.value, 0, "")))
        self.emit(CREATED, entity.entity_id, name=display, entity_type=entity_type,
                  placeholder=placeholder)
        self.put(entity)
        return entity

    def create_canonicals(self, records: list[tuple[str, str, str, list[str]]]) -> list[Entity]:
        """New canonical entities from (id, name, type, aliases), written in bulk."""
        created: list[Entity] = []
        rows: list[tuple[str, NameRow]] = []
        ordinal = self.index.max_ordinal
        for entity_id, name, entity_type, aliases in records:
            ordinal += 1
            mine = [NameRow(name, NameKind.NAME.value, 0, AUTHORITY)]
            mine += [
                NameRow(a, NameKind.ALIAS.value, i + 1, AUTHORITY)
                for i, a in enumerate(lifecycle.unique(aliases, exclude=name))
            ]
            created.append(
                Entity(entity_id, entity_type, Status.CANONICAL, ordinal, names=_names(mine))
            )
            rows += [(entity_id, r) for r in mine]
            self.emit(IMPORTED, entity_id, name=name, entity_type=entity_type, aliases=aliases,
                      created=True)
        self._new_entities += created
        self._new_names += rows
        for entity in created:
            self.put(entity)
        return created

    def reimport_canonical(self, entity: Entity, name: str, entity_type: str,
                           aliases: list[str]) -> Entity:
        """Replace what the authority said; the previous name stays as an alias, and aliases
        added by curators or merges, and surface forms, stay."""
        self.flush()
        rows = {r.display: r for r in self.tx.name_rows(entity.entity_id)}
        changed = lifecycle.reimported_names(rows, name, aliases)
        self.tx.put_names(entity.entity_id, list(changed.values()))
        if entity_type != entity.entity_type:
            self.tx.update_entity(entity.entity_id, entity_type=entity_type)
        final = {**rows, **changed}
        updated = dataclasses.replace(
            entity, entity_type=entity_type,
            names=_names(r for r in final.values() if r.kind != RETIRED),
        )
        self.emit(IMPORTED, entity.entity_id, name=name, entity_type=entity_type,
                  aliases=aliases, created=False)
        self.put(updated)
        return updated

    def add_name(self, entity: Entity, display: str, kind: NameKind, source: str = "") -> Entity:
        """Record display as a surface form or alias (an existing surface form becomes an alias)."""
        same = entity.with_display(display)
        existing = same[0] if same else None
        alias = kind is NameKind.ALIAS
        if existing is not None:
            if existing.kind is NameKind.ALIAS and alias and source == CURATOR:
                self._claim_for_curator(entity.entity_id, display)
            if not (existing.kind is NameKind.SURFACE and alias):
                return entity
            names = tuple(n for n in entity.names if n is not existing)
        else:
            names = entity.names
        # Positions order an entity's names within a kind; only live names need distinct ones.
        position = entity.next_position()
        self._new_names.append((entity.entity_id, NameRow(display, kind.value, position, source)))
        added = Name(display, kind, position)
        updated = (entity.with_name(added) if names is entity.names
                   else dataclasses.replace(entity, names=names + (added,)))
        change = ALIAS_ADDED if alias else SURFACE_FORM_ADDED
        field = "alias" if alias else "surface_form"
        self.emit(change, entity.entity_id, **{field: display})
        self.put(updated, surface_form_only=kind is NameKind.SURFACE)
        return updated

    def _claim_for_curator(self, entity_id: str, display: str) -> None:
        """A curator adding an alias the authority already gave makes it the curator's, so it
        stays when a later re-import drops it."""
        self.flush()
        row = next((r for r in self.tx.name_rows(entity_id) if r.display == display), None)
        if row is not None and row.source in AUTHORITY_LISTED:
            self.tx.put_names(entity_id, [dataclasses.replace(row, source=CURATOR)])

    def upgrade_type(self, entity: Entity, entity_type: str) -> Entity:
        self.flush()
        self.tx.update_entity(entity.entity_id, entity_type=entity_type)
        updated = dataclasses.replace(entity, entity_type=entity_type)
        self.emit(TYPE_UPGRADED, entity.entity_id, old_type=entity.entity_type,
                  entity_type=entity_type)
        self.put(updated)
        return updated

    def promote(self, entity: Entity, *, reason: str) -> Entity:
        self.flush()
        if entity.status is Status.CANONICAL:
            return entity
        self.tx.update_entity(entity.entity_id, status=Status.CANONICAL)
        updated = dataclasses.replace(entity, status=Status.CANONICAL)
        self.emit(PROMOTED, entity.entity_id, reason=reason)
        self.put(updated)
        return updated

    # -- links -----------------------------------------------------------------------------------

    def link(self, x: str, y: str) -> bool:
        """Link two live entities `possibly_same_as`; False when a curator settled the pair."""
        if x == y:
            return False
        row = self.tx.link(x, y)
        if row is None:
            seq = self.emit(LINK_ADDED, x, y)
            self.tx.put_link(x, y, OPEN, seq)
            return True
        return row.state == OPEN

    def is_distinct(self, x: str, y: str) -> bool:
        row = self.tx.link(x, y)
        return row is not None and row.state == DISTINCT

    # -- merge -----------------------------------------------------------------------------------

    def check_mergeable(self, source: Entity, target: Entity) -> None:
        refusal = lifecycle.merge_refusal(
            source, target, distinct=self.is_distinct(source.entity_id, target.entity_id))
        if refusal is not None:
            raise FailedPrecondition(refusal)

    def merge(self, source: Entity, target: Entity, *, reason: str) -> Entity:
        """Merge live source into live target (checked by the caller with check_mergeable)."""
        self.flush()
        s_id, t_id = source.entity_id, target.entity_id
        t_rows = {r.display: r for r in self.tx.name_rows(t_id)}
        moved, claimed = lifecycle.merged_names(source, t_rows)
        self.tx.move_names(s_id, t_id, moved)
        self.tx.put_names(t_id, claimed)
        self.tx.update_entity(s_id, status=Status.MERGED, redirect_to=t_id)
        redirected = self.tx.compress_redirects(s_id, t_id)

        for row in self.tx.links_of(s_id):
            other = row.b if row.a == s_id else row.a
            self.tx.set_link_state(s_id, other, SAME if other == t_id else MOVED)
            if other == t_id:
                continue
            existing = self.tx.link(t_id, other)
            if existing is None:
                self.tx.put_link(t_id, other, row.state, self.seq + 1)
            elif row.state == DISTINCT and existing.state != DISTINCT:
                self.tx.set_link_state(t_id, other, DISTINCT)

        merged_names = {r.display: r for r in moved}
        kept = tuple(n for n in target.names if n.display not in merged_names)
        updated_target = dataclasses.replace(
            target, names=kept + _names(merged_names.values())
        )
        self.emit(MERGED, s_id, t_id, reason=reason, redirected=redirected,
                  names=[r.display for r in moved])
        self.put(dataclasses.replace(source, status=Status.MERGED, redirect_to=t_id, names=()))
        self.put(updated_target)
        for eid in redirected:
            e = self.index.get(eid)
            if e is not None:
                self.put(dataclasses.replace(e, redirect_to=t_id))
        return updated_target


# Feed events that change no entity (links live in the store alone), and those whose event says
# all they did to their entity (`replayed`).
LINK_KINDS = frozenset((LINK_ADDED, LINK_SETTLED))
REPLAYED_KINDS = frozenset((CREATED, SURFACE_FORM_ADDED))


def replayed(change: ChangeRecord, current: Entity | None) -> Entity | None:
    """The entity as `change` left it, worked out from the event and the entity before it, for
    the kinds whose event says all they did, as `Unit` made them: a new provisional entity, a
    surface form appended. None for the others (the store has their result)."""
    if change.kind == CREATED and current is None:
        detail = change.detail
        return Entity(
            entity_id=change.entity_id,
            entity_type=detail["entity_type"],
            status=Status.PROVISIONAL,
            ordinal=int(change.entity_id.removeprefix(PROVISIONAL_PREFIX)),
            placeholder=detail["placeholder"],
            names=(Name(detail["name"], NameKind.NAME, 0),),
        )
    if change.kind == SURFACE_FORM_ADDED and current is not None:
        display = change.detail["surface_form"]
        if not current.has_display(display):
            return current.with_name(Name(display, NameKind.SURFACE, current.next_position()))
    return None


def _names(rows: Any) -> tuple[Name, ...]:
    return tuple(Name(r.display, NameKind(r.kind), r.position) for r in rows)
