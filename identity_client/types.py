"""What the identity server answers, as plain Python values: nothing protobuf leaves the client
except each result's `message`, the reply as sent, for printing with `json_format`."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple

from identity_api.v1 import identity_service_pb2 as pb


class Status(StrEnum):
    """What an entity id is (the proto's EntityStatus)."""

    CANONICAL = "canonical"
    PROVISIONAL = "provisional"
    MERGED = "merged"


class MatchKind(StrEnum):
    """How Resolve reached its answer: the rule of SPEC section 2 that decided."""

    EXACT = "exact"
    CASE = "case"
    PUNCTUATION = "punctuation"
    ALIAS = "alias"
    TYPO = "typo"
    AMBIGUOUS = "ambiguous"
    NEW = "new"


class ChangeKind(StrEnum):
    CREATED = "created"
    SURFACE_FORM_ADDED = "surface_form_added"
    ALIAS_ADDED = "alias_added"
    TYPE_UPGRADED = "type_upgraded"
    PROMOTED = "promoted"
    MERGED = "merged"
    LINK_ADDED = "link_added"
    LINK_SETTLED = "link_settled"
    IMPORTED = "imported"


_STATUS = {pb.CANONICAL: Status.CANONICAL, pb.PROVISIONAL: Status.PROVISIONAL,
           pb.MERGED: Status.MERGED}
_KIND = {getattr(pb, kind.name): kind for kind in MatchKind}
_CHANGE = {getattr(pb, f"CHANGE_KIND_{kind.name}"): kind for kind in ChangeKind}


class Resolution(NamedTuple):
    """What the server decided for one mention (a named tuple: one is built per mention).

    `candidates` ranks the entities the rules compared, best first, and `scores` gives each its
    similarity (0-100) in the same order: the number the reconciliation endpoint shows."""

    entity_id: str
    status: Status | str
    match_kind: MatchKind | str
    created: bool
    entity_type: str
    name: str
    matched_name: str
    display_form: str
    candidates: tuple[str, ...]
    possibly_same_as: tuple[str, ...]
    scores: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ItemFailure:
    """The server refused one mention of a batch: its gRPC status code name and why."""

    code: str
    message: str


@dataclass(frozen=True, slots=True)
class BatchOutcome:
    """A ResolveBatch's outcomes in request order; `replayed`: the server answered with the
    stored reply of an identical earlier request (ids and kinds as they were then)."""

    outcomes: list[Resolution | ItemFailure]
    replayed: bool = False


@dataclass(frozen=True, slots=True)
class Entity:
    """An entity as GetEntity and the curation calls return it. `surface_forms` holds the page
    asked for; `surface_form_count` how many there are in all."""

    entity_id: str
    name: str
    entity_type: str
    status: Status | str
    aliases: tuple[str, ...]
    surface_forms: tuple[str, ...]
    redirect_to: str
    placeholder: bool
    evidence_count: int
    paper_count: int
    surface_form_count: int
    message: Any = field(default=None, compare=False, repr=False)


@dataclass(frozen=True, slots=True)
class EntityPage:
    """One page of ListEntities; `next_page_token` is empty on the last."""

    entities: tuple[Entity, ...]
    next_page_token: str


@dataclass(frozen=True, slots=True)
class Link:
    """An open possibly_same_as link; `sequence` is the change that opened it."""

    entity_id: str
    other_id: str
    sequence: int


@dataclass(frozen=True, slots=True)
class ChangeEvent:
    """One change of the store's feed: gapless sequence numbers in commit order."""

    sequence: int
    kind: ChangeKind | str
    entity_id: str
    other_id: str
    detail: str
    recorded_at: datetime


@dataclass(frozen=True, slots=True)
class ImportFailure:
    """A record of an authority file the server refused: its line and why."""

    line: int
    message: str


@dataclass(frozen=True, slots=True)
class ImportReport:
    imported: int
    created: int
    updated: int
    merged: int
    linked: int
    errors: tuple[ImportFailure, ...]
    message: Any = field(default=None, compare=False, repr=False)


def resolution(r: pb.ResolveResponse) -> Resolution:
    return Resolution(r.entity_id, _STATUS.get(r.status, ""), _KIND.get(r.match_kind, ""),
                      r.created, r.entity_type, r.name, r.matched_name, r.display_form,
                      tuple(r.candidates), tuple(r.possibly_same_as), tuple(r.candidate_scores))


def entity(e: pb.Entity) -> Entity:
    return Entity(
        entity_id=e.entity_id,
        name=e.name,
        entity_type=e.entity_type,
        status=_STATUS.get(e.status, ""),
        aliases=tuple(e.aliases),
        surface_forms=tuple(e.surface_forms),
        redirect_to=e.redirect_to,
        placeholder=e.placeholder,
        evidence_count=e.evidence_count,
        paper_count=e.paper_count,
        # 0 from a server older than the field: then the forms sent are all there are.
        surface_form_count=e.surface_form_count or len(e.surface_forms),
        message=e,
    )


def change(c: pb.Change) -> ChangeEvent:
    return ChangeEvent(c.sequence, _CHANGE.get(c.kind, "unspecified"), c.entity_id, c.other_id,
                       c.detail, datetime.fromisoformat(c.recorded_at))


def link(x: pb.PossiblySameAsLink) -> Link:
    return Link(x.entity_id, x.other_id, x.sequence)


def import_report(r: pb.ImportAuthorityResponse) -> ImportReport:
    return ImportReport(r.imported, r.created, r.updated, r.merged, r.linked,
                        tuple(ImportFailure(e.line, e.message) for e in r.errors), message=r)
