"""Reads that run without the service lock (IdentityService._answer) stay right while it writes.

A settled index answers lookups without taking the lock; a read that overlaps a change of the
index is detected by the index version and answered again under the lock. These tests check both
halves: quiet reads take no lock at all, and readers racing a writer that keeps adding aliases,
entities and merges never see an error or a wrong answer; and, since a race may not happen to
hit the window it tests, the protocol itself, with a change stepped in by hand.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Self

import pytest

from identity_server.domain import MatchKind
from identity_server.server import build_service
from identity_server.service import IdentityService
from identity_server.settings import Settings


class CountingLock:
    """An RLock that counts how often it is taken."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.taken = 0

    def __enter__(self) -> Self:
        self._lock.acquire()
        self.taken += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._lock.release()

    def acquire(self, blocking: bool = True) -> bool:
        taken = self._lock.acquire(blocking)
        self.taken += taken
        return taken

    def release(self) -> None:
        self._lock.release()


@pytest.fixture
def service(tmp_path: Path) -> Iterator[IdentityService]:
    svc = build_service(Settings(db_url=f"sqlite:///{tmp_path / 'identity.sqlite'}"))
    report = svc.import_lines([
        json.dumps({"id": "Q1", "name": "Transformer", "type": "method"}),
        json.dumps({"id": "Q2", "name": "Graph Network", "type": "method",
                    "aliases": ["Graph Net"]}),
    ])
    assert report.errors == ()
    yield svc
    svc.close()


def _expected(service: IdentityService) -> dict[str, tuple[str, MatchKind]]:
    """What the stable mentions resolve to, asked once before any race."""
    answers = {}
    for mention in ("Transformer", "TRANSFORMER", "Transfromer", "graph-network",
                    "Graph Netwrok", "graph net"):
        r = service.resolve(mention, "method", lookup_only=True)
        answers[mention] = (r.entity_id, r.match_kind)
    return answers


def test_settled_lookups_take_no_lock(service: IdentityService) -> None:
    expected = _expected(service)
    assert expected["Transfromer"] == ("Q1", MatchKind.TYPO)
    assert expected["graph net"] == ("Q2", MatchKind.ALIAS)
    counting = CountingLock()
    service.live.lock = counting  # type: ignore[assignment]
    for _ in range(50):
        for mention, answer in expected.items():
            r = service.resolve(mention, "method", lookup_only=True)
            assert (r.entity_id, r.match_kind) == answer
    assert counting.taken == 0

    service.add_alias("Q1", "Attention Model")  # a write: the next read may settle once
    taken = counting.taken
    for _ in range(20):
        assert service.resolve("attention model", "method", lookup_only=True).entity_id == "Q1"
    assert counting.taken <= taken + 1  # the first read after the write settles, once


def test_a_read_the_index_changed_under_is_answered_again_under_the_lock(
    service: IdentityService,
) -> None:
    """The optimistic protocol itself, without relying on a race to happen: a lock-free read
    during which a change began or ended (the index version moved) does not stand, even when it
    returned normally or failed, and is worked out again under the lock; a read during which
    nothing moved stands, and its error is the caller's."""
    service.resolve("Transformer", "method", lookup_only=True)  # settles the index
    counting = CountingLock()
    service.live.lock = counting  # type: ignore[assignment]
    calls: list[bool] = []

    def settled() -> str:
        calls.append(True)
        return "settled"

    def fails() -> str:
        raise ValueError("the caller's own")

    def changed_meanwhile(outcome: str) -> Any:
        def work() -> str:
            first = not calls
            calls.append(first)
            if first:
                service.live._index_version += 2  # a whole change went by during this read
                if outcome == "error":
                    raise KeyError("an entity vanished under the read")
                return "torn"
            return "settled"
        return work

    for outcome in ("value", "error"):
        calls.clear()
        taken = counting.taken
        assert service.live.answer(changed_meanwhile(outcome)) == "settled"
        assert calls == [True, False] and counting.taken == taken + 1

    service.live._index_version += 1  # a change under way: not even tried without the lock
    try:
        calls.clear()
        taken = counting.taken
        assert service.live.answer(settled) == "settled"
        assert calls == [True] and counting.taken == taken + 1
    finally:
        service.live._index_version += 1

    taken = counting.taken
    assert service.live.answer(lambda: "quiet") == "quiet"
    with pytest.raises(ValueError, match="the caller's own"):
        service.live.answer(fails)
    assert counting.taken == taken


@pytest.fixture
def frequent_thread_switches() -> Iterator[None]:
    """Threads hand over the GIL every 0.1 ms instead of 5: more interleavings of readers and
    writer per second, and the writer, which gives the GIL up at each SQLite call, gets it back
    without waiting behind four busy readers for 5 ms each time (at the default interval
    this test took ~80 s, nearly all of it the writer queueing for the GIL)."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)
    try:
        yield
    finally:
        sys.setswitchinterval(before)


@pytest.mark.usefixtures("frequent_thread_switches")
@pytest.mark.parametrize("typo_pack_at", [50_000, 8], ids=["overlay", "packing"])
def test_readers_racing_a_writer_always_get_the_settled_answer(
    service: IdentityService, typo_pack_at: int
) -> None:
    """With the default pack threshold the new anchors stay in the typo overlay; with a small
    one the overlay is packed in the background again and again while the readers read."""
    service.live.typo_pack_at = typo_pack_at
    expected = _expected(service)
    stop = threading.Event()
    failures: list[Any] = []

    def read() -> None:
        while not stop.is_set():
            for mention, answer in expected.items():
                try:
                    r = service.resolve(mention, "method", lookup_only=True)
                    got: Any = (r.entity_id, r.match_kind)
                except Exception as e:  # reported below, with the mention
                    got = e
                if got != answer:
                    failures.append((mention, got, answer))

    def write() -> None:
        # New anchors sharing deletion variants with the read keys (so the typo table's shared
        # entries change under the readers), new entities, and merges of those entities.
        for i in range(150):
            service.add_alias("Q2", f"Graph Network {i}")
            service.add_alias("Q1", f"Transformer{chr(0x61 + i % 26)}{i}")
            made = service.resolve(f"Zorblat Quennix {i}", "method", context_id=f"paper-{i}")
            if i % 3 == 0:
                service.merge(made.entity_id, "Q2")

    readers = [threading.Thread(target=read) for _ in range(4)]
    for t in readers:
        t.start()
    try:
        write()
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=60)
    assert not any(t.is_alive() for t in readers)
    assert failures == []
    assert _expected(service) == expected
    service.close()  # waits for a pack in flight
    packed, waiting = service.index.typo_anchors()
    assert packed + waiting >= 3 + 300 + 150  # start-up's, the aliases, the new names
    if typo_pack_at == 8:
        assert packed > 300
    else:
        assert packed == 0  # the fixture's store was empty at start-up
