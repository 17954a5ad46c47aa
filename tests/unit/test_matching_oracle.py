"""The fast matcher (index + matching.decide) against a scan that reads SPEC section 2 literally.

The reference below shares nothing with identity_server.matching or index: it walks every entity
and every name for each rule, ranks, and decides. Random worlds of realistic names (with case,
punctuation, spacing, alias, typo, digit and short-key perturbations) must get the same decision,
candidates (in order), best candidates and matched name from both.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest

from identity_server.core import Core, CoreUnavailable, load_core
from identity_server.domain import (
    DISPLAY_TABLE_FROM,
    OTHER,
    Entity,
    MatchKind,
    Mention,
    Name,
    NameKind,
    Status,
)
from identity_server.index import NameIndex
from identity_server.normalize import display_form, fold, key, one_edit_apart

TYPES = ["person", "method", "dataset", OTHER]
BASE_NAMES = [
    "Ada Lovelace", "Alan Turing", "Grace Hopper", "Maria", "Mario", "Marie Curie", "BERT",
    "ResNet-50", "ResNet 50", "Windows 10", "Windows 1.0", "Windows 11", "COVID-19", "C#", "C",
    "C++", "R", "Go", "GPT-3", "ImageNet", "Image Net", "MNIST", "CIFAR-10", "Mem-Castle",
    "MemCastle", "Transformer", "Transformers", "Graph Attention Network", "Adam", "Adams",
    "SQuAD v1.1", "SQuAD v2.0", "Straße", "Strasse", "café", "cafe", "LSTM", "Long Short-Term Memory",
]


def perturb(rng: random.Random, name: str) -> str:
    choice = rng.randrange(8)
    if choice == 0:
        return name.lower()
    if choice == 1:
        return name.upper()
    if choice == 2:
        return name.replace(" ", "-") if " " in name else name[:1] + "." + name[1:]
    if choice == 3:
        return name.replace(" ", "")
    if choice == 4 and len(name) > 2:  # delete a character
        i = rng.randrange(len(name))
        return name[:i] + name[i + 1 :] or name
    if choice == 5 and len(name) > 2:  # swap two neighbours
        i = rng.randrange(len(name) - 1)
        return name[:i] + name[i + 1] + name[i] + name[i + 2 :]
    if choice == 6:  # substitute a letter or digit
        i = rng.randrange(len(name))
        return name[:i] + rng.choice("aeiou19x") + name[i + 1 :]
    return f"  {name}\u200b "


# -- the reference: SPEC section 2, read literally ------------------------------------------------


@dataclass(frozen=True)
class RefDecision:
    outcome: str  # converged / ambiguous / weak / new
    kind: MatchKind
    candidates: tuple[str, ...]
    best: tuple[str, ...]
    matched_name: str


def ref_compatible(e: Entity, t: str) -> bool:
    if e.placeholder:
        return e.entity_type == t
    return e.entity_type == t or e.entity_type == OTHER or t == OTHER


def ref_rank(e: Entity, t: str) -> tuple[int, int]:
    return (0 if e.entity_type == t else 1, 0 if e.status is Status.CANONICAL else 1)


def ref_ordered(e: Entity) -> list[Name]:
    order = {NameKind.NAME: 0, NameKind.ALIAS: 1, NameKind.SURFACE: 2}
    return sorted(e.names, key=lambda n: (order[n.kind], n.position))


def ref_decide(entities: list[Entity], mention: str, t: str) -> RefDecision:
    d = display_form(mention)
    k = key(d)

    def rule(test: object, anchors_only: bool = False) -> list[tuple[Entity, list[Name]]]:
        found = []
        for e in entities:
            if e.status is Status.MERGED or not ref_compatible(e, t):
                continue
            names = [
                n for n in ref_ordered(e)
                if (not anchors_only or n.kind is not NameKind.SURFACE) and test(n)  # type: ignore[operator]
            ]
            if names:
                found.append((e, names))
        found.sort(key=lambda x: (ref_rank(x[0], t), x[0].ordinal))
        return found

    def result(found: list[tuple[Entity, list[Name]]], kind: MatchKind, weak: bool) -> RefDecision:
        top = ref_rank(found[0][0], t)
        best = [x for x in found if ref_rank(x[0], t) == top]
        ids = tuple(e.entity_id for e, _ in found)
        best_ids = tuple(e.entity_id for e, _ in best)
        matched = best[0][1][0].display
        if weak:
            return RefDecision("weak", MatchKind.NEW, ids, best_ids, matched)
        if len(best) > 1:
            return RefDecision("ambiguous", MatchKind.AMBIGUOUS, ids, best_ids, matched)
        if kind is not MatchKind.TYPO and all(n.kind is NameKind.ALIAS for n in best[0][1]):
            kind = MatchKind.ALIAS
        return RefDecision("converged", kind, ids, best_ids, matched)

    for test, kind in (
        (lambda n: n.display == d, MatchKind.EXACT),
        (lambda n: n.display.casefold() == d.casefold(), MatchKind.CASE),
    ):
        found = rule(test)
        if found:
            return result(found, kind, weak=False)
    found = rule(lambda n: key(n.display) == k)
    if found:
        return result(found, MatchKind.PUNCTUATION, weak=len(k) < 3)
    if len(k) >= 4:
        strong = rule(lambda n: min(len(k), len(key(n.display))) >= 6
                      and one_edit_apart(k, key(n.display)), anchors_only=True)
        if strong:
            return result(strong, MatchKind.TYPO, weak=False)
        weak = rule(lambda n: min(len(k), len(key(n.display))) >= 4
                    and one_edit_apart(k, key(n.display)), anchors_only=True)
        if weak:
            return result(weak, MatchKind.TYPO, weak=True)
    return RefDecision("new", MatchKind.NEW, (), (), "")


def _cores() -> list[Core]:
    """Every core this install has: each is held to the literal reading."""
    cores = [load_core("reference")]
    try:
        cores.append(load_core("compiled"))
    except CoreUnavailable:  # pragma: no cover - not built where the install ran
        pass
    return cores


CORES = _cores()


# -- random worlds --------------------------------------------------------------------------------


def random_world(rng: random.Random, size: int) -> list[Entity]:
    entities = []
    for ordinal in range(1, size + 1):
        name = display_form(perturb(rng, rng.choice(BASE_NAMES)) if rng.random() < 0.4
                            else rng.choice(BASE_NAMES))
        names = [Name(name, NameKind.NAME, 0)]
        for position in range(1, rng.randrange(1, 4)):
            extra = display_form(perturb(rng, rng.choice(BASE_NAMES)))
            if key(extra) and all(extra != n.display for n in names):
                names.append(Name(extra, rng.choice([NameKind.ALIAS, NameKind.SURFACE]), position))
        status = rng.choice([Status.CANONICAL, Status.PROVISIONAL, Status.PROVISIONAL])
        placeholder = status is Status.PROVISIONAL and rng.random() < 0.1
        entities.append(Entity(f"e{ordinal}", rng.choice(TYPES), status, ordinal,
                               placeholder=placeholder, names=tuple(names)))
    return entities


@pytest.mark.parametrize("seed", range(60))
def test_fast_matcher_agrees_with_the_literal_reading(seed: int) -> None:
    rng = random.Random(seed)
    entities = random_world(rng, rng.randrange(3, 25))
    index = NameIndex()
    if seed % 2:
        index.load(entities)  # the start-up path: typo variants packed
    else:
        index.put_many(entities)  # the running path: typo variants in the overlay
    _agree_on_random_mentions(rng, entities, index, 60, seed)


def _agree_on_random_mentions(rng: random.Random, entities: list[Entity], index: NameIndex,
                              count: int, world: int) -> None:
    """The fast matcher (through every core) and the reference decide `count` random mentions
    alike."""
    for _ in range(count):
        mention = perturb(rng, rng.choice(BASE_NAMES)) if rng.random() < 0.7 else rng.choice(BASE_NAMES)
        t = rng.choice(TYPES)
        if not key(display_form(mention)):
            continue
        expected = ref_decide(entities, mention, t)
        for core in CORES:
            display, k = core.normalize(mention)
            got = core.decide(index, Mention(display, t, t, k))
            actual = RefDecision(
                got.outcome.value,
                got.match_kind,
                tuple(c.entity.entity_id for c in got.candidates),
                tuple(c.entity.entity_id for c in got.best),
                got.best[0].matched_name if got.best else "",
            )
            assert actual == expected, f"{mention!r} ({t}) in world {world}, {core.name} core"


def test_the_oracle_itself_sees_the_spec_examples() -> None:
    """Guards the reference against being vacuous: the spec's own examples come out right."""
    world = [
        Entity("q1", "person", Status.CANONICAL, 1, names=(Name("Maria", NameKind.NAME, 0),)),
        Entity("q2", "tool", Status.CANONICAL, 2, names=(Name("Windows 10", NameKind.NAME, 0),)),
        Entity("q3", "tool", Status.CANONICAL, 3, names=(Name("Mem-Castle", NameKind.NAME, 0),)),
    ]
    assert ref_decide(world, "Mario", "person").outcome == "weak"
    assert ref_decide(world, "Windows 11", "tool").outcome == "new"
    assert ref_decide(world, "memcastle", "tool").kind is MatchKind.PUNCTUATION
    assert ref_decide(world, "MEM CASTLE", "other").candidates == ("q3",)
    assert fold("Straße") == "strasse"


@pytest.mark.parametrize("seed", range(6))
def test_much_mentioned_entities_match_as_the_literal_reading_says(seed: int) -> None:
    """Entities with hundreds of spellings (found by a table, not a scan, at rule 1; rule 4
    stops at their surface forms) decide exactly as the reference does."""
    rng = random.Random(1000 + seed)
    entities = random_world(rng, 8)
    for ordinal in (101, 102):
        base = rng.choice(BASE_NAMES)
        names = [Name(base, NameKind.NAME, 0)]
        seen = {base}
        while len(names) < DISPLAY_TABLE_FROM * 3:
            spelling = display_form(perturb(rng, rng.choice([base, *BASE_NAMES])))
            if key(spelling) and spelling not in seen:
                seen.add(spelling)
                kind = NameKind.ALIAS if rng.random() < 0.05 else NameKind.SURFACE
                names.append(Name(spelling, kind, len(names)))
        entities.append(Entity(f"e{ordinal}", rng.choice(TYPES), Status.CANONICAL, ordinal,
                               names=tuple(names)))
    index = NameIndex()
    index.put_many(entities)
    _agree_on_random_mentions(rng, entities, index, 150, seed)


@pytest.mark.parametrize("seed", range(4))
def test_much_mentioned_entities_grown_a_spelling_at_a_time_match_as_built_whole(
        seed: int) -> None:
    """Spellings added one at a time (`Entity.with_name` carries the display and casefold
    tables over to the next version; the index files only the new name) leave each version
    equal to the same entity built whole, the versions before untouched, and every decision
    the reference's."""
    rng = random.Random(2000 + seed)
    entities = random_world(rng, 8)
    index = NameIndex()
    index.put_many(entities)
    grown: list[Entity] = []
    for ordinal in (101, 102):
        base = rng.choice(BASE_NAMES)
        added = [Name(base, NameKind.NAME, 0)]
        e = Entity(f"e{ordinal}", rng.choice(TYPES), Status.CANONICAL, ordinal, names=(added[0],))
        index.put(e)
        while len(e.names) < DISPLAY_TABLE_FROM * 3:
            spelling = display_form(perturb(rng, rng.choice([base, *BASE_NAMES])))
            if not key(spelling) or e.has_display(spelling):
                continue
            kind = NameKind.ALIAS if rng.random() < 0.05 else NameKind.SURFACE
            # Mostly the next position, as recording does; sometimes an earlier one.
            position = (e.next_position() if rng.random() < 0.9
                        else rng.randrange(0, e.next_position()))
            before, name = e, Name(spelling, kind, position)
            e = e.with_name(name)
            added.append(name)
            index.put(e)
            whole = Entity(e.entity_id, e.entity_type, e.status, e.ordinal, names=tuple(added))
            assert e.names == whole.names
            assert e.next_position() == max(n.position for n in added) + 1
            assert not before.has_display(spelling) and e.with_display(spelling) == [name]
            assert name not in before.with_folded(fold(spelling))
            assert name in e.with_folded(fold(spelling))
            probe = rng.choice(added).display
            assert e.with_display(probe) == whole.with_display(probe)
            assert list(e.with_folded(fold(probe))) == list(whole.with_folded(fold(probe)))
            assert list(before.with_folded(fold(probe))) == [
                n for n in whole.with_folded(fold(probe)) if n in before.names]
            assert e.entity_id in index.with_key(name.key)
            assert set(e.name_keys()) == set(whole.name_keys())
        grown.append(e)
    _agree_on_random_mentions(rng, entities + grown, index, 150, seed)


def _spelled_entity(count: int) -> Entity:
    """An entity with `count` case forms of one name besides the name: large enough for tables."""
    base = "quorbex vextral"
    forms = ["".join(c.upper() if bits >> i & 1 else c for i, c in enumerate(base))
             for bits in range(1, count + 1)]
    return Entity("q9", "method", Status.PROVISIONAL, 9, names=(
        Name(base, NameKind.NAME, 0),
        *(Name(f, NameKind.SURFACE, i) for i, f in enumerate(forms, 1))))


def _sees(e: Entity, display: str) -> bool:
    """Whether e finds `display` among its names, by display form and by casefolded form."""
    by_display = e.has_display(display)
    by_folded = any(n.display == display for n in e.with_folded(fold(display)))
    assert by_display == by_folded
    return by_display


def test_versions_that_share_tables_each_see_their_own_names_and_a_branch_shares_none() -> None:
    """Versions made one spelling at a time share one set of tables; each sees exactly its
    own names. A version made from one that is no longer the newest (another spelling was
    added after it: a write that failed and was reloaded) must not add to them."""
    e = _spelled_entity(DISPLAY_TABLE_FROM + 10)
    assert not _sees(e, "QUORBEX VEXTRAL")  # builds both tables
    top = e.next_position()
    v1 = e.with_name(Name("QUORBEX VEXTRAL", NameKind.SURFACE, top))
    v2 = v1.with_name(Name("QUORBEX VEXTRAl", NameKind.SURFACE, top + 1))
    branch = v1.with_name(Name("QUORBEX VEXTRaL", NameKind.SURFACE, top + 1))  # v1 again
    assert [_sees(v, "QUORBEX VEXTRAL") for v in (e, v1, v2, branch)] == [
        False, True, True, True]
    assert [_sees(v, "QUORBEX VEXTRAl") for v in (e, v1, v2, branch)] == [
        False, False, True, False]
    assert [_sees(v, "QUORBEX VEXTRaL") for v in (e, v1, v2, branch)] == [
        False, False, False, True]
    assert branch.with_name(Name("QUORBEX VEXtRaL", NameKind.SURFACE, top + 2)).has_display(
        "QUORBEX VEXtRaL") and not v2.has_display("QUORBEX VEXtRaL")
    whole = Entity(v2.entity_id, v2.entity_type, v2.status, v2.ordinal, names=v2.names)
    probe = fold("quorbex vextral")
    assert list(v2.with_folded(probe)) == list(whole.with_folded(probe))
    assert len(v1.with_folded(probe)) == len(v2.with_folded(probe)) - 1 == len(v2.names) - 1


def test_an_older_version_building_a_table_does_not_hand_it_to_the_newer_one() -> None:
    """A reader still holding an older version may build a table the versions share; kept,
    it would lack the newer version's spelling, so it is not kept."""
    e = _spelled_entity(DISPLAY_TABLE_FROM + 10)
    assert not e.has_display("QUORBEX VEXTRAL")  # the display table only
    v1 = e.with_name(Name("QUORBEX VEXTRAL", NameKind.SURFACE, e.next_position()))
    assert list(e.with_folded(fold("QUORBEX VEXTRAL")))  # e builds the casefolded table
    assert "QUORBEX VEXTRAL" in [n.display for n in v1.with_folded(fold("QUORBEX VEXTRAL"))]
    assert "QUORBEX VEXTRAL" not in [n.display for n in e.with_folded(fold("QUORBEX VEXTRAL"))]


def test_readers_of_every_version_see_their_own_names_while_spellings_are_added() -> None:
    """Lock-free readers on other threads look up names in versions old and new while the
    writer adds spellings to the tables those versions share: each answer is its version's."""
    import sys
    import threading

    e = _spelled_entity(DISPLAY_TABLE_FROM + 10)
    versions = [e]
    spellings = []
    done = threading.Event()
    wrong: list[str] = []

    def read(seed: int) -> None:
        rng = random.Random(seed)
        while not done.is_set() or rng.random() < 0.5:
            v = rng.choice(versions)
            own = {n.display for n in v.names}
            for probe in rng.sample(spellings, min(3, len(spellings))):
                if v.has_display(probe) != (probe in own):
                    wrong.append(f"{probe!r} in a version of {len(v.names)} names")
            folded = [n.display for n in v.with_folded(fold("quorbex vextral"))]
            if folded != [n.display for n in v.names]:  # every name folds the same here
                wrong.append(f"casefold lookup of a version of {len(v.names)} names")

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # hand the GIL over often, inside the lookups too
    readers = [threading.Thread(target=read, args=(i,)) for i in range(3)]
    try:
        for t in readers:
            t.start()
        rng = random.Random(5)
        for _ in range(600):
            spelling = "".join(c.upper() if rng.random() < 0.5 else c for c in "quorbex vextral")
            if versions[-1].has_display(spelling):
                continue
            spellings.append(spelling)
            versions.append(versions[-1].with_name(
                Name(spelling, NameKind.SURFACE, versions[-1].next_position())))
    finally:
        done.set()
        for t in readers:
            t.join()
        sys.setswitchinterval(switch)
    assert len(versions) > 50 and not wrong, wrong[:5]


def test_an_entity_finds_its_names_by_display_form_with_or_without_a_table() -> None:
    many = tuple(Name(f"Quorbex {i}", NameKind.SURFACE, i) for i in range(1, DISPLAY_TABLE_FROM + 5))
    for names in (many[:3], many):
        e = Entity("q1", "method", Status.CANONICAL, 1,
                   names=(Name("Quorbex", NameKind.NAME, 0), *names))
        assert e.with_display("Quorbex 2") == [many[1]] and e.has_display("Quorbex 2")
        assert e.with_display("Quorbex 999") == [] and not e.has_display("Quorbex 999")
        # A new version of the entity answers for its own names, not its predecessor's table.
        grown = dataclasses.replace(e, names=e.names + (Name("Quorbex 999", NameKind.SURFACE, 999),))
        assert grown.has_display("Quorbex 999") and not e.has_display("Quorbex 999")
    twice = Entity("q2", "method", Status.CANONICAL, 2, names=(
        Name("Vextral", NameKind.NAME, 0), Name("Vextral", NameKind.ALIAS, 1), *many))
    assert twice.with_display("Vextral") == [twice.names[0], twice.names[1]]


@pytest.mark.parametrize("names", [
    (),
    (Name("Graph Attention", NameKind.NAME, 0),),
    (Name("gat", NameKind.SURFACE, 4), Name("Graph Attention", NameKind.NAME, 0),
     Name("GAT", NameKind.ALIAS, 2), Name("G.A.T.", NameKind.SURFACE, 3)),
])
def test_an_entity_loaded_at_start_up_is_the_one_the_constructor_builds(
        names: tuple[Name, ...]) -> None:
    """`Entity.loaded` sets the slots itself (start-up's faster path): every field, the ones
    `__init__` leaves to their defaults included, must come out as `Entity(...)` makes them."""
    args = ("prov_7", "method", Status.PROVISIONAL, 7, True, "prov_9", names)
    built, loaded = Entity(*args), Entity.loaded(*args)
    for f in dataclasses.fields(Entity):
        assert getattr(loaded, f.name) == getattr(built, f.name), f.name
    assert [n.kind for n in loaded.names] == sorted(
        (n.kind for n in names), key=[NameKind.NAME, NameKind.ALIAS, NameKind.SURFACE].index)
    assert loaded.with_name(Name("gat2", NameKind.SURFACE, 9)).names[-1].display == "gat2"
