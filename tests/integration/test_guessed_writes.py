"""Decided before the lock, checked under it: guesses and the papers' locks, on two services
sharing one PostgreSQL store (as two server processes do). (On SQLite the transaction is the
store's lock: nothing is done before it.)

A write group's mentions are decided on the index before the store's write lock; those whose
only write is evidence for an existing entity have their evidence written before the lock too.
Under it a guess stands when nothing its decision could read changed since; else it is decided
again and must come out the same, or the whole transaction is rolled back and written again,
deciding under the lock. These tests put another process's write between the guess and the lock
(by running it when the guess has been made) and check the outcome is the one-at-a-time order's:
the reply, the evidence rows, and the feed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from sqlalchemy import text

from identity_server.domain import MatchKind, Mention
from identity_server.matching import Decision
from identity_server.metrics import Metrics
from identity_server.server import build_service
from identity_server.service import GroupGuess, IdentityService, PreparedBatch, ResolveResult
from identity_server.settings import Settings

pytestmark = pytest.mark.postgres


@pytest.fixture
def pair(pg_url: str) -> Iterator[tuple[IdentityService, IdentityService]]:
    a, b = build_service(Settings(db_url=pg_url)), build_service(Settings(db_url=pg_url))
    yield a, b
    a.close()
    b.close()


def evidence(service: IdentityService, context_id: str) -> dict[str, int]:
    """Evidence counts of one paper, by entity, as stored."""
    with service.store.read() as tx:
        rows = tx.conn.execute(
            text("SELECT entity_id, SUM(count) FROM evidence WHERE context_id = :c "
                 "GROUP BY entity_id"), {"c": context_id})
        return {r[0]: int(r[1]) for r in rows}


def after_guessing(service: IdentityService, act: Callable[[], object]) -> None:
    """Run act once, right after the service's next guess is made (before its lock)."""
    guess_now = service._guess_now
    done = threading.Event()

    def guessed(batches: Sequence[PreparedBatch]) -> GroupGuess:
        guess = guess_now(batches)
        if not done.is_set():
            done.set()
            act()
        return guess

    service._guess_now = guessed  # type: ignore[method-assign]


class CountingCore:
    """The service's core, counting its decisions."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.decided = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def decide(self, index: Any, mention: Mention) -> Decision:
        self.decided += 1
        found: Decision = self._core.decide(index, mention)
        return found


def counting(service: IdentityService) -> CountingCore:
    core = CountingCore(service.core)
    service.core = core  # type: ignore[assignment]
    return core


@pytest.mark.parametrize(("elsewhere", "decided"), [
    ("Jacquard Loom", 1),  # a new entity far from the guess: kept, decided before the lock only
    ("DIFFERENCE ENGINE", 2),  # a surface form of the guessed entity: decided again, the same
])
def test_a_guess_stands_when_what_changed_elsewhere_leaves_its_answer(
        pair: tuple[IdentityService, IdentityService], elsewhere: str, decided: int) -> None:
    a, b = pair
    engine = a.resolve("Difference Engine", "tool", context_id="paper-0").entity_id
    after_guessing(a, lambda: b.resolve(elsewhere, "tool", context_id="paper-9"))
    core = counting(a)
    (reply,) = a.resolve_batch("paper-1", [("Difference Engine", "tool")])
    assert (reply.entity_id, reply.match_kind, reply.created) == (engine, MatchKind.EXACT, False)
    assert core.decided == decided
    assert a.guesses_missed == 0
    assert evidence(a, "paper-1") == {engine: 1}


def test_a_guess_a_merge_elsewhere_overtook_is_written_again_for_the_merges_target(
        pair: tuple[IdentityService, IdentityService]) -> None:
    a, b = pair
    analytical = a.resolve("Analytical Engine", "tool", context_id="paper-0").entity_id
    difference = a.resolve("Difference Engine", "tool", context_id="paper-0").entity_id
    after_guessing(a, lambda: b.merge(difference, analytical))
    replies = a.resolve_batch("paper-1", [("Difference Engine", "tool"),
                                          ("Analytical Engine", "tool"),
                                          ("Brand New Machine", "tool")])
    assert [r.entity_id for r in replies[:2]] == [analytical, analytical]
    assert a.guesses_missed == 1
    registry = Metrics(a).registry
    assert registry.get_sample_value("identity_write_groups_rewritten_total") == 1
    created = replies[2].entity_id
    # One-at-a-time: the merge, then the batch; its evidence went to the target only.
    assert evidence(a, "paper-1") == {analytical: 2, created: 1}
    seqs = [c.seq for c in a.list_changes(0)]
    assert seqs == list(range(1, len(seqs) + 1))


def test_a_guess_an_earlier_mention_of_its_batch_overtook_is_written_again(
        pair: tuple[IdentityService, IdentityService]) -> None:
    """A mention guessed as an exact match, made ambiguous by the entity a mention before it in
    the same batch creates: written as the batch's order says."""
    a, _ = pair
    person = a.resolve("Jordan Smith", "person", context_id="paper-0").entity_id
    # At the guess, ("Jordan Smith", other) converges on the person; once the tool of the same
    # name exists, the two provisional entities tie for it.
    made, tied = a.resolve_batch("paper-1", [("Jordan Smith", "tool"),
                                             ("Jordan Smith", "other")])
    assert made.created and made.entity_id != person
    assert tied.match_kind is MatchKind.AMBIGUOUS
    assert set(tied.candidates) == {person, made.entity_id}
    assert a.guesses_missed == 1
    assert evidence(a, "paper-1") == {made.entity_id: 1, tied.entity_id: 1}


def test_a_repeat_that_joins_its_original_in_one_group_is_written_once(
        pair: tuple[IdentityService, IdentityService]) -> None:
    """A client's retry queued while its original waits joins the same write group: neither
    reply is stored when the group looks before the lock, so the retry must find the one its
    original stores under it, not write the paper's evidence again."""
    a, _ = pair
    engine = a.resolve("Difference Engine", "tool", context_id="paper-0").entity_id
    batch = a.prepare_batch("paper-1", [("Difference Engine", "tool"), ("Ada Lovelace", "person")])
    first, again = a._write_group([batch, batch])
    assert not first.replayed and again.replayed
    assert again.results == first.results
    made = first.results[1]
    assert isinstance(made, ResolveResult) and made.created
    assert evidence(a, "paper-1") == {engine: 1, made.entity_id: 1}


def test_concurrent_batches_of_one_paper_on_two_processes_lose_no_evidence(
        pg_url: str) -> None:
    """Batches of one paper at once on two processes, each with mentions guessed (known
    names, evidence written before the lock) and mentions written under it (new names): the
    papers' locks keep them from waiting on each other's rows in a cycle, and every mention's
    evidence is counted once."""
    a, b = build_service(Settings(db_url=pg_url)), build_service(Settings(db_url=pg_url))
    try:
        known = [f"Known Machine {chr(65 + i)}{chr(97 + i)}x" for i in range(12)]
        ids = {n: a.resolve(n, "tool", context_id="paper-setup").entity_id for n in known}
        start = threading.Barrier(8)
        errors: list[BaseException] = []

        def caller(i: int) -> None:
            service = (a, b)[i % 2]
            start.wait()
            try:
                for j in range(8):
                    service.resolve_batch("paper-shared", [*((n, "tool") for n in known),
                                                           (f"New Thing {i} {j}", "tool")])
            except BaseException as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors, errors
        counted = evidence(a, "paper-shared")
        assert {ids[n]: counted[ids[n]] for n in known} == {ids[n]: 64 for n in known}
        assert sum(counted.values()) == 64 * (len(known) + 1)
    finally:
        a.close()
        b.close()


def test_a_paper_written_under_the_lock_and_guessed_elsewhere_at_once_does_not_deadlock(
        pg_url: str) -> None:
    """One process writes a paper's evidence under the store's lock (its guesses missed, so it
    decides everything there) while another, guessing the same mention of the same paper, would
    write the same evidence row before the lock and then wait for it. Without the papers' locks
    each waits for the other (PostgreSQL ends one with a deadlock error); with them the second
    waits for the paper before writing anything."""
    a, b = build_service(Settings(db_url=pg_url)), build_service(Settings(db_url=pg_url))
    threads: list[threading.Thread] = []
    try:
        known = a.resolve("Difference Engine", "tool", context_id="paper-0").entity_id
        merged = a.resolve("Analytical Engine", "tool", context_id="paper-0").entity_id
        target = a.resolve("Jacquard Loom", "tool", context_id="paper-0").entity_id
        after_guessing(a, lambda: b.merge(merged, target))  # a's guess of it misses
        b_wrote, b_replies = threading.Event(), []
        write_guessed = b._write_guessed

        def b_write_guessed(*args: Any) -> None:
            write_guessed(*args)
            b_wrote.set()

        b._write_guessed = b_write_guessed  # type: ignore[method-assign]
        resolve_one = a._resolve_one

        def a_resolve_one(*args: Any) -> Any:
            if not threads:  # a's second attempt, under the store's lock: b starts now
                threads.append(threading.Thread(target=lambda: b_replies.append(
                    b.resolve_batch("paper-1", [("Difference Engine", "tool")]))))
                threads[0].start()
                b_wrote.wait(timeout=3)  # with the papers' locks b cannot write meanwhile
            return resolve_one(*args)

        a._resolve_one = a_resolve_one  # type: ignore[method-assign]
        replies = a.resolve_batch("paper-1", [("Analytical Engine", "tool"),
                                              ("Difference Engine", "tool")])
        threads[0].join(timeout=60)
        assert [r.entity_id for r in replies] == [target, known]
        assert a.guesses_missed == 1
        assert [r.entity_id for r in b_replies[0]] == [known]
        assert evidence(a, "paper-1") == {target: 1, known: 2}
    finally:
        for t in threads:
            t.join(timeout=60)
        a.close()
        b.close()
