"""The lifecycle rules of SPEC section 3 as pure functions over domain values.

Each function says what a decision or an admin action changes; it reads no store and writes
nothing. `unit.Unit` applies what they return inside a write transaction, and the service
chooses which to call. Unit tests exercise every rule here without a database.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import NamedTuple

from identity_server.domain import (
    OTHER,
    RETIRED,
    Entity,
    MatchKind,
    Mention,
    NameKind,
    NameRow,
    Rule,
    Status,
    types_compatible,
)
from identity_server.matching import Decision, Outcome

# Where a name came from. Only the authority's own aliases are retired when a re-import no
# longer lists them; a curator's, a merge's or a previous name stays. An alias the authority
# listed over a spelling the entity held as a surface form (seen in a paper, or a provisional
# name a merge brought) becomes that surface form again: nothing is ever deleted.
AUTHORITY, CURATOR, MERGE, PREVIOUS_NAME = "authority", "curator", "merge", "previous_name"
AUTHORITY_OVER_SURFACE = "authority_seen"  # 16 characters at most: the column's width
AUTHORITY_LISTED = frozenset((AUTHORITY, AUTHORITY_OVER_SURFACE))

# -- resolving -----------------------------------------------------------------------------------

class ResolveWrites(NamedTuple):
    """What resolving one mention writes (SPEC sections 2 and 3), and what its reply says."""

    match_kind: MatchKind
    matched_name: str
    entity: Entity | None = None  # the entity the mention resolves to; None: a new one
    surface_form: bool = False  # record the display form as a surface form of `entity`
    type_upgrade: bool = False  # `entity` takes the mention's type
    placeholder: bool = False  # the new entity is the (display form, type) pair's placeholder
    link_to: tuple[str, ...] = ()  # link the returned entity possibly_same_as to these
    evidence: bool = False  # record that the entity was seen in the context's paper

    @property
    def new_entity(self) -> bool:
        return self.entity is None

    @property
    def evidence_only(self) -> bool:
        """Its only write is evidence for an existing entity: rows no decision reads, but for
        promotion by evidence."""
        return (self.evidence and self.entity is not None
                and not (self.surface_form or self.type_upgrade or self.link_to))

    @property
    def writes_nothing(self) -> bool:
        return not (self.entity is None or self.surface_form or self.type_upgrade
                    or self.link_to or self.evidence)


def plan_resolve(d: Decision, m: Mention, *, context_id: str,
                 placeholder: Entity | None = None) -> ResolveWrites:
    """The writes of decision d for mention m. `placeholder`: the live placeholder of the
    mention's (display form, type) pair, when d is ambiguous and it exists."""
    evidence = bool(context_id)
    if d.outcome is Outcome.CONVERGED:
        winner = d.best[0]
        entity = winner.entity
        has_display = d.rule is Rule.EXACT or entity.has_display(m.display)
        return ResolveWrites(d.match_kind, winner.matched_name, entity,
                             surface_form=not has_display,
                             type_upgrade=takes_type(entity, m.entity_type),
                             evidence=evidence)
    best = tuple(c.entity.entity_id for c in d.best)
    matched = d.best[0].matched_name if d.best else ""
    if d.outcome is Outcome.AMBIGUOUS:
        return ResolveWrites(MatchKind.AMBIGUOUS, matched, placeholder,
                             placeholder=placeholder is None, link_to=best, evidence=evidence)
    return ResolveWrites(MatchKind.NEW, matched, link_to=best, evidence=evidence)


def takes_type(entity: Entity, mention_type: str) -> bool:
    """A provisional entity typed `other` takes a typed mention's type (never a placeholder)."""
    return (entity.status is Status.PROVISIONAL and not entity.placeholder
            and entity.entity_type == OTHER and mention_type != OTHER)


def promotable(entity: Entity, after_papers: int) -> bool:
    """Whether evidence can promote the entity (automatic promotion is configured, and it is a
    provisional entity that is not a placeholder)."""
    return after_papers > 0 and entity.status is Status.PROVISIONAL and not entity.placeholder


def promotion_due(entity: Entity, papers: int, after_papers: int) -> bool:
    """Whether an entity with evidence from `papers` distinct papers is promoted now."""
    return promotable(entity, after_papers) and papers >= after_papers


# -- merging and settling ------------------------------------------------------------------------

def merge_refusal(source: Entity, target: Entity, *, distinct: bool) -> str | None:
    """Why source may not be merged into target (FAILED_PRECONDITION), or None. `distinct`:
    a curator called the pair distinct."""
    if source.entity_id == target.entity_id:
        return f"cannot merge {source.entity_id} into itself"
    if not types_compatible(source.entity_type, target.entity_type):
        return (f"cannot merge {source.entity_id} ({source.entity_type}) into "
                f"{target.entity_id} ({target.entity_type}): incompatible types")
    if source.status is Status.CANONICAL and target.status is Status.PROVISIONAL:
        return (f"cannot merge canonical {source.entity_id} into provisional "
                f"{target.entity_id}; merge the other way, or promote the target first")
    if distinct:
        return f"a curator settled {source.entity_id} and {target.entity_id} as distinct"
    return None


def merge_rank(e: Entity) -> tuple[int, int, int]:
    """Settled same, the better-ranked entity of a pair is the target: canonical before
    provisional, a non-placeholder before a placeholder, then the older one."""
    return (0 if e.status is Status.CANONICAL else 1, 1 if e.placeholder else 0, e.ordinal)


def merged_names(source: Entity, target_rows: Mapping[str, NameRow],
                 ) -> tuple[list[NameRow], list[NameRow]]:
    """The target's name rows a merge adds or changes: (moved, claimed).

    The source's aliases become aliases; its name an alias if it was canonical, a surface form
    if provisional (a spelling someone wrote, never a typo anchor); its surface forms surface
    forms. A spelling the target already holds is not added again, but a surface form that
    arrives as an alias becomes one, and an authority alias the source had too becomes the
    merge's as well (`claimed`), so it outlives the authority dropping it."""
    position = max((r.position for r in target_rows.values()), default=0) + 1
    moved: list[NameRow] = []
    claimed: list[NameRow] = []
    for n in source.names:  # name, aliases, surface forms, in recorded order
        becomes_alias = n.kind is NameKind.ALIAS or (
            n.kind is NameKind.NAME and source.status is Status.CANONICAL)
        kind = NameKind.ALIAS if becomes_alias else NameKind.SURFACE
        old = target_rows.get(n.display)
        if old is not None and old.kind != RETIRED:
            if old.kind == NameKind.SURFACE.value and kind is NameKind.ALIAS:
                moved.append(NameRow(n.display, kind.value, position, MERGE))
                position += 1
            elif old.kind == NameKind.ALIAS.value and old.source in AUTHORITY_LISTED:
                # The merge's too: an alias stays one, a surface form outlives the listing.
                source_now = MERGE if kind is NameKind.ALIAS else AUTHORITY_OVER_SURFACE
                if source_now != old.source:
                    claimed.append(dataclasses.replace(old, source=source_now))
            continue
        moved.append(NameRow(n.display, kind.value, position, MERGE))
        position += 1
    return moved, claimed


# -- importing -----------------------------------------------------------------------------------

def reimported_names(rows: Mapping[str, NameRow], name: str,
                     aliases: Iterable[str]) -> dict[str, NameRow]:
    """The name rows a re-import of a canonical entity changes, by display form: the
    authority's name and aliases replace what it said before; the previous name stays as an
    alias; aliases a curator or a merge added, and surface forms, stay; an authority alias no
    longer listed is retired (or is a surface form again, when it was one before)."""
    position = max((r.position for r in rows.values()), default=0) + 1
    changed: dict[str, NameRow] = {}
    new_aliases = unique(aliases, exclude=name)

    def assign(display: str, kind: NameKind, source: str) -> None:
        nonlocal position
        old = changed.get(display, rows.get(display))
        if old is not None and old.kind == kind.value:
            # An alias a curator, a merge or a renaming gave stays theirs when the authority
            # lists it too, so it outlives the authority dropping it later.
            keeps_source = kind is NameKind.ALIAS and old.source != AUTHORITY
            if old.source != source and not keeps_source:
                changed[display] = dataclasses.replace(old, source=source)
            return
        if (old is not None and old.kind == NameKind.SURFACE.value
                and kind is NameKind.ALIAS and source == AUTHORITY):
            source = AUTHORITY_OVER_SURFACE  # a surface form again once dropped
        # Recorded now in its new role: it goes after the names already recorded in it.
        changed[display] = NameRow(display, kind.value, position, source)
        position += 1

    for r in rows.values():
        if r.kind == NameKind.NAME.value and r.display != name:
            assign(r.display, NameKind.ALIAS, PREVIOUS_NAME)
        elif (r.kind == NameKind.ALIAS.value and r.source in AUTHORITY_LISTED
              and r.display not in new_aliases and r.display != name):
            if r.source == AUTHORITY:
                changed[r.display] = dataclasses.replace(r, kind=RETIRED)
            else:
                assign(r.display, NameKind.SURFACE, "")
    assign(name, NameKind.NAME, AUTHORITY)
    for a in new_aliases:
        assign(a, NameKind.ALIAS, AUTHORITY)
    return changed


def import_merge_target(provisional: Entity, canonical: Iterable[Entity]) -> list[Entity]:
    """The canonical entities an import offers a provisional entity, compatible in type, oldest
    first: one is merged into (unless a curator called the pair distinct); several are each
    linked possibly_same_as instead. None for a placeholder or an entity no longer
    provisional."""
    if provisional.status is not Status.PROVISIONAL or provisional.placeholder:
        return []
    offered = {c.entity_id: c for c in canonical}  # several records may redirect to one
    return sorted((c for c in offered.values() if c.status is Status.CANONICAL
                   and types_compatible(c.entity_type, provisional.entity_type)),
                  key=lambda e: e.ordinal)


def unique(items: Iterable[str], *, exclude: str) -> list[str]:
    """items in order without repeats or `exclude`."""
    seen = {exclude}
    out = []
    for item in items:
        if item not in seen:
            seen.add(item)
            out.append(item)
    return out


__all__ = [
    "AUTHORITY", "AUTHORITY_LISTED", "AUTHORITY_OVER_SURFACE", "CURATOR", "MERGE",
    "PREVIOUS_NAME", "ResolveWrites", "import_merge_target",
    "merge_rank", "merge_refusal", "merged_names", "plan_resolve", "promotable",
    "promotion_due", "reimported_names", "takes_type", "unique",
]
