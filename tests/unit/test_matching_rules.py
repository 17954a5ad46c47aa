"""SPEC section 2 (the contract of Resolve) and section 3 (lifecycle), through IdentityService.

Each test names the spec sentence it checks. Expectations are worked out from the spec; where the
code disagrees the test is marked xfail(strict=True) with the disagreement in its reason.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from identity_server.domain import MatchKind, Status
from identity_server.errors import EntityNotFound, FailedPrecondition, InvalidArgument
from identity_server.importing import AuthorityImport
from identity_server.server import build_service
from identity_server.service import EntityView, IdentityService, ItemError, ResolveResult
from identity_server.settings import Settings

EXACT, CASE, PUNCT = MatchKind.EXACT, MatchKind.CASE, MatchKind.PUNCTUATION
ALIAS, TYPO, AMBIG, NEW = MatchKind.ALIAS, MatchKind.TYPO, MatchKind.AMBIGUOUS, MatchKind.NEW


# -- helpers ---------------------------------------------------------------------------------------


def rec(eid: str, name: str, etype: str, *aliases: str) -> str:
    """One authority record as a JSON line."""
    return json.dumps({"id": eid, "name": name, "type": etype, "aliases": list(aliases)})


def load(service: IdentityService, *lines: str) -> None:
    """Import authority lines that must all be accepted."""
    report = service.import_lines(list(lines))
    assert report.errors == (), report.errors


def links(service: IdentityService) -> set[frozenset[str]]:
    """The open possibly_same_as links, as unordered pairs."""
    rows, _ = service.list_links(page_size=1000)
    return {frozenset((r.a, r.b)) for r in rows}


def pair(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def new_id(service: IdentityService, mention: str, etype: str, **kw: Any) -> str:
    """Resolve a mention that must create a new provisional entity; return its id."""
    r = service.resolve(mention, etype, **kw)
    assert r.created and r.match_kind in (NEW, AMBIG), r
    return r.entity_id


def snapshot(service: IdentityService, ids: list[str]) -> tuple[Any, ...]:
    """Everything a write could change: the change feed, the entities, the open links."""
    return (service.list_changes(0), [service.get_entity(i) for i in ids], links(service))


@pytest.fixture
def make_service(tmp_path: Path) -> Iterator[Callable[..., IdentityService]]:
    """Build extra services on their own SQLite files (strict mode, promotion, a second db)."""
    made: list[IdentityService] = []

    def make(name: str, **settings: Any) -> IdentityService:
        svc = build_service(Settings(db_url=f"sqlite:///{tmp_path / name}.sqlite", **settings))
        made.append(svc)
        return svc

    yield make
    for svc in made:
        svc.close()


# -- rules 1 to 4, converged: one table ------------------------------------------------------------

AUTHORITY = [
    rec("Q1", "Ada Lovelace", "person"),
    rec("Q2", "MemCastle", "tool", "Mem Castle", "MC-Store"),
    rec("Q3", "Analytical Engine", "tool", "The Engine"),
]

CONVERGED_CASES: list[tuple[str, str, str, str, MatchKind, str]] = [
    # (id, mention, type, expected entity, kind, matched_name)
    ("exact-name", "Ada Lovelace", "person", "Q1", EXACT, "Ada Lovelace"),
    ("exact-via-nfkc-fullwidth", "\uff21da Lovelace", "person", "Q1", EXACT, "Ada Lovelace"),
    ("exact-via-zero-width", "Ada\u200b Love\u200dlace", "person", "Q1", EXACT, "Ada Lovelace"),
    ("exact-via-bidi-control", "\u202eAda Lovelace\u202c", "person", "Q1", EXACT, "Ada Lovelace"),
    ("exact-via-white-space", " Ada\t\u00a0Lovelace\n", "person", "Q1", EXACT, "Ada Lovelace"),
    ("exact-mention-typed-other", "Ada Lovelace", "other", "Q1", EXACT, "Ada Lovelace"),
    ("exact-mention-untyped", "Ada Lovelace", "", "Q1", EXACT, "Ada Lovelace"),
    ("case", "ADA LOVELACE", "person", "Q1", CASE, "Ada Lovelace"),
    ("punctuation-hyphen", "Ada-Lovelace", "person", "Q1", PUNCT, "Ada Lovelace"),
    ("punctuation-no-space", "adalovelace", "person", "Q1", PUNCT, "Ada Lovelace"),
    ("punctuation-dots", "Ada. Lovelace.", "person", "Q1", PUNCT, "Ada Lovelace"),
    ("exact-name-not-alias", "MemCastle", "tool", "Q2", EXACT, "MemCastle"),
    ("alias-exact", "Mem Castle", "tool", "Q2", ALIAS, "Mem Castle"),
    ("alias-case", "MEM CASTLE", "tool", "Q2", ALIAS, "Mem Castle"),
    ("alias-punctuation", "mc store", "tool", "Q2", ALIAS, "MC-Store"),
    ("punctuation-name-and-alias-is-not-alias", "mem-castle", "tool", "Q2", PUNCT, "MemCastle"),
    ("alias-exact-second-entity", "The Engine", "tool", "Q3", ALIAS, "The Engine"),
    ("alias-case-second-entity", "the engine", "other", "Q3", ALIAS, "The Engine"),
    ("alias-punctuation-second-entity", "The-Engine", "tool", "Q3", ALIAS, "The Engine"),
    ("typo-name", "Analytical Engin", "tool", "Q3", TYPO, "Analytical Engine"),
    ("typo-swap", "Analyitcal Engine", "tool", "Q3", TYPO, "Analytical Engine"),
    ("typo-alias-is-not-alias-kind", "The Engien", "tool", "Q3", TYPO, "The Engine"),
    ("typo-name-and-alias-name-first", "Mem Castel", "tool", "Q2", TYPO, "MemCastle"),
    ("typo-after-case-and-punct", "ADA-LOVELASE", "person", "Q1", TYPO, "Ada Lovelace"),
]


@pytest.mark.parametrize(("mention", "etype", "expected", "kind", "matched"),
                         [c[1:] for c in CONVERGED_CASES], ids=[c[0] for c in CONVERGED_CASES])
def test_rules_converge(service: IdentityService, mention: str, etype: str, expected: str,
                        kind: MatchKind, matched: str) -> None:
    """Rules 1-4 and 'ALIAS instead of EXACT, CASE or PUNCTUATION when every name of the entity
    that matched at that rule is an alias (TYPO is never replaced)'."""
    load(service, *AUTHORITY)
    r = service.resolve(mention, etype)
    assert (r.entity_id, r.match_kind, r.matched_name) == (expected, kind, matched)
    assert r.created is False
    assert r.status is Status.CANONICAL
    assert r.candidates == (expected,)
    assert r.possibly_same_as == ()


def test_candidates_are_entities_not_names(service: IdentityService) -> None:
    """'one entity matched through two of its names is one candidate'."""
    load(service, rec("Q2", "MemCastle", "tool", "Mem Castle", "Mem_Castle"))
    r = service.resolve("MEM-CASTLE", "tool")
    assert (r.entity_id, r.match_kind, r.candidates) == ("Q2", PUNCT, ("Q2",))


def test_alias_only_when_no_surface_form_also_matched(service: IdentityService) -> None:
    """ALIAS only 'when every name of the entity that matched at that rule is an alias'; a
    surface form matching too makes it CASE, and matched_name lists aliases before surfaces."""
    load(service, rec("Q3", "Analytical Engine", "tool", "The Engine"))
    first = service.resolve("THE ENGINE", "tool")
    assert (first.entity_id, first.match_kind) == ("Q3", ALIAS)
    assert service.get_entity("Q3").surface_forms == ("THE ENGINE",)
    again = service.resolve("THE ENGINE", "tool")
    assert (again.match_kind, again.matched_name) == (EXACT, "THE ENGINE")
    both = service.resolve("the engine", "tool")
    assert (both.entity_id, both.match_kind, both.matched_name) == ("Q3", CASE, "The Engine")


# -- rule 3 and rule 4 thresholds, weak outcomes ---------------------------------------------------

PAIR_CASES: list[tuple[str, str, str, str, MatchKind, bool]] = [
    # (id, first mention, second mention, type, kind of the second, second is weak-linked)
    ("weak-typo-5-mario-maria", "Mario", "Maria", "person", NEW, True),
    ("weak-typo-4-java-jawa", "Java", "Jawa", "tool", NEW, True),
    ("weak-typo-shorter-5", "Mario", "Marios", "person", NEW, True),
    ("weak-typo-shorter-5-reverse", "Marios", "Mario", "person", NEW, True),
    ("weak-typo-4-with-punct", "J.A.V.A.", "jawa", "tool", NEW, True),
    ("strong-typo-6", "Marion", "Marios", "person", TYPO, False),
    ("strong-typo-6-swap", "Python", "Pyhton", "tool", TYPO, False),
    ("no-typo-key-3", "Bob", "Bib", "person", NEW, False),
    ("no-typo-shorter-3-insert", "Bob", "Bobs", "person", NEW, False),
    ("no-typo-shorter-3-delete", "Bobs", "Bob", "person", NEW, False),
    ("no-typo-digit-windows", "Windows 10", "Windows 11", "tool", NEW, False),
    ("no-typo-digit-dot", "Windows 1.0", "Windows 10", "tool", NEW, False),
    ("no-typo-digit-covid", "COVID-19", "COVID-18", "concept", NEW, False),
    ("no-typo-two-edits", "Transformer", "Tranformerz", "method", NEW, False),
    ("punctuation-key-3", "C++", "c + +", "tool", PUNCT, False),
    ("case-key-1", "C", "c", "tool", CASE, False),
    ("weak-punctuation-key-2", "C#", "C #", "tool", NEW, True),
    ("weak-punctuation-key-1", "C", "C.", "tool", NEW, True),
    ("c-sharp-is-not-c", "C#", "C", "tool", NEW, False),
    ("c-is-not-c-sharp", "C", "C#", "tool", NEW, False),
]


@pytest.mark.parametrize(("first", "second", "etype", "kind", "weak"),
                         [c[1:] for c in PAIR_CASES], ids=[c[0] for c in PAIR_CASES])
def test_thresholds_and_weak_outcomes(service: IdentityService, first: str, second: str,
                                      etype: str, kind: MatchKind, weak: bool) -> None:
    """Rule 3 needs a key of 3+, rule 4 a shorter key of 6+; 'weak: rule 3 found candidates but
    the key has fewer than 3 characters, or one edit separates keys whose shorter one has 4 or 5
    characters ... A new provisional entity is created, kind NEW, linked possibly_same_as to every
    best-ranked candidate'; 'Keys shorter than 4 characters get no typo candidates at all'."""
    a = new_id(service, first, etype)
    r = service.resolve(second, etype)
    assert r.match_kind is kind
    if kind is NEW:
        assert r.created and r.entity_id != a
        assert r.status is Status.PROVISIONAL
        if weak:
            assert r.matched_name == service.get_entity(a).name
            assert r.candidates == (a,)
            assert r.possibly_same_as == (a,)
            assert links(service) == {pair(a, r.entity_id)}
        else:
            assert r.candidates == ()
            assert r.possibly_same_as == ()
            assert links(service) == set()
    else:
        assert (r.entity_id, r.created, r.candidates) == (a, False, (a,))
        assert links(service) == set()


def test_weak_links_only_the_best_ranked(service: IdentityService) -> None:
    """Weak: 'linked possibly_same_as to every best-ranked candidate of that rule'; the reply
    still names all the rule's candidates, best rank first."""
    load(service, rec("QO", "C!", "other"), rec("QT", "C", "tool"))
    r = service.resolve("C.", "tool")
    assert (r.match_kind, r.created) == (NEW, True)
    assert r.candidates == ("QT", "QO")
    assert r.possibly_same_as == ("QT",)
    assert links(service) == {pair(r.entity_id, "QT")}


def test_strong_typo_outranks_weak(service: IdentityService) -> None:
    """'a pair whose shorter key has 6+ characters always outranks a pair with a shorter key:
    weak candidates count only when there is no strong one' - even a canonical weak one."""
    load(service, rec("QM", "Mario", "person"))
    marion = service.resolve("Marion", "person")  # weak against Mario: new, linked
    assert marion.match_kind is NEW
    r = service.resolve("Marios", "person")
    assert (r.entity_id, r.match_kind, r.created) == (marion.entity_id, TYPO, False)
    assert r.candidates == (marion.entity_id,)
    assert r.possibly_same_as == ()


def test_typo_never_through_surface_forms(service: IdentityService) -> None:
    """Rule 4 compares 'the entity's name and aliases, never surface forms (so typos cannot
    drift)'."""
    load(service, rec("QT", "Transformer", "method"))
    first = service.resolve("Transfomer", "method")
    assert (first.entity_id, first.match_kind) == ("QT", TYPO)
    assert service.get_entity("QT").surface_forms == ("Transfomer",)
    drift = service.resolve("Transfomerr", "method")  # one edit from the surface form only
    assert (drift.match_kind, drift.created, drift.candidates) == (NEW, True, ())


def test_provisional_name_is_a_typo_anchor(service: IdentityService) -> None:
    """Rule 4 compares 'the entity's name': a provisional entity's name counts."""
    p = new_id(service, "Quantum Annealing", "method")
    r = service.resolve("Quantum Anealing", "method")
    assert (r.entity_id, r.match_kind, r.matched_name) == (p, TYPO, "Quantum Annealing")


# -- rule order and ranking ------------------------------------------------------------------------


def test_first_rule_with_a_compatible_candidate_decides(service: IdentityService) -> None:
    """'the first rule that finds any compatible candidate decides, even if a later rule would
    find a better-ranked one'."""
    load(service, rec("Q1", "Ada Lovelace", "person"))
    p = new_id(service, "ada lovelace", "place")  # Q1 is a person: incompatible with place
    r = service.resolve("ada lovelace", "other")  # rule 1: p; rule 2 would find canonical Q1
    assert (r.entity_id, r.match_kind, r.candidates) == (p, EXACT, (p,))


def test_incompatible_candidates_do_not_decide(service: IdentityService) -> None:
    """A rule decides only with a *compatible* candidate: an incompatible exact match is skipped."""
    load(service, rec("QP", "Jordan", "place"), rec("QH", "JORDAN", "person"))
    r = service.resolve("Jordan", "person")
    assert (r.entity_id, r.match_kind, r.candidates) == ("QH", CASE, ("QH",))


def _ranking_world(service: IdentityService) -> tuple[str, str]:
    """B1 (canonical other), A1 (canonical method), then provisional P (method) and O (other),
    all four holding the name or alias 'Kappa Model'; created in that order."""
    load(service, rec("B1", "Kappa Model", "other"))
    load(service, rec("A1", "Kappa Model", "method"))
    p = new_id(service, "Zeta Construct", "method")
    o = new_id(service, "Omega Widget", "other")
    service.add_alias(p, "Kappa Model")
    service.add_alias(o, "Kappa Model")
    return p, o


def test_ranking_type_then_status(service: IdentityService) -> None:
    """'ranked by (1) type: equals the mention's type ... before a match through other; then
    (2) status: canonical before provisional'; the reply names the rule's candidates best first."""
    p, o = _ranking_world(service)
    r = service.resolve("Kappa Model", "method")
    assert (r.entity_id, r.match_kind, r.matched_name) == ("A1", EXACT, "Kappa Model")
    assert r.candidates == ("A1", p, "B1", o)


def test_ranking_both_other_counts_as_equal(service: IdentityService) -> None:
    """'(both other counts as equal)': an `other` mention prefers `other` entities."""
    p, o = _ranking_world(service)
    r = service.resolve("Kappa Model", "other")
    assert (r.entity_id, r.match_kind) == ("B1", EXACT)
    assert r.candidates == ("B1", o, "A1", p)


def test_ranking_ties_in_creation_order(service: IdentityService) -> None:
    """'best rank first, ties in creation order' (not id order)."""
    load(service, rec("Z9", "Lambda Net", "method"), rec("A0", "Lambda Net", "method"))
    load(service, rec("M5", "Lambda Net", "method"))
    r = service.resolve("Lambda Net", "method")
    assert r.match_kind is AMBIG
    assert r.candidates == ("Z9", "A0", "M5")


# -- ambiguity and placeholders --------------------------------------------------------------------


def test_ambiguous_pair_has_one_placeholder(service: IdentityService) -> None:
    """'Each ambiguous (display form, type) pair has exactly one placeholder ... linked
    possibly_same_as to every best-ranked candidate. Every ambiguous resolve of the pair returns
    its placeholder ... with kind AMBIGUOUS. The placeholder has the pair's type.'"""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    r1 = service.resolve("John Smith", "person")
    assert (r1.match_kind, r1.created, r1.status) == (AMBIG, True, Status.PROVISIONAL)
    assert r1.candidates == ("J1", "J2")
    assert set(r1.possibly_same_as) == {"J1", "J2"}
    assert (r1.name, r1.entity_type) == ("John Smith", "person")
    ph = service.get_entity(r1.entity_id)
    assert (ph.placeholder, ph.entity_type, ph.name) == (True, "person", "John Smith")
    assert links(service) == {pair(ph.entity_id, "J1"), pair(ph.entity_id, "J2")}
    r2 = service.resolve("John Smith", "person")
    assert (r2.entity_id, r2.match_kind, r2.created) == (r1.entity_id, AMBIG, False)
    assert r2.candidates == ("J1", "J2", r1.entity_id)


def test_placeholder_found_alone_at_rule_1_converges_exact(service: IdentityService) -> None:
    """'Once it exists, a later call often finds the placeholder alone at rule 1 and converges on
    it with EXACT; that is expected.'"""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    r1 = service.resolve("john smith", "person")  # ambiguous at rule 2
    assert (r1.match_kind, r1.created) == (AMBIG, True)
    r2 = service.resolve("john smith", "person")
    assert (r2.entity_id, r2.match_kind, r2.created) == (r1.entity_id, EXACT, False)
    assert r2.candidates == (r1.entity_id,)


def test_a_repeated_ambiguous_resolve_names_the_links_that_already_exist(
        service: IdentityService) -> None:
    """A reply's possibly_same_as lists the best candidates its entity is linked to 'whether the
    link is new or already existed'; a pair a curator called distinct is left out (the proto)."""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    first = service.resolve("John Smith", "person")  # ambiguous at rule 1: a placeholder
    ph = first.entity_id
    assert (first.match_kind, first.created, first.possibly_same_as) == (AMBIG, True, ("J1", "J2"))
    again = service.resolve("John Smith", "person")  # the canonicals still outrank it
    assert (again.entity_id, again.match_kind, again.created) == (ph, AMBIG, False)
    assert again.possibly_same_as == ("J1", "J2")
    service.settle(ph, "J1", "distinct", actor="curator", reason="another John Smith")
    after = service.resolve("John Smith", "person")
    assert (after.entity_id, after.match_kind, after.possibly_same_as) == (ph, AMBIG, ("J2",))


def test_placeholder_linked_to_candidates_that_appear_later(service: IdentityService) -> None:
    """Linked 'to every best-ranked candidate ..., including candidates that appear later';
    placeholders are never 'merged on import'."""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = service.resolve("John Smith", "person").entity_id
    load(service, rec("J3", "John Smith", "person"))
    assert service.get_entity(ph).status is Status.PROVISIONAL
    r = service.resolve("John Smith", "person")
    assert (r.entity_id, r.match_kind, r.created) == (ph, AMBIG, False)
    assert r.candidates == ("J1", "J2", "J3", ph)
    assert links(service) == {pair(ph, "J1"), pair(ph, "J2"), pair(ph, "J3")}


def test_placeholder_linked_to_a_later_candidate_it_no_longer_meets(
        service: IdentityService) -> None:
    """Once a placeholder exists, its pair finds it alone at rule 1; a candidate that appears
    later (here: imported) is still linked, as soon as it appears, and a pair a curator
    called distinct is not proposed again."""
    load(service, rec("Q40", "Higgs boson", "concept"), rec("Q41", "Higgs Boson", "concept"))
    r = service.resolve("HIGGS BOSON", "concept")  # ambiguous at rule 2
    ph = r.entity_id
    assert (r.match_kind, set(r.possibly_same_as)) == (AMBIG, {"Q40", "Q41"})
    service.settle(ph, "Q40", "distinct", actor="curator", reason="not the particle page")
    load(service, rec("Q42", "higgs boson", "concept"), rec("Q43", "Higgs boson", "place"))
    assert links(service) == {pair(ph, "Q41"), pair(ph, "Q42")}  # Q43: another type
    again = service.resolve("HIGGS BOSON", "concept")
    assert (again.entity_id, again.match_kind, again.candidates) == (ph, EXACT, (ph,))
    assert links(service) == {pair(ph, "Q41"), pair(ph, "Q42")}


def test_placeholder_linked_to_an_entity_that_becomes_a_candidate(
        service: IdentityService) -> None:
    """A candidate can also appear by taking a name (an alias added by a curator)."""
    load(service, rec("J1", "Jane Roe", "person"), rec("J2", "Jane Roe", "person"),
         rec("J3", "J. Roe", "person"))
    ph = service.resolve("JANE ROE", "person").entity_id
    service.add_alias("J3", "jane roe")
    assert links(service) == {pair(ph, "J1"), pair(ph, "J2"), pair(ph, "J3")}


def test_placeholder_linked_to_a_later_candidate_one_typo_away(service: IdentityService) -> None:
    """'including candidates that appear later' holds at rule 4 too: an entity that appears
    (imported) or takes an alias one edit from an ambiguous pair's key is linked as it does,
    with no further resolve of the pair; a name two edits away, or of another type, is not."""
    load(service, rec("M1", "Maria Gendor", "person"), rec("M2", "Maria Gendorf", "person"),
         rec("M3", "Ada Byron", "person"))
    r = service.resolve("Maria Gendorr", "person")
    ph = r.entity_id
    assert (r.match_kind, r.candidates) == (AMBIG, ("M1", "M2"))
    load(service, rec("M4", "Maria Gendorx", "person"), rec("M5", "Maria Gendoxx", "person"),
         rec("M6", "Maria Gendorx", "place"))
    assert links(service) == {pair(ph, "M1"), pair(ph, "M2"), pair(ph, "M4")}
    service.add_alias("M3", "maria-gendorry")
    assert links(service) == {pair(ph, "M1"), pair(ph, "M2"), pair(ph, "M4"), pair(ph, "M3")}
    r = service.resolve("Maria Gendorr", "person")
    assert (r.entity_id, r.match_kind) == (ph, EXACT)


def test_a_new_placeholder_is_linked_as_a_later_candidate_of_another_pair(
        service: IdentityService) -> None:
    """A placeholder is a candidate like any entity of its type: a pair whose best candidate
    is now another pair's new placeholder gets linked to it as that placeholder appears, not at
    some later write that happens to touch the key."""
    task = new_id(service, "Foo Bar Net", "task")
    dataset = new_id(service, "Foo Bar Net", "dataset")
    first = service.resolve("foo bar net", "other")  # rule 2: both, through `other`
    assert (first.match_kind, set(first.possibly_same_as)) == (AMBIG, {task, dataset})
    second = service.resolve("Foo Bar Net", "other")  # rule 1: both again; a second pair
    assert (second.match_kind, second.created) == (AMBIG, True)
    # Decided again without its placeholder, the first pair now finds the second placeholder
    # alone in the first rank (type equal) at rule 2: its best candidate.
    assert pair(first.entity_id, second.entity_id) in links(service)


def test_placeholder_linked_to_a_candidate_that_becomes_best_when_the_best_is_merged_away(
        service: IdentityService) -> None:
    """A candidate that was outranked becomes best-ranked when the ones above it are merged
    into an entity that is no candidate of the pair (a provisional source's name becomes a
    surface form, never a typo anchor): linked then too (found by the model-based test)."""
    s1 = new_id(service, "Sequoia", "other")
    s2 = new_id(service, "Sequoiaxy", "other")  # two edits from Sequoia: an entity of its own
    r = service.resolve("Sequoiax", "other")  # rule 4: one edit from both, equal rank
    ph = r.entity_id
    assert (r.match_kind, set(r.possibly_same_as)) == (AMBIG, {s1, s2})
    load(service, rec("Q1", "Sequoiay", "person"))  # a candidate too, through `other`: outranked
    assert links(service) == {pair(ph, s1), pair(ph, s2)}
    target = new_id(service, "Redwood", "other")
    service.merge(s1, target)
    service.merge(s2, target)  # the pair's candidates now: Q1 alone
    assert links(service) == {pair(ph, target), pair(ph, "Q1")}  # the first two moved


def test_placeholder_linked_to_a_candidate_that_becomes_best_when_a_reimport_retires_names(
        service: IdentityService) -> None:
    """The same when a re-import retires the authority aliases that made the best candidates."""
    load(service, rec("Q1", "Alpha One", "person", "Jaguar"),
         rec("Q2", "Alpha Two", "person", "Jaguar"), rec("Q3", "Jaguar", "other"))
    r = service.resolve("Jaguar", "person")  # rule 1: Q1, Q2 rank first; Q3 through `other`
    ph = r.entity_id
    assert (r.match_kind, r.candidates) == (AMBIG, ("Q1", "Q2", "Q3"))
    assert links(service) == {pair(ph, "Q1"), pair(ph, "Q2")}
    load(service, rec("Q1", "Alpha One", "person"), rec("Q2", "Alpha Two", "person"))
    assert links(service) == {pair(ph, "Q1"), pair(ph, "Q2"), pair(ph, "Q3")}


def test_a_batch_links_a_candidate_that_is_best_only_between_two_of_its_mentions(
        service: IdentityService) -> None:
    """A batch 'equals resolving the mentions one at a time in that order': a candidate that a
    mention of the batch makes the pair's best, and the next mention displaces, is linked as it
    would be between two calls (found by an independent oracle audit)."""
    load(service, rec("Q1", "Naive Bayes", "tool"), rec("Q2", "Naive Bayes", "method"),
         rec("Q3", "Naive Bayess", "dataset"))
    ph = service.resolve("Naive-Bayes", "other").entity_id  # ambiguous: Q1, Q2 at rule 3
    assert links(service) == {pair(ph, "Q1"), pair(ph, "Q2")}
    # A typo match gives Q3 the form NAIVE-BAYES: then the pair's only candidate, at rule 2.
    # The next mention gives Q1 the form Naive-Bayes: from then on rule 1 decides, for Q1.
    replies = service.resolve_batch("", [("NAIVE-BAYES", "dataset"), ("Naive-Bayes", "tool")])
    assert [(r.entity_id, r.match_kind) for r in replies] == [  # type: ignore[union-attr]
        ("Q3", MatchKind.TYPO), ("Q1", MatchKind.PUNCTUATION)]
    assert links(service) == {pair(ph, "Q1"), pair(ph, "Q2"), pair(ph, "Q3")}


def test_placeholder_not_merged_when_one_canonical_has_its_key(service: IdentityService) -> None:
    """Placeholders are never 'merged on import', even where a plain provisional would be."""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = service.resolve("John Smith", "person").entity_id
    service.merge("J2", "J1")
    load(service, rec("J1", "John Smith", "person"))  # one canonical now carries the key
    view = service.get_entity(ph)
    assert (view.status, view.placeholder, view.redirect_to) == (Status.PROVISIONAL, True, "")


def test_ambiguous_resolve_follows_placeholder_redirect(service: IdentityService) -> None:
    """'Every ambiguous resolve of the pair returns its placeholder (following redirects)'."""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = service.resolve("John Smith", "person").entity_id
    service.settle(ph, "J1", "same", actor="curator", reason="it was him")
    assert service.get_entity(ph).redirect_to == "J1"  # canonical before provisional
    r = service.resolve("John Smith", "person")
    assert (r.entity_id, r.match_kind, r.created) == ("J1", AMBIG, False)
    assert r.candidates == ("J1", "J2")


@pytest.mark.parametrize("appears", ["imported", "alias added"])
@pytest.mark.parametrize("where", ["same server", "server started after the merge",
                                   "server that never saw it live"])
def test_a_merged_placeholder_is_linked_to_later_candidates_through_its_redirect(
        make_service: Callable[..., IdentityService], appears: str, where: str) -> None:
    """A placeholder a curator settled as the same as one candidate is still its pair's (the
    pair's resolves follow its redirect), so a candidate that appears later is linked to the
    entity it redirects to as it appears ('links ... read through redirects'), with no further
    resolve of the pair; also in a server whose index was built from the store after the
    merge, or before the placeholder was made (it reads both from the store)."""
    first = make_service("merged-placeholder")
    load(first, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"),
         rec("J3", "Jon Smyth", "person"))
    svc = make_service("merged-placeholder") if where == "server that never saw it live" \
        else first
    ph = first.resolve("John Smith", "person").entity_id
    first.settle(ph, "J1", "same", actor="curator", reason="it was him")
    assert links(first) == {pair("J1", "J2")}
    if where == "server started after the merge":
        svc = make_service("merged-placeholder")
    if appears == "imported":
        load(svc, rec("J4", "John Smith", "person"))
        later = "J4"
    else:
        svc.add_alias("J3", "John Smith")
        later = "J3"
    assert links(svc) == {pair("J1", "J2"), pair("J1", later)}
    r = svc.resolve("John Smith", "person")
    assert (r.entity_id, r.match_kind, set(r.possibly_same_as)) == ("J1", AMBIG, {"J2", later})
    assert links(svc) == {pair("J1", "J2"), pair("J1", later)}


def test_placeholder_type_and_exact_type_compatibility(service: IdentityService) -> None:
    """'The placeholder has the pair's type'; 'a placeholder ... is compatible only with mentions
    of exactly its own type' - even a placeholder typed `other`."""
    load(service, rec("G1", "Jaguar", "other"), rec("G2", "Jaguar", "other"))
    place = service.resolve("Jaguar", "place")
    assert (place.match_kind, place.entity_type, place.candidates) == (AMBIG, "place",
                                                                      ("G1", "G2"))
    person = service.resolve("Jaguar", "person")
    assert (person.match_kind, person.entity_type, person.created) == (AMBIG, "person", True)
    assert person.candidates == ("G1", "G2")
    other = service.resolve("Jaguar", "other")
    assert (other.match_kind, other.entity_type, other.created) == (AMBIG, "other", True)
    assert other.candidates == ("G1", "G2")
    tool = service.resolve("Jaguar", "tool")  # the `other` placeholder is not a wildcard
    assert (tool.match_kind, tool.created, tool.candidates) == (AMBIG, True, ("G1", "G2"))
    assert len({place.entity_id, person.entity_id, other.entity_id, tool.entity_id}) == 4
    again = service.resolve("Jaguar", "place")  # same type ranks first: converges on it
    assert (again.entity_id, again.match_kind) == (place.entity_id, EXACT)
    assert again.candidates == (place.entity_id, "G1", "G2")
    assert service.get_entity(other.entity_id).entity_type == "other"


def test_placeholder_never_promoted_automatically(
    make_service: Callable[..., IdentityService],
) -> None:
    """Promotion 'automatically when it has evidence from a configured number of distinct papers
    (placeholders excepted)'."""
    svc = make_service("promote", promote_after_papers=2)
    load(svc, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = [svc.resolve("John Smith", "person", context_id=f"p{i}").entity_id for i in range(3)]
    assert len(set(ph)) == 1
    assert svc.get_entity(ph[0]).status is Status.PROVISIONAL
    p = svc.resolve("Brand New Method", "method", context_id="p1")
    assert p.status is Status.PROVISIONAL
    svc.resolve("Brand New Method", "method", context_id="p1")
    assert svc.get_entity(p.entity_id).status is Status.PROVISIONAL
    r = svc.resolve("Brand New Method", "method", context_id="p2")
    assert (r.entity_id, r.status) == (p.entity_id, Status.CANONICAL)


@pytest.mark.parametrize("how", ["merge", "settle"])
def test_merge_that_brings_the_paper_count_up_promotes(
    make_service: Callable[..., IdentityService], how: str,
) -> None:
    """Promotion 'when it has evidence from a configured number of distinct papers' holds after
    a merge too (evidence moves with it), whether an admin merge or a curator's 'same', and the
    same call then gets the same answer on any server."""
    svc = make_service("promote-merge", promote_after_papers=2)
    a = svc.resolve("Maria", "person", context_id="arXiv:1")
    b = svc.resolve("Mario", "person", context_id="arXiv:2")  # weak: a new entity, linked
    assert (a.created, b.created, b.possibly_same_as) == (True, True, (a.entity_id,))
    if how == "merge":
        view = svc.merge(b.entity_id, a.entity_id)
    else:
        view = svc.settle(b.entity_id, a.entity_id, "same", actor="curator", reason="typo")
    assert (view.entity_id, view.status) == (a.entity_id, Status.CANONICAL)
    again = svc.resolve("Maria", "person", context_id="arXiv:1")
    assert (again.entity_id, again.status) == (a.entity_id, Status.CANONICAL)


def test_merge_below_the_paper_count_does_not_promote(
    make_service: Callable[..., IdentityService],
) -> None:
    """Papers are counted once however many merged entities saw them."""
    svc = make_service("promote-merge-same-paper", promote_after_papers=2)
    a = svc.resolve("Maria", "person", context_id="arXiv:1")
    b = svc.resolve("Mario", "person", context_id="arXiv:1")
    assert svc.merge(b.entity_id, a.entity_id).status is Status.PROVISIONAL
    r = svc.resolve("Maria", "person", context_id="arXiv:2")
    assert (r.entity_id, r.status) == (a.entity_id, Status.CANONICAL)


def test_settle_names_a_pair_already_merged(service: IdentityService) -> None:
    """Settling a merged pair is FAILED_PRECONDITION, and the message says why."""
    a, b = new_id(service, "Maria", "person"), new_id(service, "Mario", "person")
    service.merge(b, a)
    with pytest.raises(FailedPrecondition, match="already merged"):
        service.settle(a, b, "same", actor="curator", reason="again")
    with pytest.raises(FailedPrecondition, match="not linked to itself"):
        service.settle(a, a, "distinct", actor="curator", reason="self")


# -- types -----------------------------------------------------------------------------------------


def test_type_upgrade_of_provisional_other(service: IdentityService) -> None:
    """'If the entity is a provisional one typed other and the mention is typed, the entity takes
    the mention's type'; afterwards it is no longer a wildcard."""
    p = new_id(service, "Graphene", "other")
    r = service.resolve("graphene", "material")
    assert (r.entity_id, r.match_kind, r.entity_type) == (p, CASE, "material")
    assert service.get_entity(p).entity_type == "material"
    same = service.resolve("Graphene", "other")
    assert (same.entity_id, same.entity_type) == (p, "material")
    tool = service.resolve("Graphene", "tool")
    assert tool.created and tool.entity_id != p
    assert service.get_entity(p).entity_type == "material"


def test_canonical_type_never_upgraded(service: IdentityService) -> None:
    """'Canonical types belong to the authority and are never upgraded by mentions.'"""
    load(service, rec("QN", "Nylon", "other"))
    r = service.resolve("Nylon", "material")
    assert (r.entity_id, r.match_kind, r.entity_type) == ("QN", EXACT, "other")
    assert service.get_entity("QN").entity_type == "other"


TYPE_CASES: list[tuple[str, str, str]] = [
    ("exact", "person", "person"),
    ("trimmed", "  person\t", "person"),
    ("casefolded", "PERSON", "person"),
    ("trim-and-case", "\u00a0Organization\n", "organization"),
    ("unknown", "spaceship", "other"),
    ("near-miss", "persons", "other"),
    ("empty", "", "other"),
    ("blank", "   ", "other"),
    ("other-written-out", "Other", "other"),
]


@pytest.mark.parametrize(("raw", "expected"), [c[1:] for c in TYPE_CASES],
                         ids=[c[0] for c in TYPE_CASES])
def test_type_vocabulary(service: IdentityService, raw: str, expected: str) -> None:
    """'A type string is trimmed and casefolded; an empty or unknown type is read as the
    wildcard other'."""
    r = service.resolve("Some Unique Name", raw)
    assert r.entity_type == expected
    assert service.get_entity(r.entity_id).entity_type == expected


@pytest.mark.parametrize(("raw", "ok"),
                         [("spaceship", False), ("persons", False), (" Person ", True),
                          ("OTHER", True)],
                         ids=["unknown", "near-miss", "trim-case-known", "other"])
def test_strict_mode_refuses_unknown_types(make_service: Callable[..., IdentityService],
                                           raw: str, ok: bool) -> None:
    """'unless the server runs in strict mode, where an unknown type is INVALID_ARGUMENT'."""
    svc = make_service("strict", strict_types=True)
    if ok:
        assert svc.resolve("Some Unique Name", raw).created
    else:
        with pytest.raises(InvalidArgument):
            svc.resolve("Some Unique Name", raw)
        assert svc.list_changes(0) == []


def test_configured_vocabulary(make_service: Callable[..., IdentityService]) -> None:
    """'types: a configurable closed vocabulary': a type outside it reads as `other`."""
    svc = make_service("vocab", types=("gene", "protein", "other"))
    assert svc.resolve("BRCA1", "Gene").entity_type == "gene"
    assert svc.resolve("Ada Lovelace", "person").entity_type == "other"


# -- surface forms and matched_name ----------------------------------------------------------------


def test_surface_forms_recorded_on_convergence(service: IdentityService) -> None:
    """'A display form not yet among the entity's names is recorded as a surface form' (once,
    in display form, in the order seen)."""
    load(service, rec("Q1", "Ada Lovelace", "person"))
    for mention in ["ADA LOVELACE", "Ada Lovelace", "ADA\u00a0LOVELACE", "Ada-Lovelace",
                    "Ada\u200bLovelace", "Ada Lovelase"]:
        assert service.resolve(mention, "person").entity_id == "Q1"
    view = service.get_entity("Q1")
    assert view.surface_forms == ("ADA LOVELACE", "Ada-Lovelace", "AdaLovelace", "Ada Lovelase")
    assert view.aliases == ()
    assert view.name == "Ada Lovelace"


@pytest.mark.parametrize(
    ("aliases", "mention", "matched"),
    [
        (("Mem Castle", "Mem-Castle"), "memcastle", "Mem Castle"),
        (("Mem-Castle", "Mem Castle"), "memcastle", "Mem-Castle"),
        (("Mem-Castle", "Mem Castle"), "MEM_CASTLE", "Mem-Castle"),
    ],
    ids=["first-alias-a", "first-alias-b", "first-alias-b-other-spelling"],
)
def test_matched_name_aliases_in_recorded_order(service: IdentityService,
                                                aliases: tuple[str, ...], mention: str,
                                                matched: str) -> None:
    """'matched_name is the first of them in the order: name, aliases, surface forms, each in the
    order they were recorded'."""
    load(service, rec("Q", "Alpha", "tool", *aliases))
    r = service.resolve(mention, "tool")
    assert (r.entity_id, r.match_kind, r.matched_name) == ("Q", ALIAS, matched)


def test_matched_name_name_before_alias_before_surface(service: IdentityService) -> None:
    """Name first, then aliases, then surface forms."""
    load(service, rec("Q", "MemCastle", "tool", "Mem Castle"))
    service.resolve("MEM-CASTLE", "tool")  # surface form
    r = service.resolve("mem.castle", "tool")
    assert (r.match_kind, r.matched_name) == (PUNCT, "MemCastle")
    load(service, rec("R", "Alpha Beta", "tool", "Gamma Delta"))
    service.resolve("GAMMA-DELTA", "tool")  # surface form after the alias
    r = service.resolve("gamma_delta", "tool")
    assert (r.entity_id, r.match_kind, r.matched_name) == ("R", PUNCT, "Gamma Delta")


def test_matched_name_surface_forms_in_recorded_order(service: IdentityService) -> None:
    """Surface forms are tried in the order they were recorded (here: by two merges)."""
    load(service, rec("T", "Alpha", "tool"))
    p1 = new_id(service, "Mem Castle", "tool")
    service.merge(p1, "T")
    service.resolve("MEM-CASTLE", "tool")  # rule 3 via the surface form 'Mem Castle'
    assert service.get_entity("T").surface_forms == ("Mem Castle", "MEM-CASTLE")
    r = service.resolve("memcastle", "tool")
    assert (r.entity_id, r.match_kind, r.matched_name) == ("T", PUNCT, "Mem Castle")


# -- lookup_only -----------------------------------------------------------------------------------


def _lookup_world(service: IdentityService) -> dict[str, str]:
    load(service, rec("Q1", "Ada Lovelace", "person"), rec("J1", "John Smith", "person"),
         rec("J2", "John Smith", "person"))
    return {
        "mario": new_id(service, "Mario", "person", context_id="p0"),
        "graphene": new_id(service, "Graphene", "other", context_id="p0"),
    }


LOOKUP_CASES: list[tuple[str, str, str, str, MatchKind, str | None]] = [
    # (id, mention, type, context, kind, expected id: a key of the world, "" for none)
    ("would-be-new", "Brand New Entity", "tool", "", NEW, ""),
    ("would-be-new-with-context", "Brand New Entity", "tool", "p9", NEW, ""),
    ("would-add-surface-form", "ADA LOVELACE", "person", "p9", CASE, "Q1"),
    ("would-upgrade-type", "graphene", "material", "p9", CASE, "graphene"),
    ("would-be-weak", "Maria", "person", "p9", NEW, ""),
    ("would-create-placeholder", "John Smith", "person", "p9", AMBIG, ""),
    ("exact-with-context", "Ada Lovelace", "person", "p9", EXACT, "Q1"),
]


@pytest.mark.parametrize(("mention", "etype", "context", "kind", "expected"),
                         [c[1:] for c in LOOKUP_CASES], ids=[c[0] for c in LOOKUP_CASES])
def test_lookup_only_writes_nothing(service: IdentityService, mention: str, etype: str,
                                    context: str, kind: MatchKind, expected: str) -> None:
    """'Resolve with lookup_only writes nothing (no entity, surface form, link, type change or
    evidence). Its reply has the match kind and candidates a creating call would have, created
    false, no possibly_same_as, and an empty id and status where a creating call would make a new
    entity.'"""
    world = _lookup_world(service)
    ids = ["Q1", "J1", "J2", *world.values()]
    before = snapshot(service, ids)
    look = service.resolve(mention, etype, context_id=context, lookup_only=True)
    assert snapshot(service, ids) == before
    assert look.created is False
    assert look.possibly_same_as == ()
    assert look.match_kind is kind
    if expected:
        assert look.entity_id == world.get(expected, expected)
        assert look.status is not None
    else:
        assert (look.entity_id, look.status) == ("", None)
    real = service.resolve(mention, etype, context_id=context)
    assert (real.match_kind, real.candidates) == (look.match_kind, look.candidates)
    assert real.created is (expected == "")
    if expected:
        assert real.entity_id == look.entity_id


def test_lookup_only_returns_existing_placeholder(service: IdentityService) -> None:
    """Where the placeholder exists a creating call makes nothing new: lookup names it."""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = service.resolve("John Smith", "person").entity_id
    before = snapshot(service, ["J1", "J2", ph])
    look = service.resolve("John Smith", "person", context_id="p1", lookup_only=True)
    assert (look.entity_id, look.match_kind, look.created) == (ph, AMBIG, False)
    assert look.possibly_same_as == ()
    assert snapshot(service, ["J1", "J2", ph]) == before


def test_lookup_only_batch_writes_nothing(service: IdentityService) -> None:
    """'It may be lookup_only as a whole' and 'A lookup-only batch writes nothing anyway'."""
    load(service, rec("Q1", "Ada Lovelace", "person"))
    before = snapshot(service, ["Q1"])
    out = service.resolve_batch("p1", [("ada lovelace", "person"), ("New Thing", "tool"),
                                       ("new thing", "tool")], lookup_only=True)
    assert snapshot(service, ["Q1"]) == before
    assert [(r.entity_id, r.match_kind) for r in out if isinstance(r, ResolveResult)] == [
        ("Q1", CASE), ("", NEW), ("", NEW)]


# -- merge -----------------------------------------------------------------------------------------


def test_merge_redirects_to_live_end_of_chain(service: IdentityService) -> None:
    """'GetEntity on a merged id returns it with status merged and redirect_to naming the live
    entity at the end of the chain.' Merged entities 'have no names of their own'."""
    load(service, rec("QG", "Gamma Thing", "tool"))
    a = new_id(service, "Alpha Thing", "tool")
    b = new_id(service, "Beta Thing", "tool")
    service.merge(a, b)
    service.merge(b, "QG")
    for merged in (a, b):
        view = service.get_entity(merged)
        assert (view.status, view.redirect_to) == (Status.MERGED, "QG")
        assert (view.aliases, view.surface_forms) == ((), ())
    target = service.get_entity("QG")
    assert (target.status, target.redirect_to) == (Status.CANONICAL, "")
    assert set(target.surface_forms) == {"Alpha Thing", "Beta Thing"}
    r = service.resolve("Alpha Thing", "tool")
    assert (r.entity_id, r.match_kind) == ("QG", EXACT)


def test_merged_entity_has_no_name(service: IdentityService) -> None:
    """'Merged entities have no names of their own (section 3).'"""
    a = new_id(service, "Alpha Thing", "tool")
    b = new_id(service, "Beta Thing", "tool")
    service.merge(a, b)
    assert service.get_entity(a).name == ""


def test_merge_moves_names_by_status(service: IdentityService) -> None:
    """'Its aliases become aliases of the target; its name becomes an alias if the source was
    canonical and a surface form if it was provisional ...; its surface forms become surface
    forms; its evidence and links move too. The target keeps its type and status.'"""
    load(service, rec("S", "Alpha Corp", "organization", "ACorp"),
         rec("T", "Alpha Corporation", "organization"))
    p = new_id(service, "Alfa Korp", "other", context_id="p1")
    service.resolve("ALFA KORP", "other", context_id="p2")  # surface form of p
    typo = service.resolve("Alfa Korpo", "other")  # shorter key 8: a strong typo of p's name
    assert (typo.entity_id, typo.match_kind) == (p, TYPO)
    service.merge("S", "T")
    service.merge(p, "T")
    t = service.get_entity("T")
    assert (t.entity_type, t.status, t.name) == ("organization", Status.CANONICAL,
                                                 "Alpha Corporation")
    assert set(t.aliases) == {"Alpha Corp", "ACorp"}
    assert set(t.surface_forms) == {"Alfa Korp", "ALFA KORP", "Alfa Korpo"}
    assert (t.evidence_count, t.paper_count) == (2, 2)
    # the provisional name is no typo anchor any more; the canonical one (now an alias) is
    drift = service.resolve("Alfa Korpp", "organization")
    assert (drift.match_kind, drift.created) == (NEW, True)
    anchor = service.resolve("Alpha Corpp", "organization")
    assert (anchor.entity_id, anchor.match_kind, anchor.matched_name) == ("T", TYPO,
                                                                         "Alpha Corp")


def test_merge_moves_links(service: IdentityService) -> None:
    """'its evidence and links move too'; links are 'read through redirects'."""
    mario = new_id(service, "Mario", "person")
    maria = service.resolve("Maria", "person").entity_id
    load(service, rec("QM", "Maria Curie", "person"))
    service.merge(maria, "QM")
    assert links(service) == {pair(mario, "QM")}


def test_admin_calls_on_merged_id_act_on_live_entity(service: IdentityService) -> None:
    """'Admin calls on a merged id act on the entity it redirects to.'"""
    load(service, rec("T", "Target Corp", "organization"))
    p = new_id(service, "Source Corp", "organization")
    service.merge(p, "T")
    view = service.add_alias(p, "Target Co")
    assert view.entity_id == "T"
    assert "Target Co" in service.get_entity("T").aliases


def _two(service: IdentityService, kind: str) -> tuple[str, str]:
    if kind == "canonical-into-provisional":
        load(service, rec("Q", "Canon Thing", "tool"))
        return "Q", new_id(service, "Other Thing", "tool")
    if kind == "incompatible-types":
        return new_id(service, "Person Thing", "person"), new_id(service, "Place Thing", "place")
    if kind == "into-itself":
        p = new_id(service, "Self Thing", "tool")
        return p, p
    if kind == "distinct-pair":
        a, b = new_id(service, "Mario", "person"), new_id(service, "Maria", "person")
        service.settle(a, b, "distinct", actor="curator", reason="two people")
        return a, b
    raise AssertionError(kind)


@pytest.mark.parametrize("kind", ["canonical-into-provisional", "incompatible-types",
                                  "into-itself", "distinct-pair"])
def test_merge_preconditions(service: IdentityService, kind: str) -> None:
    """'Merging entities of incompatible types, a canonical entity into a provisional one, an
    entity into itself, or a pair a curator called distinct is FAILED_PRECONDITION'."""
    source, target = _two(service, kind)
    before = service.list_changes(0)
    with pytest.raises(FailedPrecondition):
        service.merge(source, target)
    assert service.list_changes(0) == before
    assert service.get_entity(source).status is not Status.MERGED


def test_merge_already_merged_pair_is_a_noop(service: IdentityService) -> None:
    """'merging an already merged pair again is a no-op.'"""
    load(service, rec("T", "Target Corp", "organization"))
    p = new_id(service, "Source Corp", "organization")
    service.merge(p, "T")
    before = snapshot(service, [p, "T"])
    view = service.merge(p, "T")
    assert view.entity_id == "T"
    assert snapshot(service, [p, "T"]) == before


def test_merge_keeps_target_type(service: IdentityService) -> None:
    """'The target keeps its type and status' (a typed source into an `other` target)."""
    target = new_id(service, "Wildcard Thing", "other")
    source = new_id(service, "Typed Thing", "tool")
    view = service.merge(source, target)
    assert (view.entity_id, view.entity_type, view.status) == (target, "other",
                                                               Status.PROVISIONAL)


# -- review decisions ------------------------------------------------------------------------------


def test_distinct_is_sticky(service: IdentityService) -> None:
    """'A decision is sticky: no import or other automatic action may merge a pair that a person
    called distinct, and the link is not proposed again.'"""
    load(service, rec("J1", "John Smith", "person"), rec("J2", "John Smith", "person"))
    ph = service.resolve("John Smith", "person").entity_id
    service.settle(ph, "J1", "distinct", actor="curator", reason="not him")
    assert links(service) == {pair(ph, "J2")}
    load(service, rec("J3", "John Smith", "person"))
    r = service.resolve("John Smith", "person")
    assert (r.entity_id, r.match_kind) == (ph, AMBIG)
    assert links(service) == {pair(ph, "J2"), pair(ph, "J3")}
    with pytest.raises(FailedPrecondition):
        service.merge(ph, "J1")
    with pytest.raises(FailedPrecondition):  # no longer an open link
        service.settle(ph, "J1", "same", actor="curator", reason="changed my mind")


def test_settle_requires_a_link(service: IdentityService) -> None:
    """'settling a pair that is not linked is FAILED_PRECONDITION'."""
    a, b = new_id(service, "Alpha Thing", "tool"), new_id(service, "Beta Thing", "tool")
    with pytest.raises(FailedPrecondition):
        service.settle(a, b, "distinct", actor="curator", reason="unrelated")


def test_settle_same_merges_into_better_ranked(service: IdentityService) -> None:
    """'same merges the pair (the better-ranked entity is the target: canonical before
    provisional ...)', whichever order the curator names them in."""
    load(service, rec("QA", "Acme", "organization"))
    p = service.resolve("Acmi", "organization")
    assert (p.match_kind, p.possibly_same_as) == (NEW, ("QA",))
    service.settle("QA", p.entity_id, "same", actor="curator", reason="same firm")
    view = service.get_entity(p.entity_id)
    assert (view.status, view.redirect_to) == (Status.MERGED, "QA")
    assert "Acmi" in service.get_entity("QA").surface_forms
    assert links(service) == set()


# -- import ----------------------------------------------------------------------------------------

IMPORT_MERGE_CASES: list[tuple[str, str, str, str, str, bool]] = [
    # (id, provisional mention, its type, record name, record type, merged?)
    ("same-key-same-type", "Mem-Castle", "tool", "MemCastle", "tool", True),
    ("same-key-via-case", "memcastle", "tool", "MemCastle", "tool", True),
    ("provisional-other", "mem castle", "other", "MemCastle", "tool", True),
    ("record-other", "Mem Castle", "tool", "MemCastle", "other", True),
    ("incompatible-type", "Mem-Castle", "place", "MemCastle", "tool", False),
    ("typo-is-not-rule-3", "MemCastel", "tool", "MemCastle", "tool", False),
    ("key-shorter-than-3", "C.", "tool", "C", "tool", False),
    ("key-of-3", "C.+.+", "tool", "C++", "tool", True),
]


@pytest.mark.parametrize(("mention", "mtype", "name", "rtype", "merged"),
                         [c[1:] for c in IMPORT_MERGE_CASES],
                         ids=[c[0] for c in IMPORT_MERGE_CASES])
def test_import_merges(service: IdentityService, mention: str, mtype: str, name: str,
                       rtype: str, merged: bool) -> None:
    """'every provisional, non-placeholder entity of compatible type that rule 3 would converge
    on (one of its names has the record's key, 3 or more characters) is merged into it'."""
    p = new_id(service, mention, mtype)
    load(service, rec("Q", name, rtype))
    view = service.get_entity(p)
    if merged:
        assert (view.status, view.redirect_to) == (Status.MERGED, "Q")
        assert service.get_entity("Q").surface_forms == (service.resolve(
            mention, mtype, lookup_only=True).display_form,)
        assert service.get_entity("Q").entity_type == rtype
    else:
        assert (view.status, view.redirect_to) == (Status.PROVISIONAL, "")


def test_import_links_when_several_canonicals_share_the_key(service: IdentityService) -> None:
    """'If, after the import, several canonical entities of compatible type share that key, the
    provisional entity is linked possibly_same_as to each instead of merged.'"""
    p = new_id(service, "mem-castle", "tool")
    load(service, rec("Q1", "MemCastle", "tool"), rec("Q2", "Mem Castle", "tool"))
    assert service.get_entity(p).status is Status.PROVISIONAL
    assert links(service) == {pair(p, "Q1"), pair(p, "Q2")}


def test_import_merges_through_the_records_aliases(service: IdentityService) -> None:
    """Rule 3 compares with every name, so a record's alias carries its key too: a provisional
    'nmr' is what a mention 'N.M.R.' would find beside the record aliased 'NMR'. An alias key
    under 3 characters merges nothing."""
    nmr = new_id(service, "nmr", "method")
    ml = new_id(service, "ml", "method")
    load(service, rec("Q1", "Nuclear magnetic resonance", "method", "NMR"),
         rec("Q2", "Machine learning", "method", "ML"))
    assert service.get_entity(nmr).redirect_to == "Q1"
    assert service.get_entity(ml).status is Status.PROVISIONAL
    r = service.resolve("nmr", "method")
    assert (r.entity_id, r.match_kind) == ("Q1", EXACT)


def test_import_links_when_an_alias_key_is_shared(service: IdentityService) -> None:
    """'several canonical entities of compatible type share that key': shared through an alias
    of each, the provisional entity is linked to both instead of merged."""
    p = new_id(service, "CNN", "other")
    load(service, rec("Q1", "Convolutional neural network", "method", "CNN"),
         rec("Q2", "Cable News Network", "organization", "C.N.N."))
    assert service.get_entity(p).status is Status.PROVISIONAL
    assert links(service) == {pair(p, "Q1"), pair(p, "Q2")}


def test_import_counts_only_compatible_canonicals(service: IdentityService) -> None:
    """'several canonical entities of compatible type': an incompatible one does not count."""
    load(service, rec("Q0", "MemCastle", "place"))
    p = new_id(service, "mem-castle", "tool")
    o = new_id(service, "Mem_Castle", "person")
    load(service, rec("Q1", "Mem Castle", "tool"))
    assert service.get_entity(p).redirect_to == "Q1"  # Q0 (place) does not make it 'several'
    assert service.get_entity(o).status is Status.PROVISIONAL  # person: neither is compatible
    assert links(service) == set()


@pytest.mark.parametrize("distinct", [False, True], ids=["not-settled", "settled-distinct"])
def test_import_never_merges_a_distinct_pair(service: IdentityService, distinct: bool) -> None:
    """'unless a curator called the pair distinct'."""
    load(service, rec("QA", "Acme", "organization"))
    p = service.resolve("Acmi", "organization").entity_id
    if distinct:
        service.settle(p, "QA", "distinct", actor="curator", reason="different firms")
    load(service, rec("QA", "ACMI", "organization"))
    view = service.get_entity(p)
    assert (view.status is Status.MERGED) is (not distinct)
    assert service.get_entity("QA").name == "ACMI"


def test_reimport_replaces_authority_data_and_keeps_the_rest(service: IdentityService) -> None:
    """'Re-importing an id replaces what the authority said (name, type, aliases); its previous
    name stays as an alias, and aliases added by curators or merges stay.'"""
    load(service, rec("Q", "Old Name", "tool", "Old Alias"), rec("S", "Side Name", "tool"))
    service.add_alias("Q", "Curated Name")
    service.merge("S", "Q")
    load(service, rec("Q", "New Name", "method", "New Alias"))
    view = service.get_entity("Q")
    assert (view.name, view.entity_type, view.status) == ("New Name", "method",
                                                          Status.CANONICAL)
    assert set(view.aliases) == {"Old Name", "Curated Name", "Side Name", "New Alias"}
    r = service.resolve("Old Name", "method")
    assert (r.entity_id, r.match_kind) == ("Q", ALIAS)
    gone = service.resolve("Old Alias", "method")
    assert gone.entity_id != "Q"


def test_a_type_changed_by_reimport_is_stored_not_only_indexed(
        make_service: Callable[..., IdentityService]) -> None:
    """The new type is in the store: another server opening it (or this one restarted) reads
    it, and matches by it."""
    first = make_service("retyped")
    load(first, rec("Q", "Quorbex Engine", "tool"))
    load(first, rec("Q", "Quorbex Engine", "method"))
    assert first.get_entity("Q").entity_type == "method"
    opened = make_service("retyped")  # the same file, its index built from the store
    assert opened.get_entity("Q").entity_type == "method"
    r = opened.resolve("Quorbex Engine", "method", lookup_only=True)
    assert (r.entity_id, r.match_kind) == ("Q", EXACT)


def test_a_merge_leaves_the_targets_own_spelling_of_a_shared_name_as_it_was(
        make_service: Callable[..., IdentityService]) -> None:
    """Merging an entity whose name the target already has moves nothing onto it: the target's
    name stays its name, in the store as in the index (another server opening the store reads
    the same), and an exact mention still matches it as EXACT, not ALIAS."""
    first = make_service("shared")
    load(first, rec("Q1", "Quorbex Engine", "tool", "QE"), rec("Q2", "Quorbex Engine", "tool"))
    first.merge("Q2", "Q1")
    for svc in (first, make_service("shared")):
        view = svc.get_entity("Q1")
        assert (view.name, view.aliases, view.surface_forms) == ("Quorbex Engine", ("QE",), ())
        r = svc.resolve("Quorbex Engine", "tool", lookup_only=True)
        assert (r.entity_id, r.match_kind, r.matched_name) == ("Q1", EXACT, "Quorbex Engine")


def test_reimport_keeps_aliases_of_curators_and_merges_that_the_authority_listed_and_dropped(
        service: IdentityService) -> None:
    """'aliases added by curators or merges stay', also after the authority listed them for a
    while and then dropped them; a curator adding an alias the authority gave keeps it too."""
    load(service, rec("HGNC:11892", "TNF", "material", "DIF"), rec("Q2", "TNF alpha", "material"))
    service.add_alias("HGNC:11892", "TNF-α")
    service.add_alias("HGNC:11892", "DIF")  # the authority's already: now the curator's as well
    service.merge("Q2", "HGNC:11892")
    load(service, rec("HGNC:11892", "TNF", "material", "TNF-α", "TNF alpha", "DIF", "TNFA"))
    load(service, rec("HGNC:11892", "TNF", "material"))
    assert set(service.get_entity("HGNC:11892").aliases) == {"TNF-α", "TNF alpha", "DIF"}
    gone = service.resolve("TNFA", "material", lookup_only=True)  # the authority's own alias
    assert gone.entity_id != "HGNC:11892"


def test_reimport_keeps_a_previous_name_the_authority_lists_then_drops(
        service: IdentityService) -> None:
    """'its previous name stays as an alias', also when the same re-import lists it as an alias
    and a later one no longer does."""
    load(service, rec("HGNC:6018", "IL-6", "material"))
    load(service, rec("HGNC:6018", "Interleukin 6", "material", "IL-6", "IFNB2"))
    load(service, rec("HGNC:6018", "Interleukin 6", "material"))
    assert service.get_entity("HGNC:6018").aliases == ("IL-6",)


def test_reimport_keeps_the_merges_alias_the_target_already_had_from_the_authority(
        service: IdentityService) -> None:
    """A merge that brings an alias the target's authority also gave makes it the merge's:
    it stays when the authority drops it."""
    load(service, rec("Q1", "AT&T", "organization", "Ma Bell"),
         rec("Q2", "AT&T Inc.", "organization", "Ma Bell"))
    service.merge("Q2", "Q1")
    load(service, rec("Q1", "AT&T", "organization"))
    assert set(service.get_entity("Q1").aliases) == {"AT&T Inc.", "Ma Bell"}


@pytest.mark.parametrize("origin", ["resolved", "merged", "merged on import"])
def test_reimport_keeps_a_surface_form_the_authority_listed_as_an_alias_then_dropped(
        make_service: Callable[..., IdentityService], origin: str) -> None:
    """A spelling the entity held as a surface form (seen in a paper; a provisional source's
    name, moved by a merge or an import merge) that the authority then lists as an alias is
    an alias while listed, and a surface form again once a re-import drops it: 'nothing is
    ever deleted', so the spelling still converges on the entity, and it is no typo anchor
    (in the store as in the index: a server opening the store reads the same)."""
    first = make_service(origin.replace(" ", "-"))
    load(first, rec("K1", "Gizmotron", "tool"))
    side, probe = ("Gizmotrom", "Gizmotrxm") if origin == "resolved" else ("Gizmo Side",
                                                                           "Gizmo Sida")
    if origin == "resolved":
        assert first.resolve(side, "tool").match_kind is TYPO  # recorded as a surface form
    elif origin == "merged":
        first.merge(new_id(first, side, "tool"), "K1")
    else:
        p = new_id(first, side, "tool", context_id="paper-1")
        load(first, rec("K1", "Gizmotron", "tool", side))
        assert first.get_entity(p).redirect_to == "K1"
    load(first, rec("K1", "Gizmotron", "tool", side))
    view = first.get_entity("K1")
    assert side in view.aliases and side not in view.surface_forms
    load(first, rec("K1", "Gizmotron", "tool"))
    for svc in (first, make_service(origin.replace(" ", "-"))):
        view = svc.get_entity("K1")
        assert side in view.surface_forms and side not in view.aliases
        r = svc.resolve(side, "tool", lookup_only=True)
        assert (r.entity_id, r.match_kind, r.matched_name) == ("K1", EXACT, side)
        assert svc.resolve(probe, "tool", lookup_only=True).match_kind is NEW  # no anchor


def test_reimport_keeps_a_curators_alias_over_a_listed_surface_form(
        service: IdentityService) -> None:
    """A curator adding, as an alias, a surface form the authority lists as an alias makes it
    the curator's: it stays an alias when the authority drops it."""
    load(service, rec("K1", "Gizmotron", "tool"))
    service.merge(new_id(service, "Gizmo Side", "tool"), "K1")
    load(service, rec("K1", "Gizmotron", "tool", "Gizmo Side"))
    service.add_alias("K1", "Gizmo Side")
    load(service, rec("K1", "Gizmotron", "tool"))
    view = service.get_entity("K1")
    assert ("Gizmo Side" in view.aliases, "Gizmo Side" in view.surface_forms) == (True, False)


def test_an_import_merges_what_a_merge_gave_a_key_while_it_collected_its_targets(
        service: IdentityService, monkeypatch: pytest.MonkeyPatch) -> None:
    """A merge (an admin's, or a curator's SAME) that gives a provisional entity one of the
    import's keys after the import has collected its merge targets, and before it merges them,
    is seen: the outcome is the one the order 'the merge, then the import' gives (the import
    merges the target, which holds the key now). The other order ('the import, then the
    merge') would have refused the merge: a canonical entity into a provisional one."""
    p = new_id(service, "Sprocket Name", "tool")
    q = new_id(service, "Gadget Label", "tool")
    collect = AuthorityImport._collect_import_targets
    landed: list[str] = []

    def collect_then_merge(self: AuthorityImport, keys: list[str],
                           brought_by: dict[str, tuple[str, ...]],
                           targets: dict[str, set[str]]) -> None:
        collect(self, keys, brought_by, targets)
        if not landed:  # between the import's collection and its merges
            landed.append(service.merge(p, q).entity_id)

    monkeypatch.setattr(AuthorityImport, "_collect_import_targets", collect_then_merge)
    report = service.import_lines([rec("S1", "Sprocket Name", "tool")])
    assert landed == [q]
    assert report.merged == 1
    assert service.get_entity(q).redirect_to == "S1"
    assert service.get_entity(p).redirect_to == "S1"
    r = service.resolve("Sprocket-Name", "tool", lookup_only=True)
    assert (r.entity_id, r.candidates) == ("S1", ("S1",))


@pytest.mark.parametrize("order", ["name-first", "typo-first"])
def test_import_merges_do_not_depend_on_record_order(service: IdentityService,
                                                     order: str) -> None:
    """A provisional entity that rule 3 would converge on for two new records, through two of
    its names, is linked to both rather than merged into whichever key came first: as when
    'several canonical entities of compatible type share that key'."""
    p = new_id(service, "Transformer", "method")
    r = service.resolve("Transformr", "method")  # a typo: recorded on p as a surface form
    assert (r.entity_id, r.match_kind) == (p, TYPO)
    records = [rec("M1", "Transformer", "method"), rec("M2", "Transformr", "method")]
    load(service, *(records if order == "name-first" else records[::-1]))
    assert service.get_entity(p).status is Status.PROVISIONAL
    assert links(service) == {pair(p, "M1"), pair(p, "M2")}


def test_an_import_merges_only_into_records_the_entity_could_converge_on(
        service: IdentityService) -> None:
    """'every provisional, non-placeholder entity of compatible type that rule 3 would
    converge on ... is merged into it': an entity whose type the record does not take is left
    alone, even where an older canonical entity of a type it does take holds the same key."""
    load(service, rec("C1", "Maria Lab", "other"))
    p = new_id(service, "Mario Holdings", "organization")
    for entity_id in (p, "C1"):
        service.add_alias(entity_id, "Mario")
    report = service.import_lines([rec("C2", "Mario", "person")])
    assert (report.merged, report.linked) == (0, 0)
    assert service.get_entity(p).status is Status.PROVISIONAL
    # A record of a type it takes does count, and with C1 sharing the key it is linked to both.
    report = service.import_lines([rec("C3", "Mario", "organization")])
    assert (report.merged, report.linked) == (0, 1)
    assert {pair(p, "C1"), pair(p, "C3")} <= links(service)


def test_import_refuses_bad_records_with_line_numbers(service: IdentityService) -> None:
    """'An id that looks like a provisional id, or that was merged away, is refused for that
    record'; 'a record with an empty or unknown type is refused, with its line number'."""
    p = new_id(service, "Some Provisional", "tool")
    load(service, rec("M1", "Merged One", "tool"), rec("M2", "Merged Two", "tool"))
    service.merge("M1", "M2")
    lines = [
        rec("R1", "Good One", "tool"),
        rec(p, "Hijack", "tool"),
        rec("M1", "Revived", "tool"),
        rec("R4", "Bad Type", "spaceship"),
        rec("R5", "Empty Type", ""),
        rec("R6", "Written Other", "other"),
        rec("R7", "Bad Type Two", "persons"),
    ]
    report = service.import_lines(lines)
    assert sorted(e.line for e in report.errors) == [2, 3, 4, 5, 7]
    assert service.get_entity("R1").name == "Good One"
    assert service.get_entity("R6").entity_type == "other"
    assert service.get_entity(p).name == "Some Provisional"
    assert service.get_entity("M1").status is Status.MERGED
    for refused in ("R4", "R5", "R7"):
        with pytest.raises(EntityNotFound):
            service.get_entity(refused)


def test_a_record_that_is_not_unicode_or_oversized_costs_only_itself(
        service: IdentityService) -> None:
    """JSON can spell a lone surrogate (\\ud800), which is no character: the record's
    transaction failed whole, losing the good records beside it."""
    lines = [rec("G1", "Good One", "tool"),
             '{"id": "S1", "name": "Lone\\ud800x", "type": "tool"}',
             '{"id": "S2", "name": "Fine", "type": "tool", "aliases": ["a\\udfffb"]}',
             '{"id": "S\\ud800", "name": "Fine Too", "type": "tool"}',
             rec("T1", "Typed", "t" * 200),
             rec("L1", "n" * 513, "tool"),
             rec("L2", "Long Alias", "tool", "ok", "a" * 600),
             rec("G2", "Good Two", "tool")]
    report = service.import_lines(lines)
    assert [(e.line, e.message.split(":")[0].split(" (")[0]) for e in report.errors] == [
        (2, "name contains a lone surrogate"), (3, "an alias contains a lone surrogate"),
        (4, "id contains a lone surrogate"), (5, "type is 200 characters long; the limit is 128"),
        (6, "name is 513 code points long; the limit is 512"), (7, "alias 2")]
    assert "is 600 code points long; the limit is 512" in report.errors[-1].message
    assert (report.imported, service.get_entity("G2").name) == (2, "Good Two")


def test_import_says_why_a_name_is_refused(service: IdentityService) -> None:
    report = service.import_lines([rec("R1", "  ", "tool"), rec("R2", "?!", "tool")])
    assert [(e.line, e.message) for e in report.errors] == [
        (1, "empty name"), (2, "name '?!' has no letters, digits or symbols")]


def test_import_csv_line_numbers(service: IdentityService) -> None:
    """Authority files may be 'CSV with a header: id, name, type, aliases, the CSV's aliases
    separated by |'; refusals carry the line number."""
    report = service.import_lines(["id,name,type,aliases\n", "C1,Deep Net,method,DN|D-Net\n",
                                   "C2,Bad,,\n", "C3,Other Bad,spaceship,\n"], "csv")
    assert sorted(e.line for e in report.errors) == [3, 4]
    assert set(service.get_entity("C1").aliases) == {"DN", "D-Net"}


# -- evidence, batches, idempotency ----------------------------------------------------------------


def test_evidence_counted_per_paper(service: IdentityService) -> None:
    """'each resolve made with a context (the paper id), unless lookup-only, records that the
    entity was seen in that paper under that spelling'."""
    load(service, rec("Q1", "Ada Lovelace", "person"))
    service.resolve("Ada Lovelace", "person", context_id="p1")
    service.resolve("ada lovelace", "person", context_id="p1")
    service.resolve("Ada Lovelace", "person", context_id="p2")
    service.resolve("Ada Lovelace", "person")  # no context: no evidence
    service.resolve("Ada Lovelace", "person", context_id="p3", lookup_only=True)
    view = service.get_entity("Q1")
    assert (view.evidence_count, view.paper_count) == (3, 2)


def test_evidence_survives_promotion(service: IdentityService) -> None:
    """'Evidence survives promotion and merging.' Promotion keeps the id."""
    p = new_id(service, "Fresh Method", "method", context_id="p1")
    view = service.promote(p)
    assert (view.entity_id, view.status, view.paper_count) == (p, Status.CANONICAL, 1)
    assert service.promote(p).status is Status.CANONICAL  # a no-op


BATCH = [
    ("Ada Lovelace", "person"),
    ("ada lovelace", "person"),
    ("Brand New Thing", "tool"),
    ("brand-new thing", "tool"),
    ("Mario", "person"),
    ("Maria", "person"),
    ("", "person"),
    ("John Smith", "person"),
    ("John Smith", "person"),
    ("Graphene", "other"),
    ("graphene", "material"),
    ("Transfomer", "method"),
    ("x" * 513, "tool"),
]
BATCH_AUTHORITY = [rec("Q1", "Ada Lovelace", "person"), rec("J1", "John Smith", "person"),
                   rec("J2", "John Smith", "person"), rec("QT", "Transformer", "method")]


def test_batch_equals_one_at_a_time(service: IdentityService,
                                    make_service: Callable[..., IdentityService]) -> None:
    """'Its reply keeps request order and equals resolving the mentions one at a time in that
    order, so a spelling first seen early in the batch is found by later ones.' 'An invalid item
    gets its own error in the reply and the others are resolved'."""
    load(service, *BATCH_AUTHORITY)
    other = make_service("one-at-a-time")
    load(other, *BATCH_AUTHORITY)
    batch = service.resolve_batch("paper-1", BATCH)
    assert len(batch) == len(BATCH)
    for (text, etype), got in zip(BATCH, batch):
        try:
            single: ResolveResult | None = other.resolve(text, etype, context_id="paper-1")
        except InvalidArgument:
            single = None
        if single is None:
            assert isinstance(got, ItemError) and got.code == "INVALID_ARGUMENT"
        else:
            assert got == single
    assert isinstance(batch[3], ResolveResult) and isinstance(batch[2], ResolveResult)
    assert (batch[3].entity_id, batch[3].match_kind) == (batch[2].entity_id, PUNCT)
    assert [service.get_entity(i).evidence_count for i in ("Q1", "J1")] == [
        other.get_entity(i).evidence_count for i in ("Q1", "J1")]


def test_batch_replay_is_idempotent(service: IdentityService) -> None:
    """'the same request again ... returns the reply the first one got, ids and kinds included,
    and writes nothing (no evidence is counted twice)'; 'a request that differs in any way is
    resolved afresh'."""
    load(service, *BATCH_AUTHORITY)
    first = service.resolve_batch("paper-1", BATCH)
    new = [r for r in first if isinstance(r, ResolveResult) and r.created]
    assert new, "the batch must create something for the replay to be meaningful"
    changes = service.list_changes(0)
    ids = sorted({r.entity_id for r in first if isinstance(r, ResolveResult)})
    evidence = [service.get_entity(i).evidence_count for i in ids]
    again = service.resolve_batch("paper-1", BATCH)
    assert again == first
    assert service.list_changes(0) == changes
    assert [service.get_entity(i).evidence_count for i in ids] == evidence
    look = service.resolve_batch("paper-1", BATCH, lookup_only=True)  # current state
    assert [r.created for r in look if isinstance(r, ResolveResult)] == [False] * len(
        [r for r in look if isinstance(r, ResolveResult)])
    assert service.list_changes(0) == changes
    retyped = [(t, e.upper()) for t, e in BATCH]  # differs in any way: resolved afresh
    service.resolve_batch("paper-1", retyped)
    assert service.get_entity("Q1").evidence_count > evidence[ids.index("Q1")]
    fresh = service.resolve_batch("paper-2", BATCH)
    assert [r.created for r in fresh if isinstance(r, ResolveResult)] == [
        False] * len([r for r in fresh if isinstance(r, ResolveResult)])
    assert service.get_entity("Q1").paper_count == 2


# -- invalid mentions ------------------------------------------------------------------------------

INVALID = [
    ("empty", ""),
    ("spaces", "   \t\n"),
    ("ideographic-space", "\u3000\u00a0"),
    ("zero-width-only", "\u200b\u200d\ufeff"),
    ("controls-only", "\x00\x1c\x1f"),
    ("punctuation-only", "!!!"),
    ("dots", "..."),
    ("dashes-and-spaces", "- \u2014 -"),
    ("513-code-points", "a" * 513),
    ("513-emoji", "\U0001f600" * 513),
    ("nfkc-expands-past-512", "\ufb01" * 257),
]
VALID = [
    ("512-code-points", "a" * 512),
    ("512-emoji", "\U0001f600" * 512),
    ("long-white-space-collapses", "a" + " " * 1000 + "b"),
    ("zero-width-do-not-count", "a" * 512 + "\u200b" * 100),
    ("sharp-only", "#"),
    ("symbol-only", "+"),
    ("superscript-digit", "\u00b2"),
]


@pytest.mark.parametrize("mention", [m for _, m in INVALID], ids=[i for i, _ in INVALID])
def test_invalid_mentions(service: IdentityService, mention: str) -> None:
    """'A mention whose display form is empty', 'whose key is empty (punctuation only)' or whose
    display form exceeds 512 code points is INVALID_ARGUMENT; nothing is written."""
    with pytest.raises(InvalidArgument):
        service.resolve(mention, "tool", context_id="p1")
    with pytest.raises(InvalidArgument):
        service.resolve(mention, "tool", lookup_only=True)
    out = service.resolve_batch("p1", [("Fine Mention", "tool"), (mention, "tool")])
    assert isinstance(out[0], ResolveResult) and out[0].created
    assert isinstance(out[1], ItemError) and out[1].code == "INVALID_ARGUMENT"


@pytest.mark.parametrize("mention", [m for _, m in VALID], ids=[i for i, _ in VALID])
def test_valid_edge_mentions(service: IdentityService, mention: str) -> None:
    """Limits count the display form's code points, not bytes or raw characters."""
    r = service.resolve(mention, "tool")
    assert r.created and r.display_form == service.resolve(mention, "tool").name


def test_batch_size_limit(service: IdentityService) -> None:
    """'a batch at most 5,000 mentions; beyond them INVALID_ARGUMENT for ... the request'."""
    with pytest.raises(InvalidArgument):
        service.resolve_batch("p1", [(f"Thing {i}", "tool") for i in range(5001)])
    assert service.list_changes(0) == []


def test_invalid_mention_writes_nothing(service: IdentityService) -> None:
    """Bad input 'gets a clear error and loses nothing else' - and writes nothing."""
    with pytest.raises(InvalidArgument):
        service.resolve("?!", "tool", context_id="p1")
    assert service.list_changes(0) == []


def _view_names(view: EntityView) -> tuple[str, tuple[str, ...], tuple[str, ...]]:
    return view.name, view.aliases, view.surface_forms


def test_stored_names_are_display_forms(service: IdentityService) -> None:
    """'Every stored name (authority names and aliases, added aliases, surface forms) is kept in
    display form.'"""
    load(service, rec("Q", "\uff2d\uff45\uff4d  Castle\u200b", "tool", " \ufb01le\tstore "))
    service.add_alias("Q", "Mem\u00a0\u00a0Castle\u202e Pro")
    service.resolve("mem\u3000castle", "tool")
    assert _view_names(service.get_entity("Q")) == (
        "Mem Castle", ("file store", "Mem Castle Pro"), ("mem castle",))


def test_settle_same_prefers_non_placeholder_over_older_placeholder(
    service: IdentityService,
) -> None:
    """'the better-ranked entity is the target: canonical before provisional, a non-placeholder
    before a placeholder, then the older one'; weak links go to the best-ranked candidate, here a
    same-typed placeholder ahead of canonical `other` entities."""
    load(service, rec("J1", "Mario", "other"), rec("J2", "Mario", "other"))
    ph = service.resolve("Mario", "person")
    assert (ph.match_kind, ph.entity_type) == (AMBIG, "person")
    p = service.resolve("Maria", "person")
    assert (p.match_kind, p.candidates) == (NEW, (ph.entity_id, "J1", "J2"))
    assert p.possibly_same_as == (ph.entity_id,)
    view = service.settle(ph.entity_id, p.entity_id, "same", actor="curator", reason="same")
    assert view.entity_id == p.entity_id
    assert service.get_entity(ph.entity_id).redirect_to == p.entity_id
    assert service.get_entity(p.entity_id).surface_forms == ("Mario",)
