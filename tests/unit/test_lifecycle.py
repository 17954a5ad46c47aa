"""SPEC section 3 (and the writes of section 2's outcomes) through `identity_server.lifecycle`.

Pure and fast: domain values and a small in-memory NameIndex, no store, no server. Expectations
come from the SPEC text; where the code disagrees the test is xfail(strict=True) with the reason.
"""

from __future__ import annotations

import pytest

from identity_server.domain import RETIRED, Entity, MatchKind, Name, NameKind, NameRow, Status
from identity_server.index import NameIndex
from identity_server.lifecycle import (
    AUTHORITY,
    AUTHORITY_OVER_SURFACE,
    CURATOR,
    MERGE,
    PREVIOUS_NAME,
    ResolveWrites,
    import_merge_target,
    merge_rank,
    merge_refusal,
    merged_names,
    plan_resolve,
    promotable,
    promotion_due,
    reimported_names,
    takes_type,
    unique,
)
from identity_server.matching import Decision, Outcome, decide
from identity_server.normalize import display_form, key
from identity_server.service import Mention

CANON, PROV = Status.CANONICAL, Status.PROVISIONAL
ALIAS, SURFACE, NAME = NameKind.ALIAS.value, NameKind.SURFACE.value, NameKind.NAME.value


# -- helpers ---------------------------------------------------------------------------------------


def ent(eid: str, etype: str, name: str, *aliases: str, surfaces: tuple[str, ...] = (),
        status: Status = CANON, ordinal: int = 1, placeholder: bool = False) -> Entity:
    """An entity with its name (position 0), aliases, then surface forms, in recorded order."""
    names = [Name(name, NameKind.NAME, 0)]
    names += [Name(a, NameKind.ALIAS, i) for i, a in enumerate(aliases, 1)]
    names += [Name(s, NameKind.SURFACE, i) for i, s in enumerate(surfaces, len(aliases) + 1)]
    return Entity(eid, etype, status, ordinal, placeholder=placeholder, names=tuple(names))


def prov(eid: str, etype: str, name: str, *aliases: str, surfaces: tuple[str, ...] = (),
         ordinal: int = 1, placeholder: bool = False) -> Entity:
    return ent(eid, etype, name, *aliases, surfaces=surfaces, status=PROV, ordinal=ordinal,
               placeholder=placeholder)


def index_of(*entities: Entity) -> NameIndex:
    index = NameIndex()
    for e in entities:
        index.put(e)
    return index


def mention(text: str, etype: str) -> Mention:
    display = display_form(text)
    return Mention(display, etype, etype, key(display))


def plan(index: NameIndex, text: str, etype: str, *, context_id: str = "",
         placeholder: Entity | None = None) -> tuple[Decision, ResolveWrites]:
    m = mention(text, etype)
    d = decide(index, m.display, m.entity_type, m.key)
    return d, plan_resolve(d, m, context_id=context_id, placeholder=placeholder)


def row(display: str, kind: str, position: int, source: str = "") -> NameRow:
    return NameRow(display, kind, position, source)


def rows_of(*rows: NameRow) -> dict[str, NameRow]:
    return {r.display: r for r in rows}


ADA = ent("Q1", "person", "Ada Lovelace", "Countess of Lovelace", surfaces=("ADA LOVELACE",))


# -- 1. plan_resolve -------------------------------------------------------------------------------


def test_converged_exact_on_a_name_writes_nothing_without_a_context() -> None:
    d, w = plan(index_of(ADA), "Ada Lovelace", "person")
    assert d.outcome is Outcome.CONVERGED
    assert (w.entity, w.match_kind, w.matched_name) == (ADA, MatchKind.EXACT, "Ada Lovelace")
    assert not (w.surface_form or w.type_upgrade or w.placeholder or w.evidence or w.new_entity)
    assert w.link_to == ()
    assert w.writes_nothing


def test_converged_with_a_context_records_evidence_only() -> None:
    _, w = plan(index_of(ADA), "Ada Lovelace", "person", context_id="paper-1")
    assert w.evidence and not w.surface_form and not w.type_upgrade
    assert not w.writes_nothing


def test_converged_exact_through_an_alias_is_alias() -> None:
    _, w = plan(index_of(ADA), "Countess of Lovelace", "person")
    assert (w.match_kind, w.matched_name) == (MatchKind.ALIAS, "Countess of Lovelace")
    assert w.writes_nothing


def test_converged_exact_on_a_surface_form_records_nothing_new() -> None:
    _, w = plan(index_of(ADA), "ADA  LOVELACE", "person")  # same display form
    assert (w.match_kind, w.matched_name) == (MatchKind.EXACT, "ADA LOVELACE")
    assert not w.surface_form and w.writes_nothing


@pytest.mark.parametrize(("text", "kind"), [("ada lovelace", MatchKind.CASE),
                                            ("Ada-Lovelace", MatchKind.PUNCTUATION),
                                            ("Ada Lovelase", MatchKind.TYPO)])
def test_converged_on_a_new_spelling_records_a_surface_form(text: str, kind: MatchKind) -> None:
    d, w = plan(index_of(ADA), text, "person")
    assert d.outcome is Outcome.CONVERGED
    assert (w.entity, w.match_kind, w.matched_name) == (ADA, kind, "Ada Lovelace")
    assert w.surface_form and not w.type_upgrade and not w.writes_nothing


def test_alias_only_at_rule_2_is_alias_but_name_and_alias_together_is_case() -> None:
    _, w = plan(index_of(ADA), "COUNTESS OF LOVELACE", "person")
    assert (w.match_kind, w.matched_name, w.surface_form) == (
        MatchKind.ALIAS, "Countess of Lovelace", True)
    both = ent("Q2", "tool", "Mem Castle", "MEM CASTLE")
    _, w = plan(index_of(both), "mem castle", "tool")
    assert (w.match_kind, w.matched_name) == (MatchKind.CASE, "Mem Castle")


def test_a_typo_through_an_alias_stays_typo() -> None:
    _, w = plan(index_of(ADA), "Countess of Lovelase", "person")
    assert (w.match_kind, w.matched_name) == (MatchKind.TYPO, "Countess of Lovelace")


def test_a_provisional_other_takes_a_typed_mentions_type() -> None:
    castle = prov("prov_1", "other", "Mem Castle")
    _, w = plan(index_of(castle), "Mem Castle", "tool")
    assert (w.entity, w.type_upgrade, w.surface_form, w.writes_nothing) == (
        castle, True, False, False)
    _, w = plan(index_of(castle), "MemCastle", "tool")
    assert w.type_upgrade and w.surface_form


@pytest.mark.parametrize("entity", [
    ent("Q9", "other", "Mem Castle"),  # canonical: types belong to the authority
    prov("prov_1", "tool", "Mem Castle"),  # already typed
])
def test_no_type_upgrade_for_a_canonical_or_typed_entity(entity: Entity) -> None:
    _, w = plan(index_of(entity), "Mem Castle", "tool")
    assert w.entity == entity and not w.type_upgrade and w.writes_nothing


def test_no_type_upgrade_for_an_other_mention() -> None:
    _, w = plan(index_of(prov("prov_1", "other", "Mem Castle")), "Mem Castle", "other")
    assert not w.type_upgrade and w.writes_nothing


JORDAN_B = ent("B", "person", "Jordan", ordinal=1)
JORDAN_A = ent("A", "person", "Jordan", ordinal=2)
JORDAN_P = prov("prov_3", "person", "Jordan", ordinal=3)  # provisional: ranked below


def test_ambiguous_without_a_placeholder_creates_one_linked_to_the_best_ranked() -> None:
    d, w = plan(index_of(JORDAN_A, JORDAN_P, JORDAN_B), "Jordan", "person", context_id="p1")
    assert d.outcome is Outcome.AMBIGUOUS
    assert len(d.candidates) == 3  # the provisional one matched, but is not best-ranked
    assert w.entity is None and w.new_entity and w.placeholder
    assert w.link_to == ("B", "A")  # ties in creation order, not id or insertion order
    assert (w.match_kind, w.matched_name) == (MatchKind.AMBIGUOUS, "Jordan")
    assert w.evidence and not w.surface_form and not w.type_upgrade


def test_ambiguous_with_its_placeholder_returns_it_and_links_it() -> None:
    placeholder = prov("prov_4", "person", "Jordan", ordinal=4, placeholder=True)
    _, w = plan(index_of(JORDAN_A, JORDAN_P, JORDAN_B), "Jordan", "person",
                placeholder=placeholder)
    assert w.entity == placeholder and not w.new_entity and not w.placeholder
    assert (w.match_kind, w.link_to) == (MatchKind.AMBIGUOUS, ("B", "A"))
    assert not w.surface_form and not w.type_upgrade and not w.writes_nothing


def test_weak_typo_creates_a_new_entity_linked_to_the_candidate() -> None:
    mario = ent("Q5", "person", "Mario")
    d, w = plan(index_of(mario), "Maria", "person")
    assert d.outcome is Outcome.WEAK
    assert w.entity is None and w.new_entity and not w.placeholder
    assert (w.match_kind, w.link_to, w.matched_name) == (MatchKind.NEW, ("Q5",), "Mario")


def test_weak_short_key_at_rule_3_links_every_best_ranked_candidate() -> None:
    c1, c2 = ent("Q7", "tool", "AI", ordinal=1), ent("Q8", "tool", "a.i", ordinal=2)
    worse = prov("prov_9", "tool", "A I", ordinal=3)
    d, w = plan(index_of(worse, c2, c1), "A.I.", "tool")  # key "ai": 2 characters
    assert d.outcome is Outcome.WEAK
    assert w.entity is None and not w.placeholder
    assert (w.match_kind, w.link_to) == (MatchKind.NEW, ("Q7", "Q8"))


@pytest.mark.parametrize("text", ["Zebrafish", "Ado"])  # "Ado": 3-character key, no typo
def test_new_when_nothing_is_found(text: str) -> None:
    d, w = plan(index_of(ADA, ent("Q2", "person", "Ada")), text, "person", context_id="p")
    assert d.outcome is Outcome.NEW
    assert w.entity is None and not w.placeholder
    assert (w.match_kind, w.link_to, w.matched_name) == (MatchKind.NEW, (), "")
    assert w.evidence


# -- 2. type upgrade and promotion -----------------------------------------------------------------


def test_takes_type() -> None:
    assert takes_type(prov("p", "other", "X"), "tool")
    assert not takes_type(prov("p", "other", "X"), "other")
    assert not takes_type(prov("p", "person", "X"), "tool")
    assert not takes_type(ent("Q", "other", "X"), "tool")
    assert not takes_type(prov("p", "other", "X", placeholder=True), "tool")


def test_promotion() -> None:
    e = prov("p", "tool", "X")
    assert not promotable(e, 0) and not promotion_due(e, 1000, 0)  # 0: never automatically
    assert promotable(e, 3)
    assert [promotion_due(e, n, 3) for n in (0, 2, 3, 4)] == [False, False, True, True]
    assert promotion_due(e, 1, 1)
    for never in (prov("p", "tool", "X", placeholder=True), ent("Q", "tool", "X")):
        assert not promotable(never, 3) and not promotion_due(never, 10, 3)


# -- 3. and 4. merge preconditions and target ------------------------------------------------------


def test_merge_refusals() -> None:
    person, place = ent("Q1", "person", "Ada"), ent("Q2", "place", "Ada")
    p_person = prov("prov_1", "person", "Ada", ordinal=3)
    assert merge_refusal(person, person, distinct=False) is not None
    assert merge_refusal(p_person, place, distinct=False) is not None
    assert merge_refusal(place, person, distinct=False) is not None
    assert merge_refusal(person, p_person, distinct=False) is not None  # canonical into prov
    assert merge_refusal(p_person, person, distinct=True) is not None


@pytest.mark.parametrize(("source", "target"), [
    (prov("prov_1", "person", "Ada", ordinal=3), ent("Q1", "person", "Ada")),
    (ent("Q2", "person", "Ada", ordinal=2), ent("Q1", "person", "Ada")),
    (prov("prov_1", "other", "Ada", ordinal=3), ent("Q2", "place", "Ada")),
    (ent("Q3", "place", "Ada", ordinal=3), ent("Q4", "other", "Ada", ordinal=4)),
    (prov("prov_1", "person", "Ada", ordinal=3), prov("prov_2", "person", "Ada", ordinal=4)),
])
def test_allowed_merges(source: Entity, target: Entity) -> None:
    assert merge_refusal(source, target, distinct=False) is None


@pytest.mark.parametrize(("better", "worse"), [
    (ent("Q9", "tool", "X", ordinal=9), prov("prov_1", "tool", "X", ordinal=1)),
    (prov("prov_9", "tool", "X", ordinal=9), prov("prov_1", "tool", "X", ordinal=1,
                                                    placeholder=True)),
    (ent("Q9", "tool", "X", ordinal=9, placeholder=True), prov("prov_1", "tool", "X")),
    (prov("prov_3", "tool", "X", ordinal=3), prov("prov_5", "tool", "X", ordinal=5)),
    (ent("Q3", "tool", "X", ordinal=3), ent("Q5", "tool", "X", ordinal=5)),
])
def test_merge_rank_picks_the_target(better: Entity, worse: Entity) -> None:
    assert min((better, worse), key=merge_rank) is better
    assert min((worse, better), key=merge_rank) is better


# -- 5. merged_names -------------------------------------------------------------------------------

TARGET = rows_of(row("Ada Lovelace", NAME, 0, AUTHORITY), row("Countess", ALIAS, 1, AUTHORITY),
                 row("A. L.", ALIAS, 2, CURATOR), row("ADA LOVELACE", SURFACE, 7))


@pytest.mark.parametrize(("status", "name_becomes"), [(CANON, ALIAS), (PROV, SURFACE)])
def test_merged_names_kinds_and_positions(status: Status, name_becomes: str) -> None:
    source = ent("S", "person", "Ada King", "Augusta", "Byron",
                 surfaces=("ada king", "A King"), status=status, ordinal=5)
    moved, claimed = merged_names(source, TARGET)
    assert moved == [row("Ada King", name_becomes, 8, MERGE), row("Augusta", ALIAS, 9, MERGE),
                     row("Byron", ALIAS, 10, MERGE), row("ada king", SURFACE, 11, MERGE),
                     row("A King", SURFACE, 12, MERGE)]
    assert claimed == []


def test_merged_names_a_spelling_the_target_has_is_not_moved_again() -> None:
    source = ent("S", "person", "Ada Lovelace", "A. L.", surfaces=("ADA LOVELACE",))
    assert merged_names(source, TARGET) == ([], [])


def test_merged_names_a_target_surface_form_arriving_as_an_alias_becomes_an_alias() -> None:
    source = ent("S", "person", "ADA LOVELACE", "Other", status=PROV)  # provisional name
    moved, _ = merged_names(source, TARGET)
    assert moved == [row("Other", ALIAS, 8, MERGE)]  # the name stays a surface form
    source = ent("S", "person", "Ada King", "ADA LOVELACE")
    moved, _ = merged_names(source, TARGET)
    assert moved == [row("Ada King", ALIAS, 8, MERGE), row("ADA LOVELACE", ALIAS, 9, MERGE)]


def test_merged_names_claims_an_authority_alias_the_source_had_too() -> None:
    moved, claimed = merged_names(ent("S", "person", "Countess"), TARGET)  # canonical: alias
    assert moved == [] and claimed == [row("Countess", ALIAS, 1, MERGE)]
    moved, claimed = merged_names(prov("S", "person", "Countess"), TARGET)  # a surface form
    assert moved == [] and claimed == [row("Countess", ALIAS, 1, AUTHORITY_OVER_SURFACE)]
    # A curator's alias is the curator's already: nothing to claim.
    assert merged_names(ent("S", "person", "X", "A. L."), TARGET)[1] == []


def test_merged_names_a_retired_alias_of_the_target_is_moved_back() -> None:
    target = {**TARGET, "Old": row("Old", RETIRED, 3, AUTHORITY)}
    moved, _ = merged_names(ent("S", "person", "Old"), target)
    assert [(r.display, r.kind, r.source) for r in moved] == [("Old", ALIAS, MERGE)]
    assert moved[0].position > max(r.position for r in target.values())


# -- 6. reimported_names ---------------------------------------------------------------------------

AUTH_ROWS = rows_of(
    row("Ada Lovelace", NAME, 0, AUTHORITY), row("Countess of Lovelace", ALIAS, 1, AUTHORITY),
    row("Ada Byron", ALIAS, 2, AUTHORITY), row("Lady Ada", ALIAS, 3, CURATOR),
    row("A. K.", ALIAS, 4, MERGE), row("ada lovelace", SURFACE, 5))


def test_reimport_renames_adds_and_retires() -> None:
    changed = reimported_names(AUTH_ROWS, "Augusta Ada King",
                               ["Countess of Lovelace", "Enchantress", "Enchantress"])
    final = {**AUTH_ROWS, **changed}
    assert (final["Augusta Ada King"].kind, final["Augusta Ada King"].source) == (NAME, AUTHORITY)
    assert (final["Ada Lovelace"].kind, final["Ada Lovelace"].source) == (ALIAS, PREVIOUS_NAME)
    assert (final["Enchantress"].kind, final["Enchantress"].source) == (ALIAS, AUTHORITY)
    assert final["Ada Byron"].kind == RETIRED
    assert final["Countess of Lovelace"] == AUTH_ROWS["Countess of Lovelace"]
    for kept in ("Lady Ada", "A. K.", "ada lovelace"):
        assert final[kept] == AUTH_ROWS[kept]
    assert [n for n, r in final.items() if r.kind == NAME] == ["Augusta Ada King"]
    # Recorded now: after every name already recorded, each at its own position.
    new = [final[d].position for d in ("Augusta Ada King", "Ada Lovelace", "Enchantress")]
    assert min(new) > 5 and len(set(new)) == 3


def test_reimport_of_the_same_record_changes_nothing() -> None:
    assert reimported_names(AUTH_ROWS, "Ada Lovelace",
                            ["Countess of Lovelace", "Ada Byron"]) == {}


def test_reimport_an_alias_becoming_the_name() -> None:
    changed = reimported_names(AUTH_ROWS, "Countess of Lovelace", ["Ada Byron"])
    final = {**AUTH_ROWS, **changed}
    assert final["Countess of Lovelace"].kind == NAME
    assert (final["Ada Lovelace"].kind, final["Ada Lovelace"].source) == (ALIAS, PREVIOUS_NAME)
    assert final["Ada Byron"] == AUTH_ROWS["Ada Byron"]


def test_reimport_an_alias_over_a_surface_form_is_a_surface_form_again_once_dropped() -> None:
    first = {**AUTH_ROWS, **reimported_names(
        AUTH_ROWS, "Ada Lovelace", ["Countess of Lovelace", "Ada Byron", "ada lovelace"])}
    assert (first["ada lovelace"].kind, first["ada lovelace"].source) == (
        ALIAS, AUTHORITY_OVER_SURFACE)
    second = {**first, **reimported_names(first, "Ada Lovelace", ["Countess of Lovelace"])}
    assert second["ada lovelace"].kind == SURFACE
    assert second["Ada Byron"].kind == RETIRED


def test_reimport_listing_a_curators_alias_keeps_it_the_curators() -> None:
    first = {**AUTH_ROWS, **reimported_names(AUTH_ROWS, "Ada Lovelace", ["Lady Ada", "A. K."])}
    assert first["Lady Ada"] == AUTH_ROWS["Lady Ada"]
    assert first["A. K."] == AUTH_ROWS["A. K."]
    second = {**first, **reimported_names(first, "Ada Lovelace", [])}
    assert (second["Lady Ada"].kind, second["Lady Ada"].source) == (ALIAS, CURATOR)
    assert (second["A. K."].kind, second["A. K."].source) == (ALIAS, MERGE)


def test_reimport_keeps_a_previous_name_listed_then_dropped() -> None:
    renamed = {**AUTH_ROWS, **reimported_names(AUTH_ROWS, "Ada King", ["Ada Lovelace"])}
    dropped = {**renamed, **reimported_names(renamed, "Ada King", [])}
    assert dropped["Ada Lovelace"].kind == ALIAS


# -- 7. import_merge_target ------------------------------------------------------------------------


def test_import_merge_target() -> None:
    p = prov("prov_1", "person", "Ada Lovelace", ordinal=10)
    q1, q2 = ent("Q1", "person", "Ada Lovelace", ordinal=2), ent("Q2", "person", "X", ordinal=5)
    place, other = ent("Q3", "place", "X", ordinal=1), ent("Q4", "other", "X", ordinal=3)
    assert import_merge_target(p, [q1]) == [q1]
    assert import_merge_target(p, [place]) == []
    assert import_merge_target(p, [q2, place, other, q1]) == [q1, other, q2]  # oldest first
    assert import_merge_target(p, [q1, q1]) == [q1]
    assert import_merge_target(prov("prov_2", "other", "X"), [place]) == [place]
    assert import_merge_target(p, [prov("prov_3", "person", "X", ordinal=1)]) == []


@pytest.mark.parametrize("not_mergeable", [
    prov("prov_1", "person", "Ada", placeholder=True),
    ent("Q5", "person", "Ada", ordinal=9),
    Entity("prov_2", "person", Status.MERGED, 9, redirect_to="Q1"),
])
def test_import_merge_target_none_for_placeholders_and_non_provisional(
        not_mergeable: Entity) -> None:
    assert import_merge_target(not_mergeable, [ent("Q1", "person", "Ada")]) == []


# -- 8. unique -------------------------------------------------------------------------------------


def test_unique() -> None:
    assert unique(["b", "a", "b", "x", "c", "a"], exclude="x") == ["b", "a", "c"]
    assert unique([], exclude="x") == []
    assert unique(iter(["x", "x"]), exclude="x") == []
