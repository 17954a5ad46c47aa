"""The rules of SPEC section 2 over the name index: pure, no I/O.

`decide` answers "which entity is this mention about?" without changing anything; the service
turns its Decision into writes (a new entity, a surface form, a placeholder, links).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Collection, Iterable, Sequence
from typing import NamedTuple, Protocol

from identity_server.domain import (
    OTHER,
    Entity,
    MatchKind,
    Name,
    NameKind,
    Rule,
    Status,
    compatible,
)
from identity_server.normalize import fold, key, one_edit_apart

STRONG_TYPO_KEY = 6  # SPEC: the shorter key has 6+ characters
WEAK_TYPO_KEY = 4  # 4 or 5 characters: a weak candidate, linked but never converged on
MIN_PUNCTUATION_KEY = 3


class Outcome(enum.Enum):
    CONVERGED = "converged"
    AMBIGUOUS = "ambiguous"
    WEAK = "weak"
    NEW = "new"


# Enum members the rules read for every candidate, bound to module names: on Python 3.11 reading
# one off its class goes through EnumType's slow attribute path (benchmarks/RESULTS.md, rows
# "3 core"; docs/decisions.md).
_CONVERGED, _AMBIGUOUS, _WEAK = Outcome.CONVERGED, Outcome.AMBIGUOUS, Outcome.WEAK
_CANONICAL, _MERGED = Status.CANONICAL, Status.MERGED
_ALIAS, _SURFACE = NameKind.ALIAS, NameKind.SURFACE
_EXACT, _CASE, _PUNCTUATION, _TYPO = Rule.EXACT, Rule.CASE, Rule.PUNCTUATION, Rule.TYPO


class IndexView(Protocol):
    """What the rules need from an index: lookups by key (which serve rules 1 to 3: equal
    display forms and equal casefolded forms have equal keys) and by typo variants."""

    def get(self, entity_id: str) -> Entity | None: ...
    def with_key(self, k: str) -> Collection[str]: ...
    def typo_neighbours(self, k: str) -> Iterable[tuple[str, Collection[str]]]: ...


class Candidate(NamedTuple):
    entity: Entity
    matched_name: str  # the first matching name: name, aliases, surface forms, in recorded order
    alias_only: bool  # every name of the entity that matched at the rule is an alias


class Decision(NamedTuple):
    """What the rules decided for one mention (display form and normalised type)."""

    outcome: Outcome
    rule: Rule | None
    candidates: tuple[Candidate, ...]  # the deciding rule's, best rank first, ties by creation
    best: tuple[Candidate, ...]  # the best-ranked among them

    @property
    def winner(self) -> Candidate | None:
        return self.best[0] if self.outcome is _CONVERGED else None

    @property
    def match_kind(self) -> MatchKind:
        outcome = self.outcome
        if outcome is not _CONVERGED:
            return MatchKind.AMBIGUOUS if outcome is _AMBIGUOUS else MatchKind.NEW
        assert self.rule is not None
        if self.rule is not _TYPO and self.best[0].alias_only:
            return MatchKind.ALIAS
        return _KIND_OF_RULE[self.rule]


_KIND_OF_RULE = {Rule.EXACT: MatchKind.EXACT, Rule.CASE: MatchKind.CASE,
                 Rule.PUNCTUATION: MatchKind.PUNCTUATION, Rule.TYPO: MatchKind.TYPO}
NEW_DECISION = Decision(Outcome.NEW, None, (), ())
# Every decide() makes a Decision and a Candidate or more: built by tuple.__new__ from all their
# fields, in order, without the NamedTuple's generated __new__ (a Python frame each; rows "3 core").
_new_candidate = functools.partial(tuple.__new__, Candidate)
_new_decision = functools.partial(tuple.__new__, Decision)


def rank(entity: Entity, mention_type: str) -> tuple[int, int]:
    """(1) same type (both `other` counts) before a match through `other`; (2) canonical first."""
    return (
        0 if entity.entity_type == mention_type else 1,
        0 if entity.status is _CANONICAL else 1,
    )


def decide(index: IndexView, display: str, mention_type: str, k: str | None = None) -> Decision:
    """Apply rules 1-4 in order; the first rule with a compatible candidate decides. `k`: the
    display form's key, when the caller has it already."""
    if k is None:
        k = key(display)
    same_key = index.with_key(k)  # every entity rules 1 to 3 can match is among these
    if not same_key:  # rules 1 to 3 have no candidate
        return _typo(index, k, mention_type)

    found = _candidates(
        index, same_key, mention_type, lambda e: e.with_display(display)
    )
    if found:
        return _decided(_EXACT, found, mention_type)
    folded = fold(display)
    found = _candidates(
        index, same_key, mention_type, lambda e: e.with_folded(folded)
    )
    if found:
        return _decided(_CASE, found, mention_type)
    found = _candidates(
        index, same_key, mention_type, lambda e: [n for n in e.names if n.key == k]
    )
    if found:
        if len(k) >= MIN_PUNCTUATION_KEY:
            return _decided(_PUNCTUATION, found, mention_type)
        return _weak(_PUNCTUATION, found, mention_type)
    return _typo(index, k, mention_type)


def pair_candidates(index: IndexView, placeholder: Entity,
                    display: str) -> tuple[Candidate, ...]:
    """The best-ranked candidates of a placeholder's (display form, type) pair, decided as if
    the placeholder did not exist (once it does, the pair usually finds it alone at rule 1):
    what the placeholder is to be linked to, candidates that appeared since included.
    `display`: the pair's display form (a placeholder merged away has no name of its own)."""
    d = decide(_Without(index, placeholder.entity_id), display, placeholder.entity_type)
    return d.best if d.outcome in (Outcome.AMBIGUOUS, Outcome.CONVERGED) else ()


class _Without:
    """An index view that does not see one entity."""

    __slots__ = ("_hidden", "_index")

    def __init__(self, index: IndexView, hidden: str) -> None:
        self._index = index
        self._hidden = hidden

    def get(self, entity_id: str) -> Entity | None:
        return None if entity_id == self._hidden else self._index.get(entity_id)

    def with_key(self, k: str) -> Collection[str]:
        return self._index.with_key(k)

    def typo_neighbours(self, k: str) -> Iterable[tuple[str, Collection[str]]]:
        return self._index.typo_neighbours(k)


def _typo(index: IndexView, k: str, mention_type: str) -> Decision:
    """Rule 4 over names and aliases; strong pairs (shorter key 6+) outrank weak ones (4-5)."""
    strong: dict[str, set[str]] = {}  # entity id -> the anchor keys through which it matched
    weak: dict[str, set[str]] = {}
    for anchor, ids in index.typo_neighbours(k):
        shorter = min(len(anchor), len(k))
        if shorter < WEAK_TYPO_KEY or not one_edit_apart(k, anchor):
            continue
        bucket = strong if shorter >= STRONG_TYPO_KEY else weak
        for eid in ids:
            bucket.setdefault(eid, set()).add(anchor)
    for bucket, decided in ((strong, _decided), (weak, _weak)):
        found = _candidates(
            index,
            bucket,
            mention_type,
            lambda e, b=bucket: _anchors_with_keys(e, b[e.entity_id]),  # type: ignore[misc]
        )
        if found:
            return decided(_TYPO, found, mention_type)
    return NEW_DECISION


def _anchors_with_keys(e: Entity, keys: set[str]) -> list[Name]:
    """e's name and aliases (never surface forms) whose key is one of `keys`, in order. The
    surface forms come last in `names`, and a much-mentioned entity has thousands: stop there."""
    found = []
    for n in e.names:
        if n.kind is _SURFACE:
            break
        if n.key in keys:
            found.append(n)
    return found


def _candidates(
    index: IndexView,
    ids: Iterable[str],
    mention_type: str,
    matching: Callable[[Entity], Sequence[Name]],
) -> list[Candidate]:
    """Compatible entities among ids, each with its matching names; sorted by rank, then age."""
    out: list[Candidate] = []
    for eid in ids:
        entity = index.get(eid)
        if entity is None or entity.status is _MERGED or not compatible(entity, mention_type):
            continue
        matched = matching(entity)  # entity.names is already in matched_name order
        if not matched:
            continue
        alias_only = (matched[0].kind is _ALIAS if len(matched) == 1
                      else all(n.kind is _ALIAS for n in matched))
        out.append(_new_candidate((entity, matched[0].display, alias_only)))
    if len(out) > 1:
        out.sort(key=lambda c: (rank(c.entity, mention_type), c.entity.ordinal))
    return out


def _best(found: list[Candidate], mention_type: str) -> tuple[Candidate, ...]:
    if len(found) == 1:
        return (found[0],)
    top = rank(found[0].entity, mention_type)
    return tuple(c for c in found if rank(c.entity, mention_type) == top)


def _decided(rule: Rule, found: list[Candidate], mention_type: str) -> Decision:
    best = _best(found, mention_type)
    outcome = _CONVERGED if len(best) == 1 else _AMBIGUOUS
    return _new_decision((outcome, rule, tuple(found), best))


def _weak(rule: Rule, found: list[Candidate], mention_type: str) -> Decision:
    return _new_decision((_WEAK, rule, tuple(found), _best(found, mention_type)))


__all__ = [
    "NEW_DECISION",
    "OTHER",
    "Candidate",
    "Decision",
    "IndexView",
    "Outcome",
    "decide",
    "pair_candidates",
    "rank",
]
