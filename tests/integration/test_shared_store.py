"""Two services on one store (as two server processes would be) see each other's changes at once.

Each service answers repeat mentions from its in-memory index; these tests check that the index
is caught up with every change another process committed before an answer is given.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from identity_server.domain import MatchKind, Status
from identity_server.server import build_service
from identity_server.service import IdentityService
from identity_server.settings import Settings
from tests.conftest import store_url


@pytest.fixture
def pair(tmp_path: Path) -> Iterator[tuple[IdentityService, IdentityService]]:
    url = f"sqlite:///{tmp_path / 'shared.sqlite'}"
    a, b = build_service(Settings(db_url=url)), build_service(Settings(db_url=url))
    yield a, b
    a.close()
    b.close()


def test_a_creation_elsewhere_is_seen_by_lookups_and_repeat_resolves(
    pair: tuple[IdentityService, IdentityService],
) -> None:
    a, b = pair
    assert b.resolve("Grace Hopper", "person", lookup_only=True).entity_id == ""
    created = a.resolve("Grace Hopper", "person").entity_id
    seen = b.resolve("Grace Hopper", "person", lookup_only=True)
    assert (seen.entity_id, seen.match_kind) == (created, MatchKind.EXACT)
    again = b.resolve("Grace Hopper", "person")  # no context: answered without the write lock
    assert (again.entity_id, again.created) == (created, False)
    assert b.resolve("grace hopper", "person").entity_id == created


def test_a_write_here_first_replays_what_was_committed_elsewhere(
    pair: tuple[IdentityService, IdentityService],
) -> None:
    """A writing resolve (with a context) goes straight to a write transaction: it must catch up
    with the other process's commit there, not trust the index it last settled."""
    a, b = pair
    assert b.resolve("Ada Lovelace", "person", context_id="paper-0").created
    created = a.resolve("Grace Hopper", "person", context_id="paper-1").entity_id
    again = b.resolve("Grace Hopper", "person", context_id="paper-2")
    assert (again.entity_id, again.created, again.match_kind) == (created, False, MatchKind.EXACT)
    x = b.resolve("Analytical Engine", "tool", context_id="paper-3").entity_id
    y = a.resolve("Difference Engine", "tool", context_id="paper-4").entity_id
    a.merge(y, x)
    assert b.resolve("Difference Engine", "tool", context_id="paper-5").entity_id == x


def test_a_merge_elsewhere_redirects_at_once(pair: tuple[IdentityService, IdentityService]) -> None:
    a, b = pair
    x = b.resolve("Analytical Engine", "tool").entity_id
    y = b.resolve("Difference Engine", "tool").entity_id
    assert b.resolve("Difference Engine", "tool").entity_id == y
    a.merge(y, x)
    assert b.get_entity(y).status is Status.MERGED
    assert b.resolve("Difference Engine", "tool").entity_id == x


def test_a_new_ambiguity_elsewhere_changes_the_answer(
    pair: tuple[IdentityService, IdentityService],
) -> None:
    """Once another process adds a second best candidate, a repeat mention is ambiguous."""
    a, b = pair
    a.import_lines(['{"id": "Q1", "name": "Jordan Smith", "type": "person"}'])
    assert b.resolve("Jordan Smith", "person").entity_id == "Q1"
    a.import_lines(['{"id": "Q2", "name": "Jordan Smith", "type": "person"}'])
    reply = b.resolve("Jordan Smith", "person")
    assert reply.match_kind is MatchKind.AMBIGUOUS
    assert reply.candidates[:2] == ("Q1", "Q2")


@pytest.mark.postgres
def test_a_postgres_store_reloads_every_entity_with_its_names(pg_url: str) -> None:
    """Start-up merges two id-ordered streams: ids of mixed case, punctuation and non-ASCII
    letters (whose order differs between locale collations) must all get their names back."""
    ids = ["Q-1", "Q1", "q1", "Q_1", "Q 1", "Ω1", "É1", "e1", "Z1", "a-2"]
    first = build_service(Settings(db_url=pg_url))
    try:
        first.import_lines(
            [f'{{"id": "{eid}", "name": "Entity {n} Name", "type": "concept", '
             f'"aliases": ["Alias {n}"]}}' for n, eid in enumerate(ids)]
        )
        created = first.resolve("Brand New Thing", "tool").entity_id
    finally:
        first.close()
    again = build_service(Settings(db_url=pg_url))
    try:
        for n, eid in enumerate(ids):
            assert again.get_entity(eid).name == f"Entity {n} Name"
            reply = again.resolve(f"alias {n}", "concept", lookup_only=True)
            assert (reply.entity_id, reply.match_kind) == (eid, MatchKind.ALIAS)
        assert again.resolve("brand new thing", "tool", lookup_only=True).entity_id == created
    finally:
        again.close()


def test_concurrent_resolves_in_one_service_share_transactions_correctly(
    pair: tuple[IdentityService, IdentityService],
) -> None:
    """Callers queued behind the write lock are resolved together (group commit): one entity per
    new mention, every caller the same id, every resolve's evidence counted."""
    import threading

    a, _ = pair
    names = [f"Concurrent Name {chr(65 + i)}{chr(97 + i)}x" for i in range(8)]
    seen: list[dict[str, str]] = [{} for _ in range(16)]
    start = threading.Barrier(16)

    def caller(i: int) -> None:
        start.wait()
        for n in names[i % 8 :] + names[: i % 8]:
            seen[i][n] = a.resolve(n, "concept", context_id=f"paper-{i}").entity_id

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    for n in names:
        ids = {s[n] for s in seen}
        assert len(ids) == 1, (n, ids)
        entity = a.get_entity(ids.pop())
        assert (entity.evidence_count, entity.paper_count) == (16, 16)
    created = [c for c in a.list_changes(0) if c.kind == "created"]
    assert len(created) == len(names)


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_a_repeated_batch_gets_the_stored_reply_on_either_store(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The stored-reply lookup is plain SQL per dialect: on both stores a repeated batch (same
    context, same mentions) gets the first reply and writes nothing; a changed one is resolved."""
    url = store_url(backend, tmp_path, request)
    service = build_service(Settings(db_url=url))
    try:
        mentions = [("Grace Hopper", "person"), ("COBOL", "tool"), ("grace hopper", "person")]
        first = service.resolve_batch("paper-1", mentions)
        feed = service.list_changes(0)
        assert service.resolve_batch("paper-1", mentions) == first
        assert service.list_changes(0) == feed
        other = service.resolve_batch("paper-1", mentions[:2])
        assert [r.entity_id for r in other] == [r.entity_id for r in first[:2]]
    finally:
        service.close()


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_one_batch_sent_to_both_processes_at_once_is_written_once(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The same request at once on two processes: one writes it, the others replay its reply
    (on PostgreSQL the paper's lock orders them before any evidence is written)."""
    import threading

    from sqlalchemy import text

    url = store_url(backend, tmp_path, request)
    a, b = build_service(Settings(db_url=url)), build_service(Settings(db_url=url))
    try:
        engine = a.resolve("Difference Engine", "tool", context_id="paper-0").entity_id
        mentions = [("Difference Engine", "tool"), ("Ada Lovelace", "person")]
        start = threading.Barrier(8)
        replies: list[list[object]] = [[] for _ in range(8)]

        def caller(i: int) -> None:
            start.wait()
            replies[i] = list((a, b)[i % 2].resolve_batch("paper-1", mentions))

        threads = [threading.Thread(target=caller, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
        first = replies[0]
        assert all(r == first for r in replies)
        with a.store.read() as tx:
            counted = dict(tx.conn.execute(text(
                "SELECT entity_id, SUM(count) FROM evidence WHERE context_id = 'paper-1' "
                "GROUP BY entity_id")).all())
        assert counted == {engine: 1, first[1].entity_id: 1}  # type: ignore[attr-defined]
        assert sum(1 for c in a.list_changes(0) if c.kind == "created") == 2
    finally:
        a.close()
        b.close()
