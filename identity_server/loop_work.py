"""Where the server's work runs: on the asyncio event loop when it cannot wait, else on the
blocking thread pool.

The loop must never wait (every call of the server waits with it), and handing work to a thread
costs more than a small write: so a write is tried on the loop without waiting and, only when
something stands in its way, done on a thread where waiting is fine.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

from identity_server.service import DeferredResolve, IdentityService, ResolveResult
from identity_server.store.sql import WouldBlock

M = TypeVar("M")
T = TypeVar("T")
_STREAM_POLL_S = 1.0  # how often a thread waiting on a request stream checks the loop still runs
_END_SETTLE_S = 0.05  # how long the end of a request stream waits for news of a cancel
# The group-commit window (GroupWriter): how long a group waits for company, the weight of the
# newest group in the running average of "calls arrived beside waiting writes", and the level of
# that average from which groups wait. Unwaited, 16 concurrent callers overlap ~1 group in 10 (a
# lone caller never), and a window of 1 ms gathers ~2 writes a group at that load (2 and 4 ms
# gathered more but cost throughput at 2 to 8 callers).
GATHER_S = 0.001
COMPANY_WEIGHT = 0.1
COMPANY_AT = 0.05
# A window pays only while the loop has other calls to serve in it. The share of its windows the
# loop's thread spent working is kept as a running average (BUSY_WEIGHT to the newest); below
# BUSY_AT groups stop waiting, but for a probe window every PROBE_EVERY groups that keeps the
# average current. On the goal mix at 1M entities (2 cores), the loop worked ~0.3 of its windows
# at 2 callers, where waiting cost 40% of the calls/s, and 0.66-0.77 of them at 4 to 16.
BUSY_WEIGHT = 0.2
BUSY_AT = 0.5
PROBE_EVERY = 16


async def on_pool(blocking: futures.Executor, work: Callable[..., T], *args: Any) -> T:
    """work(*args) on a blocking-pool thread, where it may wait (locks, the store)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(blocking, functools.partial(work, *args))


async def write_here_or_on_pool(blocking: futures.Executor, write: Callable[..., T],
                                *args: Any) -> T:
    """write(*args, wait=False) right here on the loop; if it would have had to wait (it raised
    WouldBlock before doing anything), write(*args) on a pool thread."""
    try:
        return write(*args, wait=False)
    except WouldBlock:
        return await on_pool(blocking, write, *args)


class GroupWriter:
    """Resolves that may write, gathered on the event loop and written in groups, one group at
    a time: each group is one transaction, and calls arriving while it is written form the
    next. Each call takes effect between its start and its reply, so the outcome is that of
    some one-at-a-time order. A group is written on the loop itself when no lock stands in
    its way (an uncontended SQLite write is a fraction of a millisecond, less than handing it
    to a thread costs), else on a blocking-pool thread, where waiting is fine.

    A group-commit window: a transaction costs the server more than its rows (over gRPC
    ~150-250 µs of CPU: the writer's task, SQLite's statements each handing the GIL to gRPC's
    poller thread, the commit), and the loop takes calls in one at a time, so without waiting
    almost every group is a single write. While calls have lately been arriving beside waiting
    writes (concurrent callers), a group first waits GATHER_S for more to join, as
    PostgreSQL's commit_delay does when commit_siblings are active; a lone caller, whose calls
    never overlap, never waits. Nor do groups while the loop lately sat idle in its windows
    (few callers, all of them parked in the window): waiting then only delays the callers that
    are the load, and two callers lost 40% of their calls/s to it."""

    def __init__(self, service: IdentityService, blocking: futures.Executor) -> None:
        self._service = service
        self._blocking = blocking
        self._queued: list[tuple[DeferredResolve, asyncio.Future[ResolveResult]]] = []
        self._writer: asyncio.Task[None] | None = None
        self._accompanied = False  # a call arrived while the queued writes waited
        self._company = 0.0  # running average over groups of _accompanied
        self._busy = 1.0  # running average over windows of the loop's working share of them
        self._unwaited = 0  # groups written without a window since the last window

    def note_call(self) -> None:
        """A call arrived (any that resolves): company for the writes waiting, if any."""
        if self._queued:
            self._accompanied = True

    @property
    def gathers(self) -> bool:
        """Whether the next group waits for company: calls lately overlapped waiting writes,
        and the loop lately had other calls to serve in its windows (or a probe is due)."""
        return self._company >= COMPANY_AT and (
            self._busy >= BUSY_AT or self._unwaited + 1 >= PROBE_EVERY)

    async def resolve(self, deferred: DeferredResolve) -> ResolveResult:
        loop = asyncio.get_running_loop()
        reply: asyncio.Future[ResolveResult] = loop.create_future()
        self._queued.append((deferred, reply))
        if self._writer is None:
            self._writer = loop.create_task(self._write_queued())
        return await reply

    async def _wait_for_company(self) -> float:
        """The window: writes arriving meanwhile join the group about to be written. Returns
        the share of it the loop's thread spent working (on other calls) rather than idle."""
        worked, began = time.thread_time(), time.perf_counter()
        await asyncio.sleep(GATHER_S)
        return (time.thread_time() - worked) / max(time.perf_counter() - began, 1e-9)

    async def _write_queued(self) -> None:
        try:
            while self._queued:
                if self.gathers:
                    busy = await self._wait_for_company()
                    self._busy += BUSY_WEIGHT * (busy - self._busy)
                    self._unwaited = 0
                else:
                    self._unwaited += 1
                accompanied, self._accompanied = self._accompanied, False
                self._company += COMPANY_WEIGHT * (float(accompanied) - self._company)
                group, self._queued = self._queued, []
                deferred = [d for d, _ in group]
                try:
                    results = await write_here_or_on_pool(
                        self._blocking, self._service.resolve_deferred, deferred)
                except Exception as e:  # noqa: BLE001 - the group failed: so does each of its calls
                    for _, reply in group:
                        if not reply.done():
                            reply.set_exception(e)
                else:
                    for (_, reply), result in zip(group, results, strict=True):
                        if not reply.done():  # a caller that went away gets nothing
                            reply.set_result(result)
        finally:
            self._writer = None
            # Cancelled while gathering (the server stops): nothing will write these.
            waiting, self._queued = self._queued, []
            for _, reply in waiting:
                reply.cancel()


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


__all__ = ["CallEnded", "GroupWriter", "blocking_iterator", "on_pool", "write_here_or_on_pool"]
