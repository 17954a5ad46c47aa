"""Resolve, call after call, against a model of SPEC section 2 that keeps its own state.

`test_matching_oracle` checks one decision over a fixed world. This checks what the decisions
do to the world: surface forms recorded on convergence, provisional `other` entities taking a
mention's type, one placeholder per ambiguous (display form, type) pair, `possibly_same_as`
links for ambiguous and weak outcomes and for a placeholder's candidates that appear later, and
every field of every reply; evidence under each paper, automatic promotion at the configured
paper count (merged entities' evidence counted with their target's) and by an admin, and a
repeated batch answered with its first reply, an invalid item's own error; calls made at once
giving some one-at-a-time order's outcome; on SQLite and PostgreSQL, by one service or by two
sharing the database, in-process or through gRPC servers. The model shares nothing with identity_server's matching, index or
service code: it rescans its own list of entities for each rule. It uses the display-form, key
and one-edit functions, which are the spec's definitions (tested on their own).
"""

from __future__ import annotations

import copy
import itertools
import json
import random
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple, Protocol, TypedDict, cast

import pytest

from identity_server.domain import Entity, MatchKind, Status
from identity_server.errors import FailedPrecondition, InvalidArgument
from identity_server.importing import ImportReport
from identity_server.normalize import WHITE_SPACE, display_form, key, one_edit_apart
from identity_server.server import build_service
from identity_server.service import (
    EntityView,
    IdentityService,
    ItemError,
    ResolveResult,
)
from identity_server.settings import Settings
from identity_server.store import ChangeRecord, LinkRow
from tests.unit.test_matching_oracle import perturb

OTHER = "other"
INVALID_ARGUMENT = "INVALID_ARGUMENT"
TYPES = ("person", "organization", "place", "method", "dataset", "task", "metric", "material",
         "tool", "concept", "other")
PAPERS = ("paper-1", "paper-2", "paper-3", "paper-4", "", "")  # "": no context, no evidence
RAW_TYPES = ("person", "method", "dataset", "other", " Person ", "METHOD", "", "wizard")
BASE_NAMES = (
    "Ada Lovelace", "Alan Turing", "Grace Hopper", "Maria", "Mario", "Marie Curie", "BERT",
    "RoBERTa", "ResNet-50", "ResNet 50", "Windows 10", "Windows 1.0", "COVID-19", "C#", "C",
    "C++", "Go", "GPT-3", "ImageNet", "Image Net", "MNIST", "CIFAR-10", "Mem-Castle",
    "Transformer", "Transformers", "Adam", "Adams", "SQuAD v1.1", "Straße", "café", "LSTM",
    "Long Short-Term Memory", "Mercury", "Mercury Planet", "Jaguar", "Jaguars", "Amazon",
    "Word2Vec", "word2vec", "Random Forest", "Random Forests", "Al Turing",
)


class Record(TypedDict):
    """An authority record, as the import reads it."""

    id: str
    name: str
    type: str
    aliases: list[str]


# -- the model ------------------------------------------------------------------------------------


@dataclass
class ModelEntity:
    entity_id: str
    entity_type: str
    canonical: bool
    ordinal: int
    placeholder: bool = False
    merged_into: ModelEntity | None = None
    # The aliases the authority gave (a re-import that no longer lists one retires it), and
    # those of them the entity held as surface forms (dropped, they are surface forms again).
    authority: set[str] = field(default_factory=set)
    seen: set[str] = field(default_factory=set)
    # (display form, kind) with kind "name", "alias" or "surface", in matched_name order: the
    # name, aliases and surface forms, each kind in the order recorded.
    names: list[tuple[str, str]] = field(default_factory=list)

    def add(self, display: str, kind: str) -> None:
        order = {"name": 0, "alias": 1, "surface": 2}
        self.names.append((display, kind))
        self.names.sort(key=lambda n: order[n[1]])  # stable: each kind keeps its order


@dataclass(frozen=True)
class Reply:
    entity_id: str
    status: Status | None
    match_kind: MatchKind
    created: bool
    possibly_same_as: frozenset[str]
    candidates: tuple[str, ...]
    name: str
    matched_name: str
    entity_type: str
    display_form: str


class Model:
    """SPEC section 2, read literally, over a list of entities."""

    def __init__(self, promote_after: int = 0) -> None:
        self.entities: list[ModelEntity] = []
        self.placeholders: dict[tuple[str, str], ModelEntity] = {}
        self.links: set[frozenset[str]] = set()  # open possibly_same_as links
        self.distinct: set[frozenset[str]] = set()  # pairs a curator called distinct
        self.promote_after = promote_after  # papers that promote a provisional entity; 0: never
        self.seen: list[tuple[ModelEntity, str]] = []  # evidence: (entity recorded on, paper)
        self.batches: dict[tuple[str, tuple[tuple[str, str], ...]], list[Reply | None]] = {}
        self._made = 0

    def add_canonical(self, entity_id: str, name: str, entity_type: str,
                      aliases: list[str]) -> None:
        e = ModelEntity(entity_id, entity_type, True, len(self.entities) + 1)
        e.add(display_form(name), "name")
        for display in map(display_form, aliases):
            if all(display != n[0] for n in e.names):
                e.add(display, "alias")
                e.authority.add(display)
        self.entities.append(e)

    def _new(self, display: str, entity_type: str, *, placeholder: bool) -> ModelEntity:
        self._made += 1
        e = ModelEntity(f"new{self._made}", entity_type, False, len(self.entities) + 1,
                        placeholder)
        e.add(display, "name")
        self.entities.append(e)
        return e

    @staticmethod
    def mention_type(raw: str) -> str:
        t = raw.strip("".join(WHITE_SPACE)).casefold()
        return t if t in TYPES else OTHER

    @staticmethod
    def types_compatible(x: str, y: str) -> bool:
        return x == y or OTHER in (x, y)

    @staticmethod
    def compatible(e: ModelEntity, t: str) -> bool:
        if e.placeholder:
            return e.entity_type == t
        return Model.types_compatible(e.entity_type, t)

    @staticmethod
    def rank(e: ModelEntity, t: str) -> tuple[int, int]:
        return (0 if e.entity_type == t else 1, 0 if e.canonical else 1)

    def decide(self, display: str, t: str, *, without: ModelEntity | None = None
               ) -> tuple[str, MatchKind, list[ModelEntity], list[ModelEntity], str]:
        """(outcome, kind, candidates in order, best-ranked, matched name of the first best)."""
        k = key(display)

        def rule(matches: Callable[[str], bool], anchors_only: bool = False
                 ) -> list[tuple[ModelEntity, list[tuple[str, str]]]]:
            found = []
            for e in self.entities:
                if e is without or e.merged_into is not None or not self.compatible(e, t):
                    continue
                names = [n for n in e.names
                         if not (anchors_only and n[1] == "surface") and matches(n[0])]
                if names:
                    found.append((e, names))
            found.sort(key=lambda x: (self.rank(x[0], t), x[0].ordinal))
            return found

        def outcome(found: list[tuple[ModelEntity, list[tuple[str, str]]]], kind: MatchKind,
                    weak: bool) -> tuple[str, MatchKind, list[ModelEntity], list[ModelEntity], str]:
            top = self.rank(found[0][0], t)
            best = [x for x in found if self.rank(x[0], t) == top]
            everyone = [e for e, _ in found]
            matched = best[0][1][0][0]
            if weak:
                return "weak", MatchKind.NEW, everyone, [e for e, _ in best], matched
            if len(best) > 1:
                return "ambiguous", MatchKind.AMBIGUOUS, everyone, [e for e, _ in best], matched
            if kind is not MatchKind.TYPO and all(n[1] == "alias" for n in best[0][1]):
                kind = MatchKind.ALIAS
            return "converged", kind, everyone, [best[0][0]], matched

        found = rule(lambda n: n == display)
        if found:
            return outcome(found, MatchKind.EXACT, weak=False)
        found = rule(lambda n: n.casefold() == display.casefold())
        if found:
            return outcome(found, MatchKind.CASE, weak=False)
        found = rule(lambda n: key(n) == k)
        if found:
            return outcome(found, MatchKind.PUNCTUATION, weak=len(k) < 3)
        if len(k) >= 4:
            for least, weak in ((6, False), (4, True)):

                def typo(n: str, least: int = least) -> bool:
                    return min(len(k), len(key(n))) >= least and one_edit_apart(k, key(n))

                found = rule(typo, anchors_only=True)
                if found:
                    return outcome(found, MatchKind.TYPO, weak=weak)
        return "new", MatchKind.NEW, [], [], ""

    def reimport(self, r: Record) -> None:
        """SPEC section 3: re-importing an id replaces what the authority said (name, type,
        aliases); its previous name stays as an alias, and aliases added by curators or
        merges stay (as do surface forms). A name recorded in a new role goes after the names
        already in that role; an alias the authority no longer lists is retired, or, when the
        entity held it as a surface form before the authority listed it, a surface form again
        ('nothing is ever deleted')."""
        e = self.entity(r["id"])
        name = display_form(r["name"])
        listed = [a for a in dict.fromkeys(display_form(x) for x in r["aliases"]) if a != name]
        old_name = e.names[0][0]

        def assign(display: str, kind: str) -> None:
            held = dict(e.names).get(display)
            if held == kind:
                return
            if held is not None:
                e.names.remove((display, held))
            e.add(display, kind)

        if old_name != name:
            assign(old_name, "alias")
            e.authority.discard(old_name)
            e.seen.discard(old_name)
        for display in [n for n, kind in e.names if kind == "alias" and n in e.authority]:
            if display not in listed and display != name:
                e.names.remove((display, "alias"))
                if display in e.seen:
                    e.add(display, "surface")
                e.authority.discard(display)
                e.seen.discard(display)
        assign(name, "name")
        e.authority.discard(name)
        e.seen.discard(name)
        for a in listed:
            held = dict(e.names).get(a)
            if held != "alias":
                e.authority.add(a)
            if held == "surface":
                e.seen.add(a)
            assign(a, "alias")
        e.entity_type = r["type"]

    def import_canonicals(self, records: list[Record]) -> None:
        """New canonical records, then the import merges (SPEC section 3): each provisional,
        non-placeholder entity holding a key of the records' names (3+ characters) goes into
        the one canonical entity of compatible type holding that key too, or is linked to
        each of several. The records are created first (a placeholder pair's best candidate
        for a moment is linked, as the service's import commits them before it merges), and
        the targets are found before any merge is made."""
        known = {e.entity_id for e in self.entities}
        for r in records:
            if r["id"] in known:
                self.reimport(r)
            else:
                self.add_canonical(r["id"], r["name"], r["type"], r["aliases"])
        self._link_placeholders_to_later_candidates()  # the records are there before the merges
        brought: dict[str, set[str]] = {}  # key -> the types of the records that brought it
        for r in records:
            for s in [r["name"], *r["aliases"]]:
                if len(k := key(display_form(s))) >= 3:
                    brought.setdefault(k, set()).add(r["type"].strip().casefold())
        live = [e for e in self.entities if e.merged_into is None]
        targets: dict[str, list[ModelEntity]] = {}
        for p in live:
            if p.canonical or p.placeholder:
                continue
            # Only a record of compatible type merges p into itself (or, with other canonical
            # entities of compatible type holding the key, links it to each).
            held = {k for k in (key(n[0]) for n in p.names) if k in brought and any(
                self.types_compatible(t, p.entity_type) for t in brought[k])}
            targets[p.entity_id] = [
                c for c in live if c.canonical and held & {key(n[0]) for n in c.names}
                and self.types_compatible(c.entity_type, p.entity_type)]
        for p in live:
            found = targets.get(p.entity_id, [])
            if len(found) == 1 and frozenset((p.entity_id, found[0].entity_id)) \
                    not in self.distinct:
                self._merge(p, found[0])
            for c in found if len(found) > 1 else ():
                self._link(p, c)
        self._link_placeholders_to_later_candidates()

    def _merge(self, source: ModelEntity, target: ModelEntity) -> None:
        """The source's aliases become the target's aliases, its name an alias if it was
        canonical and a surface form if not, its surface forms surface forms (a spelling the
        target holds already stays as it is, but a surface form an alias of the source's
        becomes an alias); its links and settlements move to the target."""
        for display, kind in source.names:
            becomes = "alias" if kind == "alias" or (kind == "name" and source.canonical) \
                else "surface"
            held = dict(target.names)
            if display not in held:
                target.add(display, becomes)
            elif held[display] == "surface" and becomes == "alias":
                target.names.remove((display, "surface"))
                target.add(display, "alias")
            elif held[display] == "alias" and becomes == "alias":
                target.authority.discard(display)  # the merge's too: outlives the authority's
                target.seen.discard(display)
            elif held[display] == "alias" and display in target.authority:
                target.seen.add(display)  # a surface form of the merge's, once dropped
        source.merged_into = target

        def moved(pairs: set[frozenset[str]]) -> set[frozenset[str]]:
            out = set()
            for pair in pairs:
                if source.entity_id in pair:
                    (other,) = pair - {source.entity_id}
                    if other != target.entity_id:
                        out.add(frozenset((target.entity_id, other)))
            return out

        self.distinct |= moved(self.distinct)
        self.links = ({pair for pair in self.links if source.entity_id not in pair}
                      | moved(self.links)) - self.distinct

    def settle(self, pair: frozenset[str], same: bool) -> None:
        """A curator's decision on an open link: same merges the pair into the better-ranked
        entity (canonical, then not a placeholder, then older), distinct records it."""
        self.links.discard(pair)
        if not same:
            self.distinct.add(pair)
            return
        x, y = sorted((e for e in self.entities if e.entity_id in pair),
                      key=lambda e: (not e.canonical, e.placeholder, e.ordinal))
        self._merge(y, x)
        self._promote_when_due(x)
        self._link_placeholders_to_later_candidates()

    def merge(self, named_source: ModelEntity, named_target: ModelEntity) -> bool:
        """An admin merge, on the live entities the ids name; False (and nothing done) where
        SPEC section 3 makes it FAILED_PRECONDITION: incompatible types, a canonical entity into
        a provisional one, an entity into itself, a pair a curator called distinct. Merging an
        already merged pair again is a no-op."""
        source, target = self.live(named_source), self.live(named_target)
        if source is target and named_source is not named_target:
            return True
        if (source is target or not self.types_compatible(source.entity_type, target.entity_type)
                or (source.canonical and not target.canonical)
                or frozenset((source.entity_id, target.entity_id)) in self.distinct):
            return False
        self._merge(source, target)
        self._promote_when_due(target)
        self._link_placeholders_to_later_candidates()
        return True

    def promote(self, e: ModelEntity) -> None:
        """An admin promotion: the live entity becomes canonical (a no-op if it is); a
        placeholder too, since a curator may act on one."""
        self.live(e).canonical = True
        self._link_placeholders_to_later_candidates()

    def evidence(self, e: ModelEntity) -> tuple[int, int]:
        """(resolves recorded, distinct papers) on e and on every entity merged into it (SPEC
        section 3: evidence survives merging)."""
        papers = [paper for x, paper in self.seen if self.live(x) is e]
        return len(papers), len(set(papers))

    def _record_evidence(self, e: ModelEntity, paper: str) -> None:
        if paper:
            self.seen.append((e, paper))
            self._promote_when_due(e)

    def _promote_when_due(self, e: ModelEntity) -> None:
        """SPEC section 3: promoted automatically once its evidence comes from the configured
        number of distinct papers (placeholders excepted)."""
        if (self.promote_after and not e.canonical and not e.placeholder
                and self.evidence(e)[1] >= self.promote_after):
            e.canonical = True

    def add_alias(self, named: ModelEntity, alias: str) -> None:
        """A curator's alias, on the live entity the id names: a surface form becomes an alias;
        a name or alias stays where it is, but an alias the authority gave becomes the curator's
        too ('aliases added by curators ... stay' when a re-import drops it;
        docs/identity-server.md)."""
        e = self.live(named)
        display = display_form(alias)
        kind = dict(e.names).get(display)
        if kind in ("name", "alias"):
            e.authority.discard(display)
            e.seen.discard(display)
            return
        if kind == "surface":
            e.names.remove((display, "surface"))
        e.add(display, "alias")
        self._link_placeholders_to_later_candidates()

    def entity(self, entity_id: str) -> ModelEntity:
        return next(e for e in self.entities if e.entity_id == entity_id)

    def live(self, e: ModelEntity) -> ModelEntity:
        while e.merged_into is not None:
            e = e.merged_into
        return e

    def _link(self, x: ModelEntity, y: ModelEntity) -> bool:
        """Link an unordered pair, unless a curator called it distinct."""
        pair = frozenset((x.entity_id, y.entity_id))
        if pair in self.distinct or x is y:
            return False
        self.links.add(pair)
        return True

    def resolve(self, mention: str, raw_type: str, paper: str = "") -> Reply:
        display, t = display_form(mention), self.mention_type(raw_type)
        how, kind, candidates, best, matched = self.decide(display, t)
        linked: list[ModelEntity] = []
        created = how != "converged" and not (how == "ambiguous"
                                              and (display, t) in self.placeholders)
        if how == "converged":
            e = best[0]
            if all(n[0] != display for n in e.names):
                e.add(display, "surface")
            if not e.canonical and not e.placeholder and e.entity_type == OTHER and t != OTHER:
                e.entity_type = t
        elif how == "ambiguous":
            if created:
                self.placeholders[(display, t)] = self._new(display, t, placeholder=True)
            e, linked = self.live(self.placeholders[(display, t)]), best
        else:
            e, linked = self._new(display, t, placeholder=False), best
        linked = [other for other in linked if self._link(e, other)]
        self._record_evidence(e, paper)
        self._link_placeholders_to_later_candidates()
        return self._reply(e, kind, created, linked, candidates, matched, display)

    def resolve_batch(self, paper: str, mentions: list[tuple[str, str]]) -> list[Reply | None]:
        """SPEC section 4: one at a time in order, an invalid mention an error of its own
        (None) and the rest resolved; with a paper, the same request again gets the first
        one's reply and writes nothing."""
        request = (paper, tuple(mentions))
        if paper and request in self.batches:
            return self.batches[request]
        replies = [self.resolve(mention, raw_type, paper) if valid(mention) else None
                   for mention, raw_type in mentions]
        if paper:
            self.batches[request] = replies
        return replies

    def look(self, mention: str, raw_type: str) -> Reply:
        """Resolve with lookup_only: nothing written; the match kind and candidates a creating
        call would have, created false, no possibly_same_as, and an empty id and status (and
        name) where a creating call would make a new entity."""
        display, t = display_form(mention), self.mention_type(raw_type)
        how, kind, candidates, best, matched = self.decide(display, t)
        found: ModelEntity | None = None
        if how == "converged":
            found = best[0]
        elif how == "ambiguous" and (display, t) in self.placeholders:
            found = self.live(self.placeholders[(display, t)])
        if found is None:
            return Reply("", None, kind, False, frozenset(),
                         tuple(c.entity_id for c in candidates), "", matched, t, display)
        return self._reply(found, kind, False, [], candidates, matched, display)

    @staticmethod
    def _reply(e: ModelEntity, kind: MatchKind, created: bool, linked: list[ModelEntity],
               candidates: list[ModelEntity], matched: str, display: str) -> Reply:
        """The reply naming entity e."""
        return Reply(e.entity_id, Status.CANONICAL if e.canonical else Status.PROVISIONAL, kind,
                     created, frozenset(o.entity_id for o in linked),
                     tuple(c.entity_id for c in candidates), e.names[0][0], matched,
                     e.entity_type, display)

    def _link_placeholders_to_later_candidates(self) -> None:
        """Each placeholder is linked to every best-ranked candidate of its pair, decided as if
        it were not there, 'including candidates that appear later'; one merged away, whose
        pair's resolves follow its redirect, through the entity it redirects to (links are
        'read through redirects')."""
        for (display, t), p in self.placeholders.items():
            how, _, _, best, _ = self.decide(display, t, without=p)
            if how in ("converged", "ambiguous"):
                for other in best:
                    self._link(self.live(p), other)


# -- the comparison ---------------------------------------------------------------------------


class Service(Protocol):
    """What the comparison calls: IdentityService in-process, or a client of a real server
    (tests/integration/test_resolve_model_grpc.py)."""

    def resolve(self, mention: str, entity_type: str, *, context_id: str = "",
                lookup_only: bool = False) -> ResolveResult: ...

    def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> list[ResolveResult | ItemError]: ...

    def get_entity(self, entity_id: str) -> EntityView: ...

    def list_links(self, *, entity_id: str = "", page_size: int = 100,
                   page_token: str = "") -> tuple[list[LinkRow], str]: ...

    def add_alias(self, entity_id: str, alias: str) -> EntityView: ...

    def promote(self, entity_id: str) -> EntityView: ...

    def merge(self, source_id: str, target_id: str) -> EntityView: ...

    def settle(self, entity_id: str, other_id: str, decision: str, *, actor: str,
               reason: str) -> EntityView: ...

    def import_lines(self, lines: Iterable[str], fmt: str | None = None) -> ImportReport: ...

    def list_changes(self, after: int, limit: int | None = None) -> list[ChangeRecord]: ...

    def close(self) -> None: ...


def authority(rng: random.Random, count: int, first: int = 1) -> list[Record]:
    records: list[Record] = []
    for i in range(count):
        # Often one of a few names: several canonical entities sharing a name make ambiguity.
        few = rng.random() < 0.4
        name = rng.choice(BASE_NAMES[:6] if few else BASE_NAMES)
        drawn = dict.fromkeys(perturb(rng, rng.choice(BASE_NAMES))
                              for _ in range(rng.randrange(3)))  # in order: repeatable
        aliases = [a for a in drawn
                   if key(display_form(a)) and display_form(a) != display_form(name)]
        records.append(Record(id=f"Q{first + i}", name=name,
                              type=rng.choice(("person", OTHER) if few else TYPES),
                              aliases=aliases))
    return records


INVALID = ("", "   ", "...", "\u2014", "\u200b\u2060", "x" * 513)  # no display form or key; too long


def valid(mention: str) -> bool:
    """SPEC sections 2 and 4: a display form and a key that are not empty, and a display form
    of at most 512 code points (the default limit)."""
    display = display_form(mention)
    return bool(key(display)) and len(display) <= 512


def mention_of(rng: random.Random, base: str | None = None) -> tuple[str, str]:
    """A mention (never empty once normalised) and a raw type; of `base` if given."""
    while True:
        name = base or rng.choice(BASE_NAMES[:6] if rng.random() < 0.3 else BASE_NAMES)
        mention = perturb(rng, name) if rng.random() < 0.6 else name
        if key(display_form(mention)):
            return mention, rng.choice(RAW_TYPES)


class Call(NamedTuple):
    """One of several calls made at once: kind "resolve", "look" (lookup only) or "batch"."""

    kind: str
    paper: str
    mentions: list[tuple[str, str]]


class Run:
    """The services and the model side by side: each operation on both, then compared. With
    several services over one database (as server processes sharing it), each operation and
    each check goes to one of them at random: each must see what the others wrote."""

    def __init__(self, services: Sequence[Service], promote_after: int, seed: int) -> None:
        self.services = services
        self._pick = random.Random(f"pick-{seed}")  # the operations' stream stays the seed's
        self.model = Model(promote_after)
        self.ids: dict[str, str] = {}  # model id -> service id

    def import_records(self, records: list[Record]) -> None:
        report = self.service.import_lines([json.dumps(r) for r in records], "jsonl")
        assert (report.imported, report.errors) == (len(records), ()), report
        self.model.import_canonicals(records)
        self.ids.update({r["id"]: r["id"] for r in records})

    def settle(self, pair: frozenset[str], same: bool) -> None:
        x, y = (self.model.entity(i) for i in sorted(pair))
        ids = (self.ids[x.entity_id], self.ids[y.entity_id])
        if same and not Model.types_compatible(x.entity_type, y.entity_type):
            # Linked while one of them was `other`, typed since: merging them is refused.
            with pytest.raises(FailedPrecondition, match="incompatible types"):
                self.service.settle(*ids, "same", actor="curator", reason="model test")
            return
        self.service.settle(*ids, "same" if same else "distinct", actor="curator",
                            reason="model test")
        self.model.settle(pair, same)

    def merge(self, source: ModelEntity, target: ModelEntity) -> None:
        ids = (self.ids[source.entity_id], self.ids[target.entity_id])
        if self.model.merge(source, target):
            self.service.merge(*ids)
        else:
            with pytest.raises(FailedPrecondition):
                self.service.merge(*ids)

    def add_alias(self, e: ModelEntity, alias: str) -> None:
        self.service.add_alias(self.ids[e.entity_id], alias)
        self.model.add_alias(e, alias)

    def promote(self, e: ModelEntity) -> None:
        view = self.service.promote(self.ids[e.entity_id])
        self.model.promote(e)
        assert (view.entity_id, view.status) == (
            self.ids[self.model.live(e).entity_id], Status.CANONICAL)

    def resolve(self, mention: str, raw_type: str, paper: str = "") -> None:
        got = self.service.resolve(mention, raw_type, context_id=paper)
        self.check(got, self.model.resolve(mention, raw_type, paper), mention, raw_type)

    def look(self, mention: str, raw_type: str) -> None:
        got = self.service.resolve(mention, raw_type, lookup_only=True)
        want = self.model.look(mention, raw_type)
        assert self.reply(got) == self.mapped(want), (mention, raw_type, "lookup only")

    def resolve_batch(self, paper: str, mentions: list[tuple[str, str]]) -> None:
        """SPEC section 4: a batch 'equals resolving the mentions one at a time in that
        order'."""
        got = self.service.resolve_batch(paper, mentions)
        want = self.model.resolve_batch(paper, mentions)
        for g, w, (mention, raw_type) in zip(got, want, mentions, strict=True):
            if w is None:
                assert isinstance(g, ItemError) and g.code == INVALID_ARGUMENT, (mention, g)
                continue
            assert isinstance(g, ResolveResult), (mention, g)
            self.check(g, w, mention, raw_type)

    def resolve_invalid(self, mention: str, raw_type: str, paper: str) -> None:
        """An invalid mention: INVALID_ARGUMENT, nothing written."""
        with pytest.raises(InvalidArgument):
            self.service.resolve(mention, raw_type, context_id=paper)

    def check(self, got: ResolveResult, want: Reply, mention: str, raw_type: str) -> None:
        if want.created and want.entity_id not in self.ids:  # (a replayed reply's is mapped)
            assert got.created and got.entity_id not in self.ids.values(), (
                mention, raw_type, want, got)
            self.ids[want.entity_id] = got.entity_id
        assert self.reply(got) == self.mapped(want), (mention, raw_type)

    def resolve_together(self, calls: list[Call]) -> None:
        """Resolves, batches and lookups made at once from threads. SPEC section 2: 'the
        outcome of concurrent calls ... equals the outcome of some one-at-a-time order of the
        same calls'. Each order is played on a copy of the model; the replies must be one
        order's, and where orders giving these replies leave different states (two new
        spellings of one entity, say), the service's state says which order it was."""
        services = [self.service for _ in calls]
        start = threading.Barrier(len(calls))

        def call(i: int) -> list[ResolveResult | ItemError]:
            kind, paper, mentions = calls[i]
            start.wait(timeout=30)
            if kind == "batch":
                return services[i].resolve_batch(paper, mentions)
            (mention, raw_type), = mentions
            return [services[i].resolve(mention, raw_type, context_id=paper,
                                        lookup_only=kind == "look")]

        def played(model: Model, c: Call) -> list[Reply | None]:
            if c.kind == "batch":
                return model.resolve_batch(c.paper, c.mentions)
            (mention, raw_type), = c.mentions
            if c.kind == "look":
                return [model.look(mention, raw_type)]
            return [model.resolve(mention, raw_type, c.paper)]

        with ThreadPoolExecutor(len(calls)) as pool:
            got = list(pool.map(call, range(len(calls))))
        fits: dict[object, tuple[Model, dict[str, str]]] = {}
        known = set(self.ids)
        for order in itertools.permutations(range(len(calls))):
            model, ids = copy.deepcopy(self.model), dict(self.ids)
            if all(self._fits(g, w, ids) for i in order
                   for g, w in zip(got[i], played(model, calls[i]), strict=True)):
                fits.setdefault(self._state(model, ids, known), (model, ids))
        assert fits, ("no one-at-a-time order gives these replies", calls, got)
        if len(fits) > 1:
            model, ids = next(iter(fits.values()))
            now = self._service_state(model, ids, known)
            assert now in fits, ("the state is no one-at-a-time order's", calls)
            fits = {now: fits[now]}
        ((self.model, self.ids),) = fits.values()

    def _fits(self, got: ResolveResult | ItemError, want: Reply | None,
              ids: dict[str, str]) -> bool:
        """Whether got is the model's reply want (None: an item's error), mapping a created
        entity's id into ids."""
        if want is None or isinstance(got, ItemError):
            return want is None and isinstance(got, ItemError)
        if want.created and want.entity_id not in ids:  # (a replayed reply's is mapped)
            if not got.created or got.entity_id in ids.values():  # new, and not made before
                return False
            ids[want.entity_id] = got.entity_id
        return self.reply(got) == self.mapped(want, ids)

    @staticmethod
    def _state(model: Model, ids: dict[str, str], known: set[str]) -> object:
        """Every entity (in service ids), the open links, and the order the entities not
        `known` were created in (ties between candidates go by it), as the service would show
        them."""
        entities: list[tuple[object, ...]] = []
        for e in model.entities:
            if e.merged_into is not None:
                entities.append((ids[e.entity_id], ids[model.live(e).entity_id]))
            else:
                entities.append((ids[e.entity_id], e.entity_type, e.canonical, e.placeholder,
                                 tuple(n[0] for n in e.names), model.evidence(e)))
        links = frozenset(frozenset(ids[i] for i in pair) for pair in model.links)
        created = tuple(ids[e.entity_id] for e in model.entities if e.entity_id not in known)
        return tuple(sorted(entities, key=str)), links, created

    def _service_state(self, model: Model, ids: dict[str, str], known: set[str]) -> object:
        """`_state` read from the service (the creation order from its change feed), over the
        entities the model holds."""
        entities: list[tuple[object, ...]] = []
        for e in model.entities:
            v = self.service.get_entity(ids[e.entity_id])
            if v.status is Status.MERGED:
                entities.append((v.entity_id, v.redirect_to))
            else:
                entities.append((v.entity_id, v.entity_type, v.status is Status.CANONICAL,
                                 v.placeholder, (v.name, *v.aliases, *v.surface_forms),
                                 (v.evidence_count, v.paper_count)))
        links = frozenset(frozenset((link.a, link.b))
                          for link in self.service.list_links(page_size=1000)[0])
        new = {ids[e.entity_id] for e in model.entities if e.entity_id not in known}
        created = tuple(c.entity_id for c in self.service.list_changes(0)
                        if c.kind == "created" and c.entity_id in new)
        return tuple(sorted(entities, key=str)), links, created

    @property
    def service(self) -> Service:
        return self._pick.choice(self.services)

    @staticmethod
    def reply(got: ResolveResult) -> Reply:
        return Reply(got.entity_id, got.status, got.match_kind, got.created,
                     frozenset(got.possibly_same_as), got.candidates, got.name,
                     got.matched_name, got.entity_type, got.display_form)

    def mapped(self, want: Reply, ids: dict[str, str] | None = None) -> Reply:
        """The model's reply in the service's ids."""
        ids = {**(self.ids if ids is None else ids), "": ""}
        return Reply(ids[want.entity_id], want.status, want.match_kind, want.created,
                     frozenset(ids[i] for i in want.possibly_same_as),
                     tuple(ids[i] for i in want.candidates), want.name, want.matched_name,
                     want.entity_type, want.display_form)

    def check_links(self, after: object) -> None:
        """The open possibly_same_as links, named so a failure can be read."""
        shown = {self.ids[e.entity_id]: f"{e.entity_id} {e.names[0][0]!r} ({e.entity_type})"
                 for e in self.model.entities}
        got = {frozenset(shown[i] for i in (link.a, link.b))
               for link in self.service.list_links(page_size=1000)[0]}
        want = {frozenset(shown[self.ids[i]] for i in pair) for pair in self.model.links}
        assert got == want, (after, "extra:", got - want, "missing:", want - got)

    def check_entities(self) -> None:
        """Every entity's type, status, names in matched_name order, or redirect."""
        for e in self.model.entities:
            view = self.service.get_entity(self.ids[e.entity_id])
            if e.merged_into is not None:
                assert (view.status, view.redirect_to) == (
                    Status.MERGED, self.ids[self.model.live(e).entity_id]), e
                assert (view.evidence_count, view.paper_count) == (0, 0), e  # moved on
                continue
            assert (view.entity_type, view.status is Status.CANONICAL, view.placeholder) == (
                e.entity_type, e.canonical, e.placeholder), e
            assert (view.evidence_count, view.paper_count) == self.model.evidence(e), e
            assert [view.name, *view.aliases, *view.surface_forms] == [n[0] for n in e.names], e
            assert view.surface_form_count == len(view.surface_forms), e


@pytest.mark.parametrize("seed", range(24))
def test_resolve_after_resolve_does_what_the_spec_says(tmp_path: Path, seed: int) -> None:
    run_against_the_model(f"sqlite:///{tmp_path / 'identity.sqlite'}", seed)


@pytest.mark.postgres
@pytest.mark.parametrize("seed", [0, 1, 2, 3, 5, 7, 8, 11, 20, 22])
def test_resolve_after_resolve_on_postgres(pg_url: str, seed: int) -> None:
    """The same on PostgreSQL (its own ordering, types and transactions, its writes decided
    before the store's lock and checked under it); seeds 2, 5, 8, 11 and 20 with two
    services, as replicas on one database."""
    run_against_the_model(pg_url, seed)


def run_against_the_model(db_url: str, seed: int, steps: int = 150,
                          start: Callable[[Settings], Service] = build_service) -> None:
    """`steps` operations a seed: resolves (one in ten a batch of three, some with an invalid
    item, some sent again; one in ten of the rest lookup-only; a few invalid) of names with
    case, punctuation, spacing and typo perturbations under raw types (unknown and empty ones
    too), most under one of a few papers (evidence; promotion after 1, 2 or 3 papers, or never,
    by seed); now and then three calls at once (resolves, lookups, batches) of spellings of one
    name; an authority import halfway (import merges and links), a re-import of some canonical
    ids later (renamed, aliases retired), and now and then a curator settling a link or adding
    an alias, an admin merge (refused where SPEC says) or an admin promotion, some naming a
    merged entity. In every third seed two services share the database, each operation going
    to either. `start` makes a service."""
    rng = random.Random(seed)
    promote_after = (0, 1, 2, 3)[seed % 4]
    settings = Settings(db_url=db_url, promote_after_papers=promote_after)
    services = [start(settings) for _ in range(1 + seed % 3 // 2)]  # 2 in every third
    run = Run(services, promote_after, seed)
    sent: list[tuple[str, list[tuple[str, str]]]] = []  # batches, to send some again
    try:
        run.import_records(authority(rng, rng.randrange(0, 25)))
        for step in range(steps):
            if step == 75:  # canonical records that meet provisional entities
                run.import_records(authority(rng, rng.randrange(1, 15), first=100))
                run.check_links(("import", step))
            if step == 110:  # some of them again, with what the authority says now
                live = [e.entity_id for e in run.model.entities  # not promoted provisional ids
                        if e.canonical and e.merged_into is None and e.entity_id[0] == "Q"]
                again = rng.sample(live, min(len(live), rng.randrange(1, 8)))
                records = authority(rng, len(again))
                for r, entity_id in zip(records, again, strict=True):
                    r["id"] = entity_id
                run.import_records(records)
                run.check_links(("re-import", step))
            if run.model.links and rng.random() < 0.06:
                pair = rng.choice(sorted(run.model.links, key=sorted))
                same = rng.random() < 0.5
                run.settle(pair, same)
                run.check_links(("settle", step, sorted(pair), same))
            elif run.model.entities and rng.random() < 0.02:  # an admin merge, maybe refused
                source, target = rng.choices(  # merged ones too, now and then: their targets
                    [e for e in run.model.entities
                     if e.merged_into is None or rng.random() < 0.1], k=2)
                run.merge(source, target)
                run.check_links(("merge", step, source.entity_id, target.entity_id))
            elif run.model.entities and rng.random() < 0.04:
                e = rng.choice([e for e in run.model.entities
                                if e.merged_into is None or rng.random() < 0.1])
                alias = perturb(rng, rng.choice(BASE_NAMES))
                if key(display_form(alias)):
                    run.add_alias(e, alias)
                    run.check_links(("alias", step, e.entity_id, alias))
            elif run.model.entities and rng.random() < 0.02:
                e = rng.choice(run.model.entities)  # merged ones too: it acts on their target
                run.promote(e)
                run.check_links(("promote", step, e.entity_id))
            else:
                paper = rng.choice(PAPERS)
                mentions = [mention_of(rng) for _ in range(3 if rng.random() < 0.1 else 1)]
                if rng.random() < 0.1:  # at once, spellings of one name: some order's outcome
                    base = rng.choice(BASE_NAMES)
                    run.resolve_together([
                        Call(kind, rng.choice(PAPERS),
                             [mention_of(rng, base) for _ in range(2 if kind == "batch" else 1)])
                        for kind in rng.choices(("resolve", "look", "batch"), (6, 1, 2), k=3)])
                elif len(mentions) > 1:
                    if rng.random() < 0.2:  # an invalid item: its own error, the rest resolved
                        mentions[rng.randrange(3)] = (rng.choice(INVALID), "method")
                    if sent and rng.random() < 0.3:  # the same request again: its first reply
                        paper, mentions = rng.choice(sent)
                    sent.append((paper, mentions))
                    run.resolve_batch(paper, mentions)
                elif rng.random() < 0.1:
                    run.look(*mentions[0])  # writes nothing: the links below stay as they were
                elif rng.random() < 0.03:
                    run.resolve_invalid(rng.choice(INVALID), mentions[0][1], paper)
                else:
                    run.resolve(*mentions[0], paper)
                run.check_links(("resolve", step, paper, mentions))
        run.check_entities()
        if start is build_service:
            _check_a_restart_loads_what_each_service_holds(services, settings)
    finally:
        for service in services:
            service.close()


def _check_a_restart_loads_what_each_service_holds(services: list[Service],
                                                   settings: Settings) -> None:
    """The index a restart builds from the store (start-up's own path: streamed rows,
    `Entity.loaded`) holds every entity exactly as each running service's index does."""
    def entities(service: IdentityService) -> dict[str, Entity]:
        # Read as a request is: after the service has caught up with every commit.
        return service.live.read(lambda tx: {e.entity_id: e for e in service.index.entities()})

    restarted = build_service(settings)
    try:
        loaded = entities(restarted)
        for service in services:
            held = entities(cast(IdentityService, service))
            assert held == loaded
            assert all(held[i].names == loaded[i].names for i in held)
    finally:
        restarted.close()
