"""NameChanges against the matching rules themselves.

A batch's mentions are decided before the store's lock; under it, a decision stands without
being made again when `NameChanges.may_change(key)` says none of the entities changed since
(as they were, or as they are) can be read by a decision for that key. Here random indexes take
random writes (new entities, names, aliases and surface forms, type and status changes, merges,
discards), and every mention of a pool of spellings, of every type, is decided before and after:
wherever `may_change` says no, the two decisions must be equal, field by field.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.index import NameChanges, NameIndex
from identity_server.matching import Decision, decide
from identity_server.normalize import key

# Keys that collide ("mercury" four ways), keys one edit apart at 7, 6, 5 and 4 characters,
# keys one edit apart through a digit (never typos), and keys too short for rule 4.
SPELLINGS = ["Mercury", "MERCURY", "Mer-cury", "mer cury", "Mercurz", "Mercuri", "Saturn",
             "Satrun", "Saturm", "Venus", "venus", "Venuss", "Mars", "MARS", "Marz", "Covid19",
             "Covid18", "C#", "c.#", "Neptune", "Nepture"]
TYPES = ["person", "place", "other"]


def _live(index: NameIndex) -> list[Entity]:
    return [e for e in index.entities() if e.status is not Status.MERGED]


Change = tuple[Entity | None, Entity | None]


def _change(rng: random.Random, index: NameIndex, ordinal: int) -> list[Change]:
    """One random write; each entity it changed, as it was and as it is (None: absent)."""
    live = _live(index)
    action = rng.random() if live else 0.0
    if action < 0.3:
        made = Entity(f"e{ordinal}", rng.choice(TYPES), rng.choice(list(Status)[:2]), ordinal,
                      names=(Name(rng.choice(SPELLINGS), NameKind.NAME, 0),))
        index.put(made)
        return [(None, made)]
    entity = rng.choice(live)
    if action < 0.6:
        display = rng.choice(SPELLINGS)
        if entity.has_display(display):
            return []
        kind = rng.choice([NameKind.ALIAS, NameKind.SURFACE])
        after = entity.with_name(Name(display, kind, entity.next_position()))
    elif action < 0.7:
        after = dataclasses.replace(entity, entity_type=rng.choice(TYPES))
    elif action < 0.8:
        after = dataclasses.replace(entity, status=Status.CANONICAL)
    elif action < 0.9:
        others = [e for e in live if e.entity_id != entity.entity_id]
        if not others:
            return []
        target = rng.choice(others)
        grown = dataclasses.replace(target, names=target.names + tuple(
            Name(n.display, NameKind.ALIAS, 100 + i) for i, n in enumerate(entity.names)
            if not target.has_display(n.display)))
        index.put(grown)
        after = dataclasses.replace(entity, status=Status.MERGED, redirect_to=target.entity_id,
                                    names=())
        index.put(after)
        return [(entity, after), (target, grown)]
    else:
        index.discard(entity.entity_id)
        return [(entity, None)]
    index.put(after)
    return [(entity, after)]


def _seen(d: Decision) -> tuple[object, ...]:
    """Everything of a decision that a reply or a write depends on."""
    def candidates(cs: tuple[object, ...]) -> tuple[object, ...]:
        return tuple((c.entity.entity_id, c.entity.entity_type, c.entity.status,  # type: ignore[attr-defined]
                      c.entity.name, c.matched_name, c.alias_only)  # type: ignore[attr-defined]
                     for c in cs)
    return d.outcome, d.rule, candidates(d.candidates), candidates(d.best)


def _trial(seed: int) -> tuple[int, int]:
    """Random writes on a random index; every mention's decision before and after. Asserts
    that each one `may_change` leaves alone is the same; returns how many it left alone and
    how many decisions changed."""
    rng = random.Random(seed)
    index = NameIndex()
    ordinal = 1
    for _ in range(rng.randrange(0, 12)):
        _change(rng, index, ordinal)
        ordinal += 1
    mentions = [(s, t) for s in SPELLINGS for t in TYPES]
    decided = {m: _seen(decide(index, *m)) for m in mentions}
    changes = NameChanges()
    for _ in range(rng.randrange(1, 4)):
        for was, now in _change(rng, index, ordinal):
            changes.add(was, now)
        ordinal += 1
    kept = changed = 0
    for m in mentions:
        again = _seen(decide(index, *m))
        changed += again != decided[m]
        if not changes.may_change(key(m[0])):
            kept += 1
            assert again == decided[m], m
    return kept, changed


@pytest.mark.parametrize("seed", range(60))
def test_a_decision_no_change_may_reach_is_the_same_after_the_changes(seed: int) -> None:
    _trial(seed)


def test_the_trials_both_leave_decisions_alone_and_change_them() -> None:
    """The random writes are neither all far from every mention nor all near."""
    totals = [_trial(seed) for seed in range(60)]
    assert sum(kept for kept, _ in totals) > 500
    assert sum(changed for _, changed in totals) > 100


def test_a_key_or_a_typo_anchor_near_it_may_change_a_decision_and_others_not() -> None:
    changes = NameChanges()
    changes.add(None, Entity("e1", "person", Status.CANONICAL, 1,
                       names=(Name("Saturn", NameKind.NAME, 0),
                              Name("Covid19", NameKind.ALIAS, 1),
                              Name("Jupiterr", NameKind.SURFACE, 2))))
    assert changes.may_change(key("SATURN"))  # the same key (rules 1 to 3)
    assert changes.may_change(key("Satrun"))  # one edit from a name: rule 4
    assert changes.may_change(key("Jupiterr"))  # a surface form's own key
    assert not changes.may_change(key("Jupiter"))  # a surface form is never a typo anchor
    assert not changes.may_change(key("Covid18"))  # an edit at a digit is not a typo
    assert not changes.may_change(key("Neptune"))
    changes.add(None, None)  # nothing before, nothing after: adds nothing
    assert not changes.may_change(key("Neptune"))
