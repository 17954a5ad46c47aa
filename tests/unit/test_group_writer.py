"""The event loop's group commit: writes that wait together share one transaction, and a group
waits for company (GATHER_S) only while calls have lately arrived beside waiting writes and the
loop lately had other work in its windows.

The service is a recorder of the groups it is asked to write (what GroupWriter does with them
is the subject here; the real service's group writes are tested against the store elsewhere).
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, cast

import pytest

from identity_server import loop_work
from identity_server.loop_work import (
    BUSY_AT,
    BUSY_WEIGHT,
    COMPANY_AT,
    GATHER_S,
    PROBE_EVERY,
    GroupWriter,
)
from identity_server.service import DeferredResolve, IdentityService


class RecordingService:
    """Writes nothing: answers each deferred resolve with itself, and records the groups."""

    def __init__(self) -> None:
        self.groups: list[list[Any]] = []

    def resolve_deferred(self, group: Sequence[Any], *, wait: bool = True) -> list[Any]:
        self.groups.append(list(group))
        return list(group)


def _writer() -> tuple[GroupWriter, RecordingService, futures.ThreadPoolExecutor]:
    service = RecordingService()
    pool = futures.ThreadPoolExecutor(max_workers=1)
    return GroupWriter(cast(IdentityService, service), pool), service, pool


def _deferred(i: int) -> DeferredResolve:
    return cast(DeferredResolve, f"write-{i}")


def _recording_windows(monkeypatch: pytest.MonkeyPatch, writer: GroupWriter,
                       during_window: Any = None,
                       busy: Callable[[], float] = lambda: 1.0) -> list[float]:
    """The windows the writer opens, recorded (as GATHER_S each) and shut at once;
    during_window() runs in each (the calls that arrive while a group waits), and each reports
    busy() as the share of it the loop worked."""
    windows: list[float] = []

    async def window() -> float:
        windows.append(GATHER_S)
        if during_window is not None:
            during_window()
        await asyncio.sleep(0)  # the calls that arrived run, and queue their writes
        return busy()

    monkeypatch.setattr(writer, "_wait_for_company", window)
    return windows


def test_a_lone_caller_never_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """One caller, one call at a time: every write is its own group, written at once."""
    writer, service, pool = _writer()
    slept = _recording_windows(monkeypatch, writer)

    async def lone_caller() -> list[Any]:
        answers = []
        for i in range(50):
            writer.note_call()  # the servicer notes every call as it arrives
            answers.append(await writer.resolve(_deferred(i)))
        return answers

    try:
        assert asyncio.run(lone_caller()) == [_deferred(i) for i in range(50)]
    finally:
        pool.shutdown()
    assert slept == []
    assert [len(g) for g in service.groups] == [1] * 50
    assert not writer.gathers


def test_concurrent_calls_open_the_window_and_share_transactions(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls arriving beside waiting writes open the window; writes arriving in it join the
    group, so they share a transaction; every caller gets its own answer."""
    writer, service, pool = _writer()
    loop_box: list[asyncio.AbstractEventLoop] = []
    tasks: list[asyncio.Task[Any]] = []
    arriving = iter(range(1000, 1010))

    def two_more_writes_arrive() -> None:  # in the first five windows
        for i in [next(arriving, None), next(arriving, None)]:
            if i is not None:
                writer.note_call()
                tasks.append(loop_box[0].create_task(writer.resolve(_deferred(i))))

    slept = _recording_windows(monkeypatch, writer, two_more_writes_arrive)

    async def concurrent_callers() -> None:
        loop_box.append(asyncio.get_running_loop())
        for i in range(40):
            tasks.append(asyncio.create_task(writer.resolve(_deferred(i))))
            await asyncio.sleep(0)  # the write queues
            writer.note_call()  # and a call (a read, say) arrives while it waits
        while not all(t.done() for t in tasks):
            await asyncio.gather(*list(tasks))

    try:
        asyncio.run(concurrent_callers())
    finally:
        pool.shutdown()
    assert slept and set(slept) == {GATHER_S}
    assert writer.gathers
    sizes = [len(g) for g in service.groups]
    assert max(sizes) >= 3  # a write and the two that arrived in its window
    assert len(tasks) == 50
    written = [d for g in service.groups for d in g]
    assert sorted(written) == sorted(t.result() for t in tasks)
    assert len(written) == len(set(written)) == len(tasks)


def test_the_window_closes_once_calls_stop_overlapping(monkeypatch: pytest.MonkeyPatch) -> None:
    """After a burst, a lone caller waits in at most the groups it takes the running average
    to fall below COMPANY_AT (each lone group, unaccompanied, lowers it), then never again."""
    writer, service, pool = _writer()
    slept = _recording_windows(monkeypatch, writer)

    async def burst_then_lone() -> tuple[int, int]:
        for i in range(30):  # a burst: every group has company
            pending = asyncio.create_task(writer.resolve(_deferred(i)))
            await asyncio.sleep(0)  # the write queues
            writer.note_call()  # another call arrives while it waits
            await pending
        assert writer.gathers
        waited_during_burst = len(slept)
        lone_waits = 0
        for i in range(100):
            before = len(slept)
            await writer.resolve(_deferred(100 + i))
            lone_waits += len(slept) - before
        return waited_during_burst, lone_waits

    try:
        during_burst, lone_waits = asyncio.run(burst_then_lone())
    finally:
        pool.shutdown()
    assert during_burst > 0
    bound = 0
    company = 1.0
    while company >= COMPANY_AT:
        company *= 1 - loop_work.COMPANY_WEIGHT
        bound += 1
    assert 0 < lone_waits <= bound
    assert not writer.gathers
    assert sum(len(g) for g in service.groups) == 130


def test_groups_stop_waiting_while_the_loop_idles_in_its_windows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls overlap, but too few to keep the loop working while a group waits (two callers, one
    parked in the window): once the loop's average working share of its windows falls below
    BUSY_AT, a group waits only as a probe, every PROBE_EVERY groups; once the windows fill
    with work again (more callers), every group waits again."""
    writer, service, pool = _writer()
    share = [0.1]
    slept = _recording_windows(monkeypatch, writer, busy=lambda: share[0])

    async def overlapping(count: int, start: int) -> list[int]:
        """`count` groups, each with a call arriving beside it: those that waited."""
        waited = []
        for i in range(count):
            before = len(slept)
            pending = asyncio.create_task(writer.resolve(_deferred(start + i)))
            await asyncio.sleep(0)  # the write queues
            writer.note_call()  # and another call arrives while it waits
            await pending
            if len(slept) > before:
                waited.append(i)
        return waited

    async def idle_then_busy() -> tuple[list[int], list[int]]:
        idle = await overlapping(200, 0)
        share[0] = 0.9
        return idle, await overlapping(150, 1000)

    try:
        idle, busy_again = asyncio.run(idle_then_busy())
    finally:
        pool.shutdown()
    first_windows = 0  # from 1.0, each idle window lowers the average until it is below BUSY_AT
    average = 1.0
    while average >= BUSY_AT:
        average += BUSY_WEIGHT * (0.1 - average)
        first_windows += 1
    assert idle[:first_windows] == list(range(1, first_windows + 1))  # the first lacks company
    probes = idle[first_windows:]
    assert len(probes) >= 200 // PROBE_EVERY - 2
    assert {b - a for a, b in itertools.pairwise(probes)} == {PROBE_EVERY}
    assert busy_again[-50:] == list(range(100, 150))  # waiting in every group again
    assert sum(len(g) for g in service.groups) == 350


def test_writes_waiting_in_a_cancelled_window_are_cancelled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The server stops while a group waits for company: its callers are cancelled, not left
    waiting for a reply nothing will send, and nothing is written."""
    writer, service, pool = _writer()
    writer._company = 1.0  # as after a burst of concurrent calls

    async def stop_while_gathering() -> None:
        caller = asyncio.create_task(writer.resolve(_deferred(1)))
        await asyncio.sleep(0)  # the caller queues and starts the writer, which waits
        writer_task = writer._writer
        assert writer_task is not None
        await asyncio.sleep(0)
        writer_task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(caller, timeout=5)  # not left waiting

    try:
        asyncio.run(stop_while_gathering())
    finally:
        pool.shutdown()
    assert service.groups == []
    assert writer._writer is None
