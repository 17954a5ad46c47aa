"""Use cases of the identity server: resolve, inspect, curate, import. One transaction each.

Every write is one unit of work under the store's write lock, on an index caught up with every
committed change (`live_index.LiveIndex`), so the outcome of concurrent calls equals some
one-at-a-time order of them. How a resolve flows: docs/architecture.md.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple, TypeVar

from identity_server import json_text, lifecycle
from identity_server.authority import Line
from identity_server.checks import (
    MAX_ACTOR_LENGTH,
    MAX_REASON_LENGTH,
    MAX_TYPE_LENGTH,
    check_type_length,
    checked_entity_id,
    checked_id,
    has_dropped_characters,
    is_unicode,
)
from identity_server.core import Core, selected
from identity_server.domain import (
    Entity,
    MatchKind,
    Mention,
    NameKind,
    Status,
    TypeVocabulary,
)
from identity_server.errors import (
    BatchTooLarge,
    EntityNotFound,
    FailedPrecondition,
    InvalidArgument,
)
from identity_server.importing import AuthorityImport, ImportReport
from identity_server.index import NameIndex, anchor_keys
from identity_server.lifecycle import CURATOR
from identity_server.live_index import LiveIndex
from identity_server.matching import Decision, Outcome, pair_candidates
from identity_server.normalize import display_form, key, warm_up
from identity_server.scoring import candidate_scores
from identity_server.store import BeforeLock, ChangeRecord, LinkRow, SqlStore, Tx, WouldBlock
from identity_server.unit import DISTINCT, LINK_SETTLED, OPEN, SAME, Unit
from identity_server.write_queue import WriteQueue

logger = logging.getLogger(__name__)

T = TypeVar("T")
# A write group takes queued requests up to this many mentions (at least one request).
MAX_GROUP_MENTIONS = 5000
# ListEntities: entities a page by default and at most, and surface forms each by default.
DEFAULT_ENTITY_PAGE = 100
MAX_ENTITY_PAGE = 1000
DEFAULT_LISTED_FORMS = 20



class ResolveResult(NamedTuple):
    """One mention's answer."""

    entity_id: str  # empty: lookup-only, and a creating call would make a new entity
    status: Status | None
    match_kind: MatchKind
    created: bool
    possibly_same_as: tuple[str, ...]
    candidates: tuple[str, ...]
    name: str
    matched_name: str
    entity_type: str
    display_form: str
    # One per candidate, 0-100: the reconciliation endpoint's scores (identity_server.scoring).
    candidate_scores: tuple[float, ...] = ()


@dataclass(frozen=True, slots=True)
class ItemError:
    """Why one mention of a batch was not resolved (`code` is a gRPC status code name)."""

    code: str
    message: str


class BatchReply(NamedTuple):
    """A ResolveBatch's results, and whether they are an identical earlier request's, replayed."""

    results: list[ResolveResult | ItemError]
    replayed: bool = False


class PreparedBatch(NamedTuple):
    """A request checked and parsed (an invalid mention is its item's error), ready for
    `start`; what the write queue writes."""

    context_id: str
    parsed: list[Mention | ItemError]
    request_hash: str | None  # identifies a repeat (None: no context id, or lookup-only)
    lookup_only: bool


@dataclass(frozen=True, slots=True)
class EntityView:
    entity_id: str
    name: str
    entity_type: str
    status: Status
    aliases: tuple[str, ...]
    surface_forms: tuple[str, ...]  # all of them, or the page asked for
    redirect_to: str
    placeholder: bool
    evidence_count: int
    paper_count: int
    surface_form_count: int  # all of them, however many are listed


class Guess(NamedTuple):
    """A mention decided before the store's lock. Under it the decision stands when nothing
    it read has changed since, else the mention is decided again. When its only write is
    evidence for an existing entity, its reply is made and its evidence written before the
    lock (`result`), and a decision made again must come out the same."""

    decision: Decision
    result: ResolveResult | None = None  # None: it writes more than evidence


class GroupGuess(NamedTuple):
    """A write group's guesses: each batch's, by mention position, and the change feed's
    position the index was at when they were made."""

    seq: int
    batches: list[dict[int, Guess]]


class GuessMissed(Exception):
    """An evidence-only guess no longer holds under the lock: its evidence was written for the
    wrong entity, so the group's transaction is rolled back and written again, deciding under
    the lock."""


class _Unchanged(NamedTuple):
    """A lock-free look's answer: the results, or None when the request must write."""

    results: list[ResolveResult | ItemError] | None


@dataclass(frozen=True, slots=True)
class ServiceConfig:
    """The settings the use cases need (the server builds it from Settings)."""

    vocabulary: TypeVocabulary
    max_mention_length: int = 512
    max_batch_size: int = 5000
    promote_after_papers: int = 0
    batch_reply_ttl_seconds: int = 7 * 24 * 3600
    # Typo anchors filed since start-up (new entities' names, added aliases) that start a
    # background pack of the typo table's overlay (and at least 1/64 of the packed ones).
    typo_pack_at: int = 50_000


class IdentityService:
    """The identity server's use cases over one store and its in-memory index."""

    def __init__(self, store: SqlStore, config: ServiceConfig, *,
                 core: Core | None = None) -> None:
        self.store = store
        self.config = config
        self.core = core or selected()  # the per-mention hot loop (see identity_server.core)
        self.writes: WriteQueue[PreparedBatch, BatchReply] = WriteQueue(
            self._write_group, weight=lambda batch: len(batch.parsed),
            max_group_weight=MAX_GROUP_MENTIONS)
        self._known_papers: dict[str, set[str]] = {}  # papers counted for promotion, by entity
        self._batches_written = 0
        self.guesses_missed = 0  # groups written again because a guess no longer held
        warm_up()
        self.live = LiveIndex(store, typo_pack_at=config.typo_pack_at)
        logger.info("resolve core: %s", self.core.name)

    @property
    def index(self) -> NameIndex:
        return self.live.index

    def _write(self, work: Callable[[Unit], T], *, wait: bool = True,
               before_lock: BeforeLock | None = None) -> T:
        """work in one write transaction, then the placeholder links its changes call for.
        wait=False: WouldBlock, before anything is done, when a lock is taken. `before_lock`:
        what the transaction does before the store's lock (SqlStore.write)."""
        def linking(u: Unit) -> T:
            result = work(u)
            self._link_placeholders_to_later_candidates(u)
            return result

        try:
            return self.live.write(linking, wait=wait, before_lock=before_lock)
        except WouldBlock:
            raise
        except BaseException:
            self._known_papers.clear()  # counted papers may have been rolled back
            raise

    def _link_placeholders_to_later_candidates(self, u: Unit) -> None:
        """SPEC: a placeholder is linked to every best-ranked candidate of its pair, 'including
        candidates that appear later'. An entity this unit gave a name, a type or a status may be
        one; one it merged away or took a name from may have been a pair's best, leaving others
        best. Each placeholder it meets (or met, by the names it lost), by a shared key (rules
        1-3) or by a name or alias one edit from the pair's key (rule 4; a surface form is never
        a typo anchor), has its pair decided again without itself and is linked to the best (a
        pair a curator settled stays settled); a placeholder merged away, whose pair's resolves
        follow its redirect, through the entity it redirects to."""
        checked: set[str] = set()
        index = self.index
        touched, u.touched_since_linking = u.touched_since_linking, {}
        for eid, before in touched.items():
            entity = index.get(eid)  # a new placeholder can be another pair's best candidate
            near = []
            if entity is not None and entity.status is not Status.MERGED:
                near = index.placeholders_near(entity, by_typo=eid in u.reanchored)
            if (before is not None and eid in u.reanchored  # not a surface form alone
                    and before.status is not Status.MERGED and _lost_names(before, entity)):
                # It left pairs it was a candidate of (merged away, or a name retired): their
                # other candidates may be best now.
                near += index.placeholders_near(before)
            for placeholder in near:
                if placeholder.entity_id not in checked:
                    checked.add(placeholder.entity_id)
                    # A placeholder merged away is still its pair's: linked through its redirect.
                    owner = (placeholder if placeholder.status is not Status.MERGED
                             else index.live(placeholder.entity_id))
                    if owner is None:
                        continue
                    display = index.pair_display(placeholder)
                    for c in pair_candidates(index, placeholder, display):
                        u.link(owner.entity_id, c.entity.entity_id)

    def close(self) -> None:
        """Finish the queued writes and a typo pack in flight, then close the store."""
        self.writes.close()
        self.live.close()
        self.store.close()

    # -- checking input --------------------------------------------------------------------------

    def parse_mention(self, mention: str, entity_type: str) -> Mention:
        check_type_length(entity_type)
        display, k = self.core.normalize(mention)
        if not display:
            raise InvalidArgument("mention is empty (nothing left after normalisation)")
        if len(display) > self.config.max_mention_length:
            raise InvalidArgument(
                f"mention is {len(display)} code points long; the limit is "
                f"{self.config.max_mention_length}"
            )
        if not k:
            raise InvalidArgument(f"mention {display!r} has no letters, digits or symbols")
        if not display.isascii() and not is_unicode(display):  # ASCII: no call, hot path
            raise InvalidArgument("mention contains a lone surrogate: not valid Unicode")
        return Mention(display, *self._parse_type(entity_type), k)

    def _parse_type(self, entity_type: str) -> tuple[str, str]:
        """The mention's type (of the vocabulary) and the type as given, cleaned as a mention
        is (`display_form`), since it is stored with the evidence."""
        if entity_type.isascii() and entity_type.isprintable():  # the common case: no controls
            return self.config.vocabulary.for_mention(entity_type), display_form(entity_type)
        raw_type = display_form(entity_type)
        if len(raw_type) > MAX_TYPE_LENGTH:  # NFKC can lengthen it past the cap on what is kept
            raise InvalidArgument(f"type is {len(raw_type)} characters long once normalised; "
                                  f"the limit is {MAX_TYPE_LENGTH}")
        if not is_unicode(raw_type):  # could not be stored with the evidence
            raise InvalidArgument("type contains a lone surrogate: not valid Unicode")
        # A type with characters the cleaning drops is read as cleaned ("per\x00son" is person,
        # one with nothing left is an empty type); any other is read as given, as it always was.
        read = raw_type if has_dropped_characters(entity_type) else entity_type
        return self.config.vocabulary.for_mention(read), raw_type

    def _live(self, entity_id: str) -> Entity:
        entity = self.index.live(checked_entity_id(entity_id))
        if entity is None:
            raise EntityNotFound(f"no entity with id {entity_id!r}")
        return entity

    # -- resolving -------------------------------------------------------------------------------
    #
    # One path for every resolve: check and parse the request, then answer it from the index at
    # once when it writes nothing (no lock), else queue it on the write queue, whose groups are
    # each one transaction in which every mention is decided, its writes planned
    # (lifecycle.plan_resolve) and applied, in order. A Resolve is a batch of one.

    def resolve(self, mention: str, entity_type: str, *, context_id: str = "",
                lookup_only: bool = False) -> ResolveResult:
        """One mention; an invalid one raises InvalidArgument."""
        (result,) = self.resolve_prepared(self.prepare_one(
            mention, entity_type, context_id=context_id, lookup_only=lookup_only)).results
        assert isinstance(result, ResolveResult)
        return result

    def resolve_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> list[ResolveResult | ItemError]:
        """Resolve in order, as one transaction; a repeated request gets the first reply."""
        return self.resolve_prepared(
            self.prepare_batch(context_id, mentions, lookup_only=lookup_only)).results

    def resolve_prepared(self, batch: PreparedBatch) -> BatchReply:
        """A checked request's reply; may wait (on a lock, for the write queue)."""
        outcome = self.start(batch, may_wait=True)
        assert outcome is not None
        return outcome if isinstance(outcome, BatchReply) else outcome.result()

    def prepare_one(self, mention: str, entity_type: str, *, context_id: str = "",
                    lookup_only: bool = False) -> PreparedBatch:
        """A Resolve checked and parsed, as a batch of one (no stored reply)."""
        checked_id(context_id, "context id", "a paper id")
        return PreparedBatch(context_id, [self.parse_mention(mention, entity_type)], None,
                             lookup_only)

    def prepare_batch(self, context_id: str, mentions: Sequence[tuple[str, str]], *,
                      lookup_only: bool = False) -> PreparedBatch:
        """Check a batch and parse its mentions (no lock, no store): a bad context id or size
        fails the whole batch, a bad mention only its own item."""
        checked_id(context_id, "context id", "a paper id")
        if len(mentions) > self.config.max_batch_size:
            raise BatchTooLarge(len(mentions), self.config.max_batch_size)
        parsed: list[Mention | ItemError] = []
        for i, (text, etype) in enumerate(mentions):
            try:
                parsed.append(self.parse_mention(text, etype))
            except InvalidArgument as e:
                parsed.append(ItemError("INVALID_ARGUMENT", f"mention {i}: {e}"))
        request_hash = (_batch_hash(context_id, mentions)
                        if context_id and not lookup_only else None)
        return PreparedBatch(context_id, parsed, request_hash, lookup_only)

    def start(self, batch: PreparedBatch, *, may_wait: bool,
              gather: Callable[[Callable[[], None]], object] | None = None,
              ) -> BatchReply | Future[BatchReply] | None:
        """The reply, when the index gives it without writing; else the future of the write
        queue's reply. may_wait=False (the event loop): nothing here waits for a lock, and None
        says the request needs a thread that may (the index is changing or behind the store).
        `gather`: the write queue's group-commit window (see WriteQueue.submit)."""
        # Without waiting, the index answers only when it is current and no change is under
        # way; waiting, it catches up under the process lock, not the store's write lock, so a
        # write waiting for another process's lock does not hold up a request that writes
        # nothing.
        answer = self.live.answer if may_wait else self.live.answer_at_once
        if batch.lookup_only:
            return answer(self._look_all, batch.parsed)
        if batch.context_id:  # evidence is recorded: always a write
            return self.writes.submit(batch, may_wait=may_wait, gather=gather)
        unchanged = answer(self._unchanged, batch.parsed)
        if unchanged is None:  # the index is changing or behind the store
            return None
        if unchanged.results is not None:
            return BatchReply(unchanged.results)
        return self.writes.submit(batch, may_wait=may_wait, gather=gather)

    def _look_all(self, parsed: Sequence[Mention | ItemError]) -> BatchReply:
        return BatchReply([p if isinstance(p, ItemError) else self._look(p) for p in parsed])

    def _unchanged(self, parsed: Sequence[Mention | ItemError]) -> _Unchanged:
        """The results when resolving these mentions (without evidence) writes nothing."""
        results: list[ResolveResult | ItemError] = []
        for m in parsed:
            if isinstance(m, ItemError):
                results.append(m)
                continue
            d = self.core.decide(self.index, m)
            plan = lifecycle.plan_resolve(d, m, context_id="")
            if not plan.writes_nothing:
                return _Unchanged(None)  # a write is needed: decided again under the lock
            assert plan.entity is not None
            results.append(_result(plan.entity, plan.match_kind, False, (), d,
                                   plan.matched_name, m))
        return _Unchanged(results)

    def _write_group(self, batches: Sequence[PreparedBatch], *,
                     wait: bool = True) -> list[BatchReply]:
        """The write queue's group: every job in order, in one transaction.

        Its mentions are decided first, before the store's lock (`_guess_now`); the evidence of
        those whose only write is evidence is written before it too, under the locks of the
        group's papers, which every transaction writing a paper's evidence takes first. Under
        the store's lock each decision is kept when nothing it read changed since (`_holds`),
        else made again; an evidence-only one must come out the same (`_confirm`)."""
        papers = {b.context_id for b in batches if b.context_id}
        if not papers or not self.store.locks_inside_transaction:
            # Nothing to write before the lock, or no way to: SQLite's transaction is its lock.
            return self._write(lambda u: [self._write_batch(u, b) for b in batches], wait=wait)
        # Guessed only where the caller may wait: a write that may not is refused at once here.
        guess = self.live.as_it_stands(self._guess_now, batches) if wait else None
        if guess is not None:
            stored: dict[int, str | None] = {}  # None: the repeat of an earlier batch of the group
            try:
                return self._write(
                    lambda u: [self._write_batch(u, b) if i in stored and stored[i] is None
                               else self._write_batch(u, b, guess.batches[i], stored.get(i),
                                                      guess.seq)
                               for i, b in enumerate(batches)],
                    wait=wait,
                    before_lock=(papers, lambda tx: self._write_guessed(tx, batches, guess,
                                                                         stored)))
            except GuessMissed:
                self.guesses_missed += 1
        return self._write(lambda u: [self._write_batch(u, b) for b in batches], wait=wait,
                           before_lock=(papers, _nothing_before_lock))

    def _guess_now(self, batches: Sequence[PreparedBatch]) -> GroupGuess:
        """The group's mentions decided on the index as it stands (whatever was committed
        since is checked under the store's lock)."""
        seq, index = self.live.seq, self.index
        found: list[dict[int, Guess]] = []
        for batch in batches:
            guesses: dict[int, Guess] = {}
            found.append(guesses)
            if not batch.context_id:
                continue
            for i, m in enumerate(batch.parsed):
                if isinstance(m, ItemError):
                    continue
                d = self.core.decide(index, m)
                plan = lifecycle.plan_resolve(d, m, context_id=batch.context_id)
                if self._written_before_lock(plan):
                    assert plan.entity is not None
                    guesses[i] = Guess(d, _result(plan.entity, plan.match_kind, False, (), d,
                                                  plan.matched_name, m))
                else:
                    guesses[i] = Guess(d)
        return GroupGuess(seq, found)

    def _write_guessed(self, tx: Tx, batches: Sequence[PreparedBatch], guess: GroupGuess,
                       stored: dict[int, str | None]) -> None:
        """Before the store's lock, holding the papers' locks: look for each batch's stored
        reply (a repeat writes nothing; no other transaction can store one meanwhile) and
        write the evidence of the other batches' evidence-only guesses. A batch repeating an
        earlier one of the group (a client's retry that joined it) is marked None: under the
        lock it finds the reply that one stored."""
        not_before = time.time() - self.config.batch_reply_ttl_seconds
        evidence: dict[tuple[str, str, str, str], int] = {}
        earlier: set[str] = set()
        for i, batch in enumerate(batches):
            if batch.request_hash is not None:
                if batch.request_hash in earlier:
                    stored[i] = None
                    continue
                earlier.add(batch.request_hash)
                reply = tx.batch_reply(batch.request_hash, not_before=not_before)
                if reply is not None:
                    stored[i] = reply
                    continue
            for position, g in guess.batches[i].items():
                m = batch.parsed[position]
                if g.result is None:
                    continue
                assert isinstance(m, Mention)
                row = (g.result.entity_id, batch.context_id, m.display, m.raw_type)
                evidence[row] = evidence.get(row, 0) + 1
        tx.add_evidence(evidence)

    def _write_batch(self, u: Unit, batch: PreparedBatch,
                     guesses: Mapping[int, Guess] | None = None, stored: str | None = None,
                     guessed_at: int = 0) -> BatchReply:
        """One batch in the group's transaction. With `guesses` (made at feed position
        `guessed_at`), the stored reply was looked for before the lock: `stored`."""
        oldest_kept = u.now - self.config.batch_reply_ttl_seconds
        if guesses is None and batch.request_hash is not None:
            stored = u.tx.batch_reply(batch.request_hash, not_before=oldest_kept)
        if stored is not None:
            return BatchReply(_decode_results(stored), replayed=True)
        results: list[ResolveResult | ItemError] = []
        for i, m in enumerate(batch.parsed):
            if isinstance(m, ItemError):
                results.append(m)
                continue
            g = guesses.get(i) if guesses else None
            if g is not None and g.result is not None:
                results.append(self._confirm(u, m, batch.context_id, g, guessed_at))
                continue
            decided = (g.decision if g is not None and _holds(u, m, g.decision, guessed_at)
                       else None)
            results.append(self._resolve_one(u, m, batch.context_id, decided))
            # As a call of its own would: the next mention may find a new best candidate.
            self._link_placeholders_to_later_candidates(u)
        # Kept only when the batch wrote something (with a context, each resolved mention
        # records evidence): a batch whose every item failed changed nothing, so a repeat is
        # simply checked again and fails the same way.
        wrote = any(isinstance(r, ResolveResult) for r in results)
        if batch.request_hash is not None and wrote:
            u.tx.put_batch_reply(batch.request_hash, _encode_results(results), now=u.now)
            self._batches_written += 1
            if self._batches_written % 1000 == 1:
                u.tx.purge_batch_replies(before=oldest_kept)
        return BatchReply(results)

    def _resolve_one(self, u: Unit, m: Mention, context_id: str,
                     decided: Decision | None = None) -> ResolveResult:
        """Decide (unless `decided` still holds), plan the writes, apply them: one mention
        inside a write transaction."""
        d = self.core.decide(self.index, m) if decided is None else decided
        if logger.isEnabledFor(logging.DEBUG):
            logger.debug(
                "decision mention=%r type=%s rule=%s outcome=%s candidates=%s",
                m.display, m.entity_type, d.rule.name if d.rule else "-", d.outcome.value,
                [c.entity.entity_id for c in d.candidates],
            )
        placeholder = None
        if d.outcome is Outcome.AMBIGUOUS:
            existing = u.tx.placeholder(m.display, m.entity_type)
            placeholder = self._live(existing) if existing is not None else None
        plan = lifecycle.plan_resolve(d, m, context_id=context_id, placeholder=placeholder)
        entity, linked = u.apply_resolve(plan, m, context_id)
        if plan.evidence and self.config.promote_after_papers:
            entity = self._promote_by_evidence(u, entity, context_id)
        return _result(entity, plan.match_kind, plan.new_entity, linked, d,
                       plan.matched_name, m)

    def _confirm(self, u: Unit, m: Mention, context_id: str, g: Guess,
                 guessed_at: int) -> ResolveResult:
        """An evidence-only guess's result under the lock: as guessed when no entity the
        decision could read changed since; else decided again, which must plan the same
        evidence-only write (its row is written), or GuessMissed."""
        assert g.result is not None
        if _holds(u, m, g.decision, guessed_at):
            return g.result
        d = self.core.decide(self.index, m)
        plan = lifecycle.plan_resolve(d, m, context_id=context_id)
        entity = plan.entity
        if (not self._written_before_lock(plan) or entity is None
                or entity.entity_id != g.result.entity_id):
            raise GuessMissed(m.display)
        return _result(entity, plan.match_kind, False, (), d, plan.matched_name, m)

    def _written_before_lock(self, plan: lifecycle.ResolveWrites) -> bool:
        """Whether a plan's writes may be made before the store's lock: evidence alone, for
        an existing entity no promotion can be due for (that counts papers under the lock)."""
        threshold = self.config.promote_after_papers
        return (plan.entity is not None and plan.evidence_only
                and not (threshold and lifecycle.promotable(plan.entity, threshold)))

    def _promote_by_evidence(self, u: Unit, entity: Entity, context_id: str) -> Entity:
        """Evidence from a paper not yet counted for the entity may make it due for promotion.
        A paper already counted adds none: promotion was checked when it came (and when
        anything was merged into the entity since)."""
        if not lifecycle.promotable(entity, self.config.promote_after_papers):
            return entity
        known = self._known_papers.setdefault(entity.entity_id, set())
        if context_id in known:
            return entity
        known.add(context_id)
        return self._promote_when_due(u, entity)

    def _promote_when_due(self, u: Unit, entity: Entity) -> Entity:
        """Promote a provisional entity once its evidence, and that of the entities merged into
        it, comes from the configured number of distinct papers. Checked on a new paper's
        evidence and after a merge (which can bring papers without any new evidence)."""
        threshold = self.config.promote_after_papers
        if not lifecycle.promotable(entity, threshold):
            return entity
        u.flush()
        group = [entity.entity_id, *u.tx.merged_into(entity.entity_id)]
        _, papers = u.tx.evidence_summary(group)
        if not lifecycle.promotion_due(entity, papers, threshold):
            return entity
        self._known_papers.pop(entity.entity_id, None)
        return u.promote(entity, reason=f"evidence from {papers} papers")

    def _look(self, m: Mention) -> ResolveResult:
        """What a creating call would answer, writing nothing."""
        d = self.core.decide(self.index, m)
        if d.outcome is Outcome.CONVERGED:
            assert d.winner is not None
            return _result(d.winner.entity, d.match_kind, False, (), d,
                           d.winner.matched_name, m)
        matched = d.best[0].matched_name if d.best else ""
        if d.outcome is Outcome.AMBIGUOUS:
            with self.store.read() as tx:
                existing = tx.placeholder(m.display, m.entity_type)
            placeholder = self.index.live(existing) if existing else None
            if placeholder is not None:
                return _result(placeholder, MatchKind.AMBIGUOUS, False, (), d, matched, m)
            return _nothing(MatchKind.AMBIGUOUS, d, matched, m)
        return _nothing(MatchKind.NEW, d, matched, m)

    # -- inspecting ------------------------------------------------------------------------------

    def get_entity(self, entity_id: str, *, max_surface_forms: int | None = None,
                   surface_forms_offset: int = 0) -> EntityView:
        """One entity; with `max_surface_forms`, a page of its surface forms only (a
        much-mentioned entity has thousands, which a caller rarely wants all of)."""
        forms = _forms_page(max_surface_forms, surface_forms_offset)
        checked_entity_id(entity_id)

        def work(tx: Tx) -> EntityView:
            entity = self.index.get(entity_id)
            if entity is None:
                raise EntityNotFound(f"no entity with id {entity_id!r}")
            return self._view(tx, entity, forms)

        return self.live.read(work)

    def list_entities(self, *, status: Status | None, entity_type: str = "",
                      page_size: int = 0, page_token: str = "",
                      max_surface_forms: int | None = None) -> tuple[list[EntityView], str]:
        """A page of entities in id order, and the next page's token ("" after the last): the
        live ones, or those of `status`; of `entity_type` when given."""
        if page_size < 0:
            raise InvalidArgument("page_size must not be negative")
        size = min(page_size or DEFAULT_ENTITY_PAGE, MAX_ENTITY_PAGE)
        after = _decode_entity_token(page_token)
        forms = _forms_page(DEFAULT_LISTED_FORMS if max_surface_forms is None
                            else max_surface_forms, 0)
        statuses = ([status.value] if status is not None
                    else [Status.CANONICAL.value, Status.PROVISIONAL.value])
        wanted_type = entity_type.strip().casefold()

        def work(tx: Tx) -> tuple[list[EntityView], str]:
            ids = tx.entity_ids_page(after=after, statuses=statuses, entity_type=wanted_type,
                                     limit=size + 1)
            views = []
            for eid in ids[:size]:
                entity = self.index.get(eid)
                if entity is not None:  # the index reads the transaction's snapshot
                    views.append(self._view(tx, entity, forms))
            token = json.dumps([ids[size - 1]]) if len(ids) > size else ""
            return views, token

        return self.live.read(work)

    def _view(self, tx: Tx, entity: Entity, forms: slice = slice(None)) -> EntityView:
        """What a caller is shown of an entity; `forms`: which of its surface forms."""
        redirect = ""
        if entity.status is Status.MERGED:
            # Its evidence moved with it: the live entity at the end of the chain counts it.
            live = self.index.live(entity.entity_id)
            redirect = live.entity_id if live is not None else entity.redirect_to or ""
            evidence, papers = 0, 0
        else:
            group = [entity.entity_id, *tx.merged_into(entity.entity_id)]
            evidence, papers = tx.evidence_summary(group)
        start = entity.surface_start()
        surface = entity.names[start:]
        return EntityView(
            entity_id=entity.entity_id,
            name=entity.name,
            entity_type=entity.entity_type,
            status=entity.status,
            aliases=tuple(n.display for n in entity.names[:start] if n.kind is NameKind.ALIAS),
            surface_forms=tuple(n.display for n in surface[forms]),
            redirect_to=redirect,
            placeholder=entity.placeholder,
            evidence_count=evidence,
            paper_count=papers,
            surface_form_count=len(surface),
        )

    def list_links(self, *, entity_id: str = "", page_size: int = 100,
                   page_token: str = "") -> tuple[list[LinkRow], str]:
        size = min(max(page_size or 100, 1), 1000)
        after = _decode_token(page_token)

        def work(tx: Tx) -> tuple[list[LinkRow], str]:
            live = self._live(entity_id).entity_id if entity_id else None
            rows = tx.open_links(entity_id=live, after=after, limit=size + 1)
            token = ""
            if len(rows) > size:
                rows = rows[:size]
                last = rows[-1]
                token = json.dumps([last.created_seq, last.a, last.b])
            return rows, token

        return self.live.read(work)

    def list_changes(self, after: int, limit: int | None = None) -> list[ChangeRecord]:
        with self.store.read() as tx:
            return tx.changes_after(after, limit)

    # -- curating (admin) --------------------------------------------------------------------------

    def add_alias(self, entity_id: str, alias: str, *,
                  max_surface_forms: int | None = None) -> EntityView:
        """The entity with one more alias; the reply's entity, like those of the other admin
        calls, lists `max_surface_forms` of its surface forms at most (None: all)."""
        forms = _forms_page(max_surface_forms)
        display = display_form(alias)
        if not display or not key(display):
            raise InvalidArgument("alias is empty or has no letters, digits or symbols")
        if len(display) > self.config.max_mention_length:
            raise InvalidArgument(f"alias is longer than {self.config.max_mention_length}")

        def work(u: Unit) -> EntityView:
            entity = self._live(entity_id)
            entity = u.add_name(entity, display, NameKind.ALIAS, CURATOR)
            return self._view(u.tx, entity, forms)

        return self._write(work)

    def promote(self, entity_id: str, *, max_surface_forms: int | None = None) -> EntityView:
        forms = _forms_page(max_surface_forms)

        def work(u: Unit) -> EntityView:
            entity = u.promote(self._live(entity_id), reason="admin")
            self._known_papers.pop(entity.entity_id, None)
            return self._view(u.tx, entity, forms)

        return self._write(work)

    def merge(self, source_id: str, target_id: str, *,
              max_surface_forms: int | None = None) -> EntityView:
        forms = _forms_page(max_surface_forms)

        def work(u: Unit) -> EntityView:
            source, target = self._live(source_id), self._live(target_id)
            if source.entity_id == target.entity_id and source_id != target_id:
                return self._view(u.tx, target, forms)  # the pair is already merged: a no-op
            u.check_mergeable(source, target)
            merged = u.merge(source, target, reason="admin")
            return self._view(u.tx, self._promote_when_due(u, merged), forms)

        return self._write(work)

    def settle(self, entity_id: str, other_id: str, decision: str, *, actor: str,
               reason: str, max_surface_forms: int | None = None) -> EntityView:
        forms = _forms_page(max_surface_forms)
        if decision not in (SAME, DISTINCT):
            raise InvalidArgument("decision must be SAME or DISTINCT")
        if not actor.strip() or not reason.strip():
            raise InvalidArgument("a decision records who made it and why: give actor and reason")
        if len(actor) > MAX_ACTOR_LENGTH or len(reason) > MAX_REASON_LENGTH:
            raise InvalidArgument(f"actor is at most {MAX_ACTOR_LENGTH} characters and reason "
                                  f"at most {MAX_REASON_LENGTH}")

        def work(u: Unit) -> EntityView:
            a, b = self._live(entity_id), self._live(other_id)
            if a.entity_id == b.entity_id:
                raise FailedPrecondition(
                    f"{entity_id} is not linked to itself" if entity_id == other_id else
                    f"{entity_id} and {other_id} are already merged (both are {a.entity_id} now)"
                )
            row = u.tx.link(a.entity_id, b.entity_id)
            if row is None or row.state != OPEN:
                raise FailedPrecondition(
                    f"{a.entity_id} and {b.entity_id} have no open possibly_same_as link"
                )
            result = a
            if decision == SAME:
                target, source = sorted((a, b), key=lifecycle.merge_rank)
                u.check_mergeable(source, target)
                merged = u.merge(source, target, reason=f"settled same by {actor}")
                result = self._promote_when_due(u, merged)
            seq = u.emit(LINK_SETTLED, a.entity_id, b.entity_id, decision=decision, actor=actor,
                         reason=reason)
            u.tx.put_link(a.entity_id, b.entity_id, decision, seq, actor=actor, reason=reason,
                          now=u.now)
            return self._view(u.tx, result, forms)

        return self._write(work)

    # -- importing (admin) -----------------------------------------------------------------------

    def import_lines(self, lines: Iterable[Line], fmt: str | None = None, *,
                     progress: Callable[[int], object] | None = None) -> ImportReport:
        """Import an authority file's lines; bad records are refused with their line numbers.
        `progress` is called with the number of records handled after each transaction."""
        return AuthorityImport(self._write, self.live, self.config).run(lines, fmt,
                                                                        progress=progress)


def _holds(u: Unit, m: Mention, d: Decision, guessed_at: int) -> bool:
    """Whether decision d for m, made at feed position `guessed_at`, is the one to apply now:
    no entity it could read changed since (in the store, or earlier in this transaction), and
    its candidates are the index's versions (its writes start from them: a surface form added
    to a typo candidate leaves the decision as it was, not the entity)."""
    changes = u.name_changes(since=guessed_at)
    if changes is None or changes.may_change(m.key):
        return False
    index = u.index
    return all(index.get(c.entity.entity_id) is c.entity for c in d.candidates)


def _nothing_before_lock(tx: Tx) -> None:
    """A resolve group written without guesses (written again after one missed, or by a
    caller that may not wait) still takes its papers' locks first: a transaction that wrote a
    paper's evidence before the store's lock may hold those rows."""


def _forms_page(max_surface_forms: int | None, offset: int = 0) -> slice:
    """Which of an entity's surface forms a reply lists: `max_surface_forms` of them (None:
    all) from `offset` on."""
    if max_surface_forms is not None and max_surface_forms < 0:
        raise InvalidArgument(f"max_surface_forms is {max_surface_forms}; it must be 0 or more "
                              f"(leave it unset for all of them)")
    if offset < 0:
        raise InvalidArgument(f"surface_forms_offset is {offset}; it must be 0 or more")
    return slice(offset, None if max_surface_forms is None else offset + max_surface_forms)


def _lost_names(before: Entity, after: Entity | None) -> bool:
    """Whether `after` (None: gone) lacks a key or a typo anchor that `before` had."""
    if after is None or after.status is Status.MERGED:
        return bool(before.names)
    if after.names is before.names:
        return False
    keys = after.name_keys()
    return (any(k not in keys for k in before.name_keys())
            or not anchor_keys(before.names) <= anchor_keys(after.names))


def _candidate_ids(d: Decision) -> tuple[str, ...]:
    """The deciding rule's candidates, as a reply names them."""
    return tuple([c.entity.entity_id for c in d.candidates])


def _scores(d: Decision, m: Mention) -> tuple[float, ...]:
    return candidate_scores(d, m.display) if d.candidates else ()


def _result(entity: Entity, kind: MatchKind, created: bool, linked: tuple[str, ...],
            d: Decision, matched: str, m: Mention) -> ResolveResult:
    return ResolveResult(entity.entity_id, entity.status, kind, created, linked,
                         _candidate_ids(d), entity.name, matched, entity.entity_type, m.display,
                         _scores(d, m))


def _nothing(kind: MatchKind, d: Decision, matched: str, m: Mention) -> ResolveResult:
    return ResolveResult("", None, kind, False, (), _candidate_ids(d), "", matched,
                         m.entity_type, m.display, _scores(d, m))


def _batch_hash(context_id: str, mentions: Sequence[tuple[str, str]]) -> str:
    """Identifies a request exactly: every string length-prefixed, so no two requests collide
    by concatenation."""
    h = hashlib.sha256()
    for text in (context_id, *(s for pair in mentions for s in pair)):
        data = text.encode("utf-8", "surrogatepass")
        h.update(len(data).to_bytes(8, "big"))
        h.update(data)
    return h.hexdigest()


def _encode_results(results: Sequence[ResolveResult | ItemError]) -> str:
    """A stored batch reply: one JSON array per item, a result's fields in order (its enums are
    StrEnums: written as their values), an error as [code, message]."""
    return json_text.dumps(
        [[r.code, r.message] if isinstance(r, ItemError) else tuple(r) for r in results])


def _decode_results(raw: str) -> list[ResolveResult | ItemError]:
    out: list[ResolveResult | ItemError] = []
    for item in json.loads(raw):
        if len(item) == 2:
            out.append(ItemError(item[0], item[1]))
            continue
        eid, status, kind, created, linked, candidates, name, matched, etype, display = item[:10]
        scores = tuple(item[10]) if len(item) > 10 else ()  # stored before scores: ten fields
        out.append(ResolveResult(
            eid, Status(status) if status else None, MatchKind(kind), created, tuple(linked),
            tuple(candidates), name, matched, etype, display, scores,
        ))
    return out


def _decode_entity_token(token: str) -> str:
    if not token:
        return ""
    try:
        (after,) = json.loads(token)
    except (ValueError, TypeError) as e:
        raise InvalidArgument("page_token is not one this server returned") from e
    if not isinstance(after, str):
        raise InvalidArgument("page_token is not one this server returned")
    return after


def _decode_token(token: str) -> tuple[int, str, str] | None:
    if not token:
        return None
    try:
        seq, a, b = json.loads(token)
        return int(seq), str(a), str(b)
    except (ValueError, TypeError) as e:
        raise InvalidArgument("page_token is not one this server returned") from e
