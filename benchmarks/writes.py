"""The rows the identity server writes for a generated mention, every decision made in advance.

The floors of goals 1 and 2 write these through the server's own store layer with no matching
and no bookkeeping, to measure what the store alone costs: a case, punctuation or typo form
converges on an entity that lacks that spelling (a surface form and its change); a new name
makes a provisional entity (the entity, its name and its change); an exact name or an alias
writes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from identity_server.domain import Entity, Name, NameKind, Status, provisional_id
from identity_server.normalize import display_form
from identity_server.store import ChangeRecord, NameRow, Tx

SURFACE_KINDS = ("case", "punctuation", "typo")  # converge on a spelling the entity lacks
WRITING_KINDS = (*SURFACE_KINDS, "new")


@dataclass
class Rows:
    """Rows for the store, gathered from one or more mentions: written in one transaction."""

    entities: list[Entity] = field(default_factory=list)
    names: list[tuple[str, NameRow]] = field(default_factory=list)
    evidence: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    changes: list[ChangeRecord] = field(default_factory=list)

    def add(self, text: str, entity_type: str, kind: str, entity_id: str, *, ordinal: int,
            seq: int, now: float, context_id: str = "") -> str:
        """The rows of one mention of `kind` (of the stored entity `entity_id`, or a new one
        numbered `ordinal`); its changes numbered from `seq`; with a context id, its evidence.
        Returns the entity's id."""
        display = display_form(text)
        if kind == "new":
            entity_id = provisional_id(ordinal)
            self.entities.append(Entity(entity_id, entity_type, Status.PROVISIONAL, ordinal,
                                        names=(Name(display, NameKind.NAME, 0),)))
            self.names.append((entity_id, NameRow(display, "name", 0, "")))
            self.changes.append(ChangeRecord(seq, "created", entity_id, "", {
                "name": display, "entity_type": entity_type, "placeholder": False}, now))
        elif kind in SURFACE_KINDS:
            self.names.append((entity_id, NameRow(display, "surface", 2, "")))
            self.changes.append(ChangeRecord(seq, "surface_form_added", entity_id, "",
                                             {"surface_form": display}, now))
        if context_id:
            k = (entity_id, context_id, display, entity_type)
            self.evidence[k] = self.evidence.get(k, 0) + 1
        return entity_id

    def write(self, tx: Tx, now: float) -> None:
        """Store them as the server's unit does at the end of a transaction (`Unit.flush`)."""
        tx.insert_entities(self.entities, now=now)
        tx.put_names_of(self.names)
        tx.add_evidence(self.evidence)
        tx.append_changes(self.changes)
