"""Where the server's work runs: on the asyncio event loop when it cannot wait, else on the
blocking thread pool; and the service's resolves as coroutines (`AsyncResolver`)."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent import futures
from typing import Any, TypeVar

from identity_server.service import BatchReply, IdentityService, PreparedBatch

M = TypeVar("M")
T = TypeVar("T")
_STREAM_POLL_S = 1.0  # how often a thread waiting on a request stream checks the loop still runs
_END_SETTLE_S = 0.05  # how long the end of a request stream waits for news of a cancel
# Batches up to this many mentions are checked and parsed on the event loop; larger ones on a
# thread, so that no call waits behind a large one.
INLINE_BATCH_LIMIT = 200


async def on_pool(blocking: futures.Executor, work: Callable[..., T], *args: Any) -> T:
    """work(*args) on a blocking-pool thread, where it may wait (locks, the store)."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(blocking, functools.partial(work, *args))


class AsyncResolver:
    """The service's resolve path for the event loop: a request the index answers at once is
    answered on the loop; a write goes to the service's write queue without waiting for it
    there; what must wait for a lock, and large requests, go to the blocking pool."""

    def __init__(self, service: IdentityService, blocking: futures.Executor) -> None:
        self._service = service
        self._blocking = blocking

    async def resolve(self, mention: str, entity_type: str, *, context_id: str,
                      lookup_only: bool) -> BatchReply:
        return await self._reply(self._service.prepare_one(
            mention, entity_type, context_id=context_id, lookup_only=lookup_only))

    async def resolve_batch(self, context_id: str, mentions: list[tuple[str, str]], *,
                            lookup_only: bool) -> BatchReply:
        service = self._service
        if len(mentions) > INLINE_BATCH_LIMIT:
            return await on_pool(self._blocking, lambda: service.resolve_prepared(
                service.prepare_batch(context_id, mentions, lookup_only=lookup_only)))
        return await self._reply(
            service.prepare_batch(context_id, mentions, lookup_only=lookup_only))

    async def _reply(self, batch: PreparedBatch) -> BatchReply:
        outcome = self._service.start(batch, may_wait=False)
        if outcome is None:  # the index must catch up first: under the lock, on a thread
            return await on_pool(self._blocking, self._service.resolve_prepared, batch)
        if isinstance(outcome, BatchReply):
            return outcome
        if outcome.done():  # written on the loop already
            return outcome.result()
        return await asyncio.wrap_future(outcome)


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
