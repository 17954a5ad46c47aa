"""NameIndex.placeholders_near against a scan of every entity.

SPEC: a placeholder is linked to every best-ranked candidate of its pair, "including candidates
that appear later". After a write, the service asks the index which live placeholders an entity
it changed may now be a candidate of, and re-decides only those pairs; a placeholder the index
forgets is never linked again. The index keeps that answer incrementally (placeholders' keys
counted, their pair keys' deletion variants filed), so here random sequences of writes - new
entities and placeholders sharing keys, names added, merges, discards - are checked after each
step against a scan: every placeholder an entity shares a key with (rules 1 to 3), or whose pair
key is one edit from one of its name or alias keys with both 6 characters or more (rule 4's
strong candidates: a weak one never makes or joins an ambiguous pair), must be among those
returned. A placeholder merged away is still its pair's (its pair's resolves follow the
redirect), so it is found by its pair's key.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from identity_server.domain import Entity, Name, NameKind, Status
from identity_server.index import MIN_TYPO_KEY, NameIndex
from identity_server.matching import STRONG_TYPO_KEY
from identity_server.normalize import key, one_edit_apart

# Spellings whose keys collide ("mercury" four times) or are one edit apart, at 7 and 6
# characters (strong typos) and at 5 and 4 (weak ones), and keys rule 4 never looks at.
SPELLINGS = ["Mercury", "MERCURY", "Mer-cury", "mer cury", "Mercurz", "Mercuri", "Saturn",
             "Satrun", "Saturm", "Venus", "venus", "Venuss", "Mars", "MARS", "Marz", "C#", "c.#"]
TYPES = ["person", "place", "other"]


def _anchor_keys(entity: Entity) -> set[str]:
    return {n.key for n in entity.names if n.kind is not NameKind.SURFACE}


def _pair_key(placeholder: Entity) -> str:
    return next(n.key for n in placeholder.names if n.kind is NameKind.NAME)


def _live(index: NameIndex) -> list[Entity]:
    return [e for e in index.entities() if e.status is not Status.MERGED]


def _placeholders(index: NameIndex, pairs: dict[str, str]) -> dict[str, set[str]]:
    """Every placeholder in the index, live or merged away, with the keys it is found by: a
    live one's names, a merged one's pair (`pairs`: each placeholder's name when made)."""
    return {p.entity_id: ({n.key for n in p.names} if p.status is not Status.MERGED
                          else {key(pairs[p.entity_id])})
            for p in index.entities() if p.placeholder}


def _expected(index: NameIndex, pairs: dict[str, str], entity: Entity, *,
              by_typo: bool) -> set[str]:
    """Placeholders, other than entity, it may be a candidate of, found by scanning."""
    found = set()
    for pid, keys in _placeholders(index, pairs).items():
        if pid == entity.entity_id:
            continue
        p = index.get(pid)
        assert p is not None
        if {n.key for n in entity.names} & keys:
            found.add(pid)
        elif by_typo:
            pair = _pair_key(p) if p.status is not Status.MERGED else next(iter(keys))
            if any(min(len(a), len(pair)) >= STRONG_TYPO_KEY and one_edit_apart(a, pair)
                   for a in _anchor_keys(entity)):
                found.add(p.entity_id)
    return found


def _step(rng: random.Random, index: NameIndex, pairs: dict[str, str], next_ordinal: int) -> int:
    """One random write (a placeholder made is noted in `pairs`); returns the next free
    ordinal."""
    live = _live(index)
    action = rng.random() if live else 0.0
    if action < 0.4:  # a new entity, often a placeholder
        display = rng.choice(SPELLINGS)
        placeholder = rng.random() < 0.5
        if placeholder:
            pairs[f"e{next_ordinal}"] = display
        index.put(Entity(f"e{next_ordinal}", rng.choice(TYPES), Status.PROVISIONAL
                         if placeholder or rng.random() < 0.5 else Status.CANONICAL,
                         next_ordinal, placeholder=placeholder,
                         names=(Name(display, NameKind.NAME, 0),)))
        return next_ordinal + 1
    entity = rng.choice(live)
    if action < 0.7:  # a name added (an alias, or a surface form)
        display = rng.choice(SPELLINGS)
        if not entity.has_display(display):
            kind = rng.choice([NameKind.ALIAS, NameKind.SURFACE])
            index.put(entity.with_name(Name(display, kind, entity.next_position())))
    elif action < 0.85:  # merged into another live entity (or left alone when none)
        others = [e for e in live if e.entity_id != entity.entity_id]
        if others:
            target = rng.choice(others)
            index.put(dataclasses.replace(entity, status=Status.MERGED,
                                          redirect_to=target.entity_id, names=()))
    else:
        index.discard(entity.entity_id)
    return next_ordinal


@pytest.mark.parametrize("seed", range(40))
def test_placeholders_near_finds_every_placeholder_an_entity_may_be_a_candidate_of(
    seed: int,
) -> None:
    rng = random.Random(seed)
    index = NameIndex()
    pairs: dict[str, str] = {}
    ordinal = 1
    for _ in range(60):
        ordinal = _step(rng, index, pairs, ordinal)
        for p in index.entities():
            if p.placeholder:
                assert index.pair_display(p) == pairs[p.entity_id]
        for entity in _live(index):
            for by_typo in (False, True):
                got = index.placeholders_near(entity, by_typo=by_typo)
                ids = {p.entity_id for p in got}
                expected = _expected(index, pairs, entity, by_typo=by_typo)
                assert expected <= ids, (seed, entity, by_typo)
                assert all(p.placeholder and p.entity_id != entity.entity_id for p in got)


def test_the_scan_sees_what_the_rules_do() -> None:
    """The spellings meet as intended: shared keys, one-edit pairs, keys too short for rule 4."""
    assert len({key(s) for s in SPELLINGS[:4]}) == 1
    assert one_edit_apart(key("Mercury"), key("Mercurz"))
    assert one_edit_apart(key("Saturn"), key("Satrun")) and len(key("Saturn")) == STRONG_TYPO_KEY
    assert one_edit_apart(key("Venus"), key("Venuss"))
    assert len(key("Mars")) == MIN_TYPO_KEY and len(key("C#")) < MIN_TYPO_KEY
