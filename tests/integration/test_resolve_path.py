"""The one resolve path on a real SQLite store: a request the index answers without writing
never reaches the write queue; a write decides under the lock, after the writes ahead of it;
callers queued behind a group are written together, in order; a failed group fails each of its
callers and the queue goes on."""

from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Any

import pytest

from identity_server.domain import MatchKind
from identity_server.matching import Decision, IndexView
from identity_server.service import IdentityService, Mention, PreparedBatch
from identity_server.store import WouldBlock


class _CountingCore:
    """The service's core, recording the mentions it decides."""

    def __init__(self, core: Any) -> None:
        self._core = core
        self.decided: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._core, name)

    def decide(self, index: IndexView, mention: Mention) -> Decision:
        self.decided.append(mention.display)
        return self._core.decide(index, mention)  # type: ignore[no-any-return]


def _count_decisions(service: IdentityService, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    counting = _CountingCore(service.core)
    monkeypatch.setattr(service, "core", counting)
    return counting.decided


def _one(service: IdentityService, text: str, etype: str = "method") -> PreparedBatch:
    return service.prepare_one(text, etype)


def test_a_write_decides_again_under_the_lock(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lock-free look only tells whether a request writes; what it writes is decided in
    the write transaction, on the index as every earlier write left it."""
    made = service.resolve("Quorbex Transformer", "method")
    calls = _count_decisions(service, monkeypatch)
    r = service.resolve("QUORBEX transformer", "method")  # a new surface form: a write
    assert (r.entity_id, r.match_kind) == (made.entity_id, MatchKind.CASE)
    assert calls == ["QUORBEX transformer"] * 2  # the look, then the write
    assert "QUORBEX transformer" in service.get_entity(made.entity_id).surface_forms


def test_a_group_decides_each_mention_after_the_writes_ahead_of_it(
    service: IdentityService,
) -> None:
    """In a group of writes, "Quorbex Latice" looked before "Quorbex Lattice" existed (NEW);
    the group made that entity first, so the typo finds it instead of making a second one."""
    jobs = [_one(service, text) for text in (
        "Quorbex Lattice", "Vextral Autoencoder", "Quorbex Latice", "Zintrop Mesh")]
    assert service._unchanged(jobs[2].parsed).results is None  # NEW when looked at
    first, unrelated, typo, last = (r.results[0] for r in service._write_group(jobs))
    assert (typo.entity_id, typo.match_kind, typo.created) == (  # type: ignore[union-attr]
        first.entity_id, MatchKind.TYPO, False)  # type: ignore[union-attr]
    assert all(r.created for r in (first, unrelated, last))  # type: ignore[union-attr]
    assert len({first.entity_id, unrelated.entity_id, last.entity_id}) == 3  # type: ignore[union-attr]


def test_requests_that_write_nothing_never_reach_the_write_queue(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = service.resolve("Quorbex Transformer", "method")
    service.resolve("QUORBEX transformer", "method")

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("went to the write queue")

    monkeypatch.setattr(service.writes, "submit", refuse)
    again = service.resolve("QUORBEX transformer", "method")
    assert (again.entity_id, again.match_kind) == (made.entity_id, MatchKind.EXACT)
    results = service.resolve_batch("", [("Quorbex Transformer", "method"),
                                         ("QUORBEX transformer", "method")])
    assert [r.entity_id for r in results] == [made.entity_id] * 2  # type: ignore[union-attr]
    looked = service.resolve("Brand New Thing", "method", lookup_only=True)
    assert (looked.match_kind, looked.entity_id, looked.created) == (MatchKind.NEW, "", False)
    with pytest.raises(AssertionError, match="write queue"):
        service.resolve("Brand New Thing", "method")  # a write


def test_a_service_write_that_must_not_wait_leaves_no_trace(service: IdentityService) -> None:
    """While another thread holds the service's lock, a group asked not to wait raises
    WouldBlock before deciding anything, and `start` on the event loop hands it to the queue's
    writer thread instead of waiting; the write is then done once."""
    batch = _one(service, "Quorbex Transformer")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with service.live.lock:
            held.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(10)
    with pytest.raises(WouldBlock):
        service._write_group([batch], wait=False)
    outcome = service.start(batch, may_wait=False)  # returns at once, the write pending
    assert isinstance(outcome, Future) and not outcome.done()
    release.set()
    holder.join(10)
    (made,) = outcome.result(timeout=10).results  # type: ignore[union-attr]
    assert made.created and made.match_kind is MatchKind.NEW  # type: ignore[union-attr]
    looked = service.resolve("Quorbex Transformer", "method", lookup_only=True)
    assert looked.entity_id == made.entity_id  # type: ignore[union-attr]


def _queue_behind_a_held_group(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch, mentions: list[str]
) -> tuple[list[object], list[int], threading.Event, list[threading.Thread]]:
    """Start 'Leader Mention' and hold its group open, then queue `mentions` behind it."""
    gate = threading.Event()
    groups: list[int] = []
    real_write = service._write

    def held_write(work, **options):  # type: ignore[no-untyped-def]
        groups.append(len(service.writes._queued))  # nothing queued as a group's write begins
        if len(groups) == 1:
            assert gate.wait(10)
        return real_write(work, **options)

    monkeypatch.setattr(service, "_write", held_write)
    outcomes: list[object] = [None] * (len(mentions) + 1)

    def call(i: int, text: str) -> None:
        try:
            outcomes[i] = service.resolve(text, "method")
        except Exception as e:  # the test inspects it
            outcomes[i] = e

    threads = [threading.Thread(target=call, args=(0, "Leader Mention"), daemon=True)]
    threads[0].start()
    while not groups:
        time.sleep(0.001)
    for i, text in enumerate(mentions, start=1):
        threads.append(threading.Thread(target=call, args=(i, text), daemon=True))
        threads[-1].start()
    deadline = time.monotonic() + 10
    while len(service.writes._queued) < len(mentions) and time.monotonic() < deadline:
        time.sleep(0.001)
    assert len(service.writes._queued) == len(mentions)
    return outcomes, groups, gate, threads


def test_callers_queued_behind_a_group_are_written_together_in_order(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch
) -> None:
    outcomes, groups, gate, threads = _queue_behind_a_held_group(
        service, monkeypatch, ["Vextral Autoencoder", "Quorbex Transformer"])
    gate.set()
    for t in threads:
        t.join(10)
    assert groups == [0, 0]  # two transactions: the first caller's, then both queued callers'
    names = [r.name for r in outcomes]  # type: ignore[attr-defined]
    assert names == ["Leader Mention", "Vextral Autoencoder", "Quorbex Transformer"]
    assert all(r.created for r in outcomes)  # type: ignore[attr-defined]
    assert service.writes._queued == [] and not service.writes._writing


def test_a_failed_group_fails_each_of_its_callers_and_the_next_call_writes(
    service: IdentityService, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_resolve = service._resolve_one

    def failing(u, m, context_id, decided=None):  # type: ignore[no-untyped-def]
        if m.display == "Broken Mention":
            raise RuntimeError("the store went away")
        return real_resolve(u, m, context_id, decided)

    monkeypatch.setattr(service, "_resolve_one", failing)
    outcomes, _, gate, threads = _queue_behind_a_held_group(
        service, monkeypatch, ["Broken Mention", "Quorbex Transformer"])
    gate.set()
    for t in threads:
        t.join(10)
    assert outcomes[0].created  # type: ignore[union-attr]
    assert [str(e) for e in outcomes[1:]] == ["the store went away"] * 2  # one transaction
    assert service.writes._queued == [] and not service.writes._writing
    after = service.resolve("Quorbex Transformer", "method")
    assert after.created  # the failed group wrote nothing, and the next caller wrote
