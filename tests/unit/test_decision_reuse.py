"""A decision made before the index changed is reused only when deciding again would give it.

A writing Resolve decides in its lock-free look and writes later, in a group: the writes grouped
before it change the index. `matching.still_stands` says whether those changes (the index's
journal of names before and after) can have touched the decision; whenever it says so, deciding
again must give exactly the same decision, with the same (current) entity objects.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.index import JOURNAL_LENGTH, NameIndex
from identity_server.matching import Decision, decide, still_stands
from identity_server.normalize import display_form, key
from tests.unit.test_matching_oracle import BASE_NAMES, TYPES, perturb, random_world


def _summary(index: NameIndex, d: Decision) -> tuple[object, ...]:
    return (d.outcome, d.rule, tuple(c.entity.entity_id for c in d.candidates),
            tuple(c.entity.entity_id for c in d.best),
            tuple(c.matched_name for c in d.candidates),
            tuple(c.alias_only for c in d.candidates))


def _a_mention(rng: random.Random) -> str:
    while True:
        m = display_form(perturb(rng, rng.choice(BASE_NAMES)) if rng.random() < 0.7
                         else rng.choice(BASE_NAMES))
        if key(m):
            return m


def _change(rng: random.Random, index: NameIndex, next_ordinal: int) -> None:
    """One change of the kinds the service makes: a new entity, a surface form or alias, a
    type upgrade, a promotion, a merge (the source keeps no names), a discard."""
    entities = list(index.entities())
    choice = rng.randrange(6)
    if choice == 0 or not entities:
        index.put(Entity(f"n{next_ordinal}", rng.choice(TYPES), Status.PROVISIONAL, next_ordinal,
                         names=(Name(_a_mention(rng), NameKind.NAME, 0),)))
        return
    e = rng.choice(entities)
    if choice == 1:
        display = _a_mention(rng)
        if all(n.display != display for n in e.names):
            kind = rng.choice([NameKind.SURFACE, NameKind.ALIAS])
            index.put(dataclasses.replace(e, names=e.names + (Name(display, kind, 99),)))
    elif choice == 2:
        index.put(dataclasses.replace(e, entity_type=rng.choice(TYPES)))
    elif choice == 3:
        index.put(dataclasses.replace(e, status=Status.CANONICAL))
    elif choice == 4:
        index.put(dataclasses.replace(e, status=Status.MERGED, names=()))
    else:
        index.discard(e.entity_id)


@pytest.mark.parametrize("seed", range(40))
def test_a_decision_said_to_stand_is_what_deciding_again_gives(seed: int) -> None:
    rng = random.Random(seed)
    index = NameIndex()
    index.load(random_world(rng, rng.randrange(5, 30)))
    verdicts = {True: 0, False: 0}
    ordinal = 1000
    for _ in range(80):
        mention, t = _a_mention(rng), rng.choice(TYPES)
        generation = index.generation
        before = decide(index, mention, t)
        for _ in range(rng.randrange(1, 5)):
            ordinal += 1
            _change(rng, index, ordinal)
        changed = index.changed_since(generation)
        assert changed is not None
        stands = still_stands(before, key(mention), changed)
        verdicts[stands] += 1
        if stands:
            again = decide(index, mention, t)
            assert _summary(index, again) == _summary(index, before), (seed, mention, t)
            # The decision's entities are the index's current ones, not older copies.
            assert all(index.get(c.entity.entity_id) is c.entity for c in before.candidates)
    assert verdicts[True] and verdicts[False]  # both verdicts were exercised


def test_the_journal_reaches_back_a_bounded_way() -> None:
    index = NameIndex()
    start = index.generation
    assert index.changed_since(start) == []
    for i in range(JOURNAL_LENGTH + 1):
        index.put(Entity(f"q{i}", "method", Status.CANONICAL, i + 1,
                         names=(Name(f"Quorbex {i}", NameKind.NAME, 0),)))
    assert index.changed_since(start) is None  # further back than remembered: decide again
    recent = index.changed_since(index.generation - 1)
    assert recent is not None and [k for keys in recent for k in keys] == [
        key(f"Quorbex {JOURNAL_LENGTH}")]
    index.discard(f"q{JOURNAL_LENGTH}")
    last = index.changed_since(index.generation - 1)
    assert last is not None and [k for keys in last for k in keys] == [
        key(f"Quorbex {JOURNAL_LENGTH}")]


def test_load_remembers_no_changes_before_it() -> None:
    index = NameIndex()
    start = index.generation
    index.load([Entity("q1", "method", Status.CANONICAL, 1,
                       names=(Name("Quorbex", NameKind.NAME, 0),))])
    assert index.changed_since(start) is None
    assert index.changed_since(index.generation) == []


def test_only_changes_that_could_touch_the_mention_overturn_it() -> None:
    index = NameIndex()
    index.put(Entity("q1", "method", Status.CANONICAL, 1,
                     names=(Name("Quorbex Lattice", NameKind.NAME, 0),)))
    exact = decide(index, "Quorbex Lattice", "method")
    new = decide(index, "Vextral Autoencoder", "method")
    g = index.generation
    index.put(Entity("q2", "method", Status.PROVISIONAL, 2,
                     names=(Name("Vextral Autoencodr", NameKind.NAME, 0),)))  # one edit away
    changed = index.changed_since(g)
    assert changed is not None
    assert still_stands(exact, key("Quorbex Lattice"), changed)  # decided at rule 1
    assert not still_stands(new, key("Vextral Autoencoder"), changed)  # rule 4 now finds q2
