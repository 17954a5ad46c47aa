"""Where the server's work runs: on the asyncio event loop when it cannot wait, else on the
blocking thread pool; the service's resolves as coroutines (`AsyncResolver`), with the loop's
group-commit window (`GroupWindow`)."""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from contextlib import contextmanager
from typing import Any, TypeVar

from identity_server.errors import Overloaded
from identity_server.service import BatchReply, IdentityService, PreparedBatch

M = TypeVar("M")
T = TypeVar("T")
_STREAM_POLL_S = 1.0  # how often a thread waiting on a request stream checks the loop still runs
_END_SETTLE_S = 0.05  # how long the end of a request stream waits for news of a cancel
# Batches up to this many mentions are checked and parsed on the event loop; larger ones on a
# thread, so that no call waits behind a large one.
INLINE_BATCH_LIMIT = 200
# The event loop's group-commit window (GroupWindow): how long a group waits for company, the
# weight of the newest group in the running average of "calls arrived beside waiting writes",
# and the level of that average from which groups wait; then the weight of the newest window in
# the running average of the loop's working share of its windows, the level below which groups
# stop waiting (the window would only idle the few callers that are the load), and how often a
# probe window keeps that average current. Measured: docs/decisions.md, "Group commit".
GATHER_S = 0.001
COMPANY_WEIGHT = 0.1
COMPANY_AT = 0.05
BUSY_WEIGHT = 0.2
BUSY_AT = 0.5
PROBE_EVERY = 16


async def on_pool(blocking: futures.Executor, work: Callable[..., T], *args: Any) -> T:
    """work(*args) on a blocking-pool thread, where it may wait (locks, the store)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(blocking, functools.partial(work, *args))


class GroupWindow:
    """When a write submitted on the event loop is written: always in a later turn of the loop,
    so calls begun in the same turn join its group, and after a GATHER_S window while calls have
    lately been arriving beside waiting writes (concurrent callers) and the loop has lately had
    other calls to serve in its windows, as PostgreSQL's commit_delay does when commit_siblings
    are active. A lone caller, whose calls never overlap, never waits; nor do a few callers, who
    would only wait in the window with nothing for the loop to do meanwhile."""

    def __init__(self) -> None:
        self._waiting = False  # a group waits to be written
        self._accompanied = False  # a call arrived while it waited
        self._company = 0.0  # running average over groups of _accompanied
        self._busy = 1.0  # running average over windows of the loop's working share of them
        self._unwaited = 0  # groups written without a window since the last window

    def note_call(self) -> None:
        """A call arrived (any that resolves): company for the group waiting, if any."""
        if self._waiting:
            self._accompanied = True

    def defer(self, write_group: Callable[[], None]) -> None:
        """Run write_group (the write queue's) in a later turn of the loop, or after a window."""
        loop = asyncio.get_running_loop()
        self._waiting = True
        probe_due = self._unwaited + 1 >= PROBE_EVERY
        if self._company >= COMPANY_AT and (self._busy >= BUSY_AT or probe_due):
            loop.call_later(GATHER_S, self._end_window, write_group, time.thread_time(),
                            time.perf_counter())
        else:
            self._unwaited += 1
            loop.call_soon(self._write, write_group)

    def _end_window(self, write_group: Callable[[], None], worked: float, began: float) -> None:
        busy = (time.thread_time() - worked) / max(time.perf_counter() - began, 1e-9)
        self._busy += BUSY_WEIGHT * (busy - self._busy)
        self._unwaited = 0
        self._write(write_group)

    def _write(self, write_group: Callable[[], None]) -> None:
        self._waiting = False
        self._company += COMPANY_WEIGHT * (float(self._accompanied) - self._company)
        self._accompanied = False
        write_group()


class AsyncResolver:
    """The service's resolve path for the event loop: a request the index answers at once is
    answered on the loop; a write goes to the service's write queue without waiting for it
    there; what must wait for a lock, and large requests, go to the blocking pool."""

    def __init__(self, service: IdentityService, blocking: futures.Executor, *,
                 max_queued_mentions: int = 20_000) -> None:
        self._service = service
        self._blocking = blocking
        self._window = GroupWindow()
        self._writes = WriteAdmission(max_queued_mentions)

    async def resolve(self, mention: str, entity_type: str, *, context_id: str,
                      lookup_only: bool) -> BatchReply:
        self._window.note_call()
        batch = self._service.prepare_one(mention, entity_type, context_id=context_id,
                                          lookup_only=lookup_only)
        with self._writes.counted(0 if lookup_only else 1):
            return await self._reply(batch)

    async def resolve_batch(self, context_id: str, mentions: list[tuple[str, str]], *,
                            lookup_only: bool) -> BatchReply:
        self._window.note_call()
        service = self._service
        with self._writes.counted(0 if lookup_only else len(mentions)):
            if len(mentions) > INLINE_BATCH_LIMIT:
                return await on_pool(self._blocking, lambda: service.resolve_prepared(
                    service.prepare_batch(context_id, mentions, lookup_only=lookup_only)))
            return await self._reply(
                service.prepare_batch(context_id, mentions, lookup_only=lookup_only))

    async def _reply(self, batch: PreparedBatch) -> BatchReply:
        outcome = self._service.start(batch, may_wait=False, gather=self._window.defer)
        if outcome is None:  # the index must catch up first: under the lock, on a thread
            return await on_pool(self._blocking, self._service.resolve_prepared, batch)
        if isinstance(outcome, BatchReply):
            return outcome
        if outcome.done():  # written on the loop already
            return outcome.result()
        return await _on_loop(outcome)


class WriteAdmission:
    """Load shedding: the mentions of the calls that may write and have not been answered yet,
    bounded. A call that would take them past the limit is refused at once (Overloaded: the
    client retries later) instead of queueing behind work it would wait seconds for, often
    past its deadline. A call alone is always taken, whatever its size. Lookup-only calls are
    not counted: they are answered from the index, ahead of the writes. Used from the event
    loop's thread only."""

    # A rough pace of writing, to turn what waits into a hint of when to come back.
    MENTIONS_PER_MS = 20

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.waiting = 0

    @contextmanager
    def counted(self, mentions: int) -> Iterator[None]:
        """A writing call's mentions counted in until the block ends, or the call refused at
        once (Overloaded). 0: a lookup, never counted nor refused."""
        if mentions and self.waiting and self.waiting + mentions > self.limit:
            retry_ms = max(100, min(5000, self.waiting // self.MENTIONS_PER_MS))
            raise Overloaded(f"the server is busy: {self.waiting} mentions are waiting to be "
                             f"written (limit {self.limit}); retry in about {retry_ms} ms",
                             retry_ms)
        self.waiting += mentions
        try:
            yield
        finally:
            self.waiting -= mentions


async def _on_loop(future: futures.Future[T]) -> T:
    """future's result, awaited on the event loop. Unlike asyncio.wrap_future, a result set on
    the loop's own thread (a group written at the end of its window) reaches the waiter without
    a wake-up through the loop's self-pipe; only one set on another thread takes that road."""
    loop = asyncio.get_running_loop()
    waiter: asyncio.Future[T] = loop.create_future()
    loop_thread = threading.get_ident()

    def copy(done: futures.Future[T]) -> None:
        if waiter.done():  # the caller went away
            return
        error = done.exception()
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(done.result())

    def settle(done: futures.Future[T]) -> None:
        if threading.get_ident() == loop_thread:
            copy(done)
        elif not loop.is_closed():  # closed: the server stopped, nobody waits for the reply
            try:
                loop.call_soon_threadsafe(copy, done)
            except RuntimeError:  # closed in between
                pass

    future.add_done_callback(settle)
    try:
        return await waiter
    except asyncio.CancelledError:
        # The call ended: a job its group has not taken yet is dropped, never written.
        future.cancel()
        raise


class CallEnded(Exception):
    """The call ended (cancelled, past its deadline, the server stopping) before its request
    stream did: what was read is not the whole stream and must not be taken for it."""


def blocking_iterator(messages: AsyncIterator[M], loop: asyncio.AbstractEventLoop,
                      call: asyncio.Task[Any]) -> Iterator[M]:
    """The rest of a request stream, read from a blocking-pool thread a message at a time on
    the loop that owns the call (whose handler runs as task `call`). Raises CallEnded when the
    stream stops because the call ended, not because the client finished sending."""

    async def next_message() -> tuple[bool, M | None]:
        try:
            return True, await anext(messages)
        except StopAsyncIteration:
            # A cancelled call's stream ends like a finished one; its handler is cancelled a
            # moment later. Wait that moment before taking the end for the end of the data.
            await asyncio.sleep(_END_SETTLE_S)
            if call.cancelling() or call.done():
                raise CallEnded("the call ended before its request stream did") from None
            return False, None

    while True:
        pending = asyncio.run_coroutine_threadsafe(next_message(), loop)
        while True:
            try:
                more, message = pending.result(timeout=_STREAM_POLL_S)
                break
            except futures.TimeoutError:
                if not loop.is_running():  # the server stopped: nothing will read the stream
                    pending.cancel()
                    raise CallEnded("the server stopped before the request stream ended") from None
            except futures.CancelledError:  # the read itself was cancelled: the server stops
                raise CallEnded("the server stopped before the request stream ended") from None
        if not more:
            return
        yield message  # type: ignore[misc]


__all__ = ["AsyncResolver", "CallEnded", "blocking_iterator", "on_pool"]
